"""Games as episodes (`task_mix=games`): GRPO over whole games the model plays.

A step draws `starts_per_step` start positions (the training data's P positions); from
each the model plays `num_generations` games (the group) against itself (both sides), a
uniformly random mover or Stockfish at a node limit (`strength.games.EngineMover`: its
moves repeat, so a resumed run replays the same games), all live games' positions
decoding together each half-move. A game ends at checkmate, a draw on the board, an
illegal or unparseable B: move (the mover loses) or `max_plies` half-moves (an
adjudicated draw). Every model move is a P row of
the step's batch; under `env=model` every legal move of the model's (not the opponent's)
also asks the model's A task for the next state, scored by the run's reward against the
python-chess oracle, and the game goes on from the oracle's state either way. A game ends
at a threefold repetition or the fifty-move rule once it has happened, where the oracle's
truth for that last move still says the game goes on (it follows `board.is_game_over()`,
which waits for a claim: docs/formats.md).

Advantages (`episode_advantages`): each side a model played in a game gets the game's
result from its point of view (win, draw, loss; an illegal move loses for its mover, and
the other side scores a draw: it did nothing to win). Results are normalised over the
group's games (`grpo.normalise_groups`; in self-play white's and black's apart, against an
opponent the model's side of every game together), and a move's share is discount^(moves
its side made after it). Each move's legality, normalised over the group's moves of that
side, adds move_weight times its own advantage (move credit, per move); with engine_weight
> 0 each legal move's centipawn loss against Stockfish (`strength.acpl.move_losses`, the
strength suite's measure, at depth engine_depth), its negative normalised over the group's
legal moves of that side, adds engine_weight times its advantage. A rows are normalised
over the group's A rows. The loss is the run's (`grpo.compute_loss`), unchanged.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import chess
import torch
from torch import Tensor

from .batch import Batch
from .chess_tasks import (
    PolicyTruth,
    Sample,
    env_sample,
    legal_move,
    parse_policy,
    policy_prompt,
)
from .chess_tasks.stockfish_pool import EnginePool, find_engine
from .errors import check_int
from .grpo import normalise_groups
from .strength.acpl import move_losses
from .strength.games import EngineMover, RandomMover, game_over

OPPONENTS = ("self", "random", "engine")
ENVS = ("oracle", "model")
ILLEGAL, UNPARSEABLE, PLY_LIMIT = "illegal move", "no move", "ply limit"


@dataclass
class Games:
    """The `task_mix=games` option (conf/task_mix/games.yaml says what each setting does)."""

    starts_per_step: int = 2
    opponent: str = "self"
    max_plies: int = 16
    env: str = "oracle"
    move_weight: float = 0.5
    win: float = 1.0
    draw: float = 0.0
    loss: float = -1.0
    discount: float = 1.0
    min_std: float = 1e-4
    opponent_nodes: int = 64
    engine_weight: float = 0.0
    engine_depth: int = 8
    _mover: EngineMover | None = field(default=None, init=False, repr=False, compare=False)
    _scorer: EnginePool | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_int("task_mix.starts_per_step", self.starts_per_step, 1)
        check_int("task_mix.max_plies", self.max_plies, 1)
        check_int("task_mix.opponent_nodes", self.opponent_nodes, 1)
        check_int("task_mix.engine_depth", self.engine_depth, 1)
        if self.opponent not in OPPONENTS:
            raise ValueError(f"task_mix.opponent must be one of {OPPONENTS}, got "
                             f"{self.opponent!r}")
        if self.env not in ENVS:
            raise ValueError(f"task_mix.env must be one of {ENVS}, got {self.env!r}")
        if not 0 < self.discount <= 1:
            raise ValueError(f"task_mix.discount must be in (0, 1], got {self.discount}")
        if self.move_weight < 0 or self.engine_weight < 0 or not self.min_std > 0:
            raise ValueError("task_mix.move_weight and task_mix.engine_weight must be >= 0 "
                             "and task_mix.min_std > 0")
        if not self.win >= self.draw >= self.loss:
            raise ValueError("task_mix.win >= task_mix.draw >= task_mix.loss must hold, got "
                             f"{self.win}, {self.draw}, {self.loss}")
        if self.opponent == "engine" or self.engine_weight > 0:
            find_engine()  # a missing Stockfish fails here, naming its install command

    def opponent_mover(self, seed: int) -> RandomMover | EngineMover:
        """The opponent of a step's games (opponent random or engine); the engine's
        process is started once and kept until close()."""
        if self.opponent != "engine":
            return RandomMover(seed=seed)
        if self._mover is None:
            self._mover = EngineMover(nodes=self.opponent_nodes)
        return self._mover

    def scorer(self) -> EnginePool:
        """The Stockfish pool (depth engine_depth) that scores each legal model move."""
        if self._scorer is None:
            self._scorer = EnginePool(processes=1, depth=self.engine_depth, multipv=1)
        return self._scorer

    def close(self) -> None:
        """Ends the engine processes the games started (idempotent)."""
        for engine in (self._mover, self._scorer):
            if engine is not None:
                engine.close()
        self._mover = self._scorer = None

    def tasks(self, step: int) -> tuple[str, ...]:
        """The data's tasks a step needs: the P positions games start from."""
        return ("P",)

    def starts(self, pools: dict[str, Sequence[Sample]], step: int, seed: int) -> list[str]:
        """The step's start positions, a pure function of (seed, step); positions whose
        game is already over are skipped."""
        pool = pools["P"]
        rng = random.Random(seed * 1_000_003 + step)
        out = []
        for i in rng.sample(range(len(pool)), len(pool)):
            if game_over(chess.Board(pool[i].truth.fen)) is None:
                out.append(pool[i].truth.fen)
                if len(out) == self.starts_per_step:
                    return out
        raise ValueError(f"task_mix=games needs {self.starts_per_step} playable start "
                         f"positions; the training data's P positions hold {len(out)}")


@dataclass
class Game:
    """One game of a group: group (its start's index), model_colour (None: both sides),
    rows (batch rows of the model's moves, with the colour that made each and whether it
    was legal), result (1-0, 0-1, 1/2-1/2) and how it ended."""

    group: int
    board: chess.Board
    model_colour: chess.Color | None
    moves: list[tuple[int, chess.Color, bool]] = field(default_factory=list)
    env_rows: list[int] = field(default_factory=list)
    result: str = "*"
    termination: str = ""
    offender: chess.Color | None = None  # who played the illegal or unparseable move

    def score(self, colour: chess.Color, s: Games) -> float:
        """The result from colour's side: win, draw or loss (an illegal move: a loss for
        its mover, a draw for the other side)."""
        if self.offender is not None:
            return s.loss if colour == self.offender else s.draw
        if self.result == "1/2-1/2":
            return s.draw
        return s.win if (self.result == "1-0") == (colour == chess.WHITE) else s.loss


def episode_advantages(games: list[Game], n_rows: int, env_scores: dict[int, float],
                       s: Games, losses: dict[int, float] | None = None) -> Tensor:
    """Per-row advantages [n_rows] of a step's games (see the module docstring).
    env_scores: A row -> its reward; losses: a legal model move's row -> its centipawn
    loss (used when s.engine_weight > 0)."""
    adv = torch.zeros(n_rows, dtype=torch.float64)
    for k in sorted({g.group for g in games}):
        mine = [g for g in games if g.group == k]
        # the sides compared: in self-play white's and black's across the games, against an
        # opponent the model's own side of every game (its results are all from its side)
        if any(g.model_colour is None for g in mine):
            side_sets = [[(g, c) for g in mine] for c in (chess.WHITE, chess.BLACK)]
        else:
            side_sets = [[(g, g.model_colour) for g in mine]]
        for sides in side_sets:
            played = [(g, c) for g, c in sides if any(cc == c for _, cc, _ in g.moves)]
            if not played:
                continue
            results = torch.tensor([[g.score(c, s) for g, c in played]], dtype=torch.float64)
            result_adv = normalise_groups(results, "group", s.min_std).tolist() \
                if len(played) > 1 else [0.0]
            rows = [(row, ok) for g, c in played for row, cc, ok in g.moves if cc == c]
            legal = torch.tensor([[float(ok) for _, ok in rows]], dtype=torch.float64)
            move_adv = dict(zip([r for r, _ in rows], normalise_groups(
                legal, "group", s.min_std).tolist() if len(rows) > 1 else [0.0]))
            for (g, c), a in zip(played, result_adv):
                side = [row for row, cc, _ in g.moves if cc == c]
                for j, row in enumerate(side):
                    adv[row] = s.discount ** (len(side) - 1 - j) * a + \
                        s.move_weight * move_adv[row]
            scored = [row for row, ok in rows if ok and row in (losses or {})]
            if s.engine_weight > 0 and len(scored) > 1:
                quality = torch.tensor([[-losses[r] for r in scored]], dtype=torch.float64)
                for row, a in zip(scored, normalise_groups(quality, "group", s.min_std).tolist()):
                    adv[row] += s.engine_weight * a
        env = [row for g in mine for row in g.env_rows]
        if len(env) > 1:
            x = torch.tensor([[env_scores[r] for r in env]], dtype=torch.float64)
            for row, a in zip(env, normalise_groups(x, "group", s.min_std).tolist()):
                adv[row] = a
    return adv.float()


@dataclass
class Played:
    """A step's games and the batch rows they made: rows (samples), texts (completions),
    own (each row's own reward: a move's legality, an A row's score), parts (the sampled
    rollouts with their row indices), env_scores (A row -> its reward), losses (a legal
    model move's row -> its centipawn loss; empty unless engine_weight > 0)."""

    games: list[Game]
    rows: list[Sample]
    texts: list[str]
    own: list[float]
    parts: list
    env_scores: dict[int, float]
    losses: dict[int, float] = field(default_factory=dict)


def play(engine, starts: list[str], step: int, s: Games) -> Batch:
    """Play the step's games with the engine's policy and return their batch (every model
    move a P row, and under env=model every A prediction an A row)."""
    t0 = time.perf_counter()
    p = play_games(engine, starts, step, s)
    adv = episode_advantages(p.games, len(p.rows), p.env_scores, s, p.losses)
    metrics = episode_metrics(p.games, p.rows) | {"time/sample_s": time.perf_counter() - t0}
    if p.losses:
        metrics["games/move_loss_cp"] = sum(p.losses.values()) / len(p.losses)
    return engine.batch_of(p.rows, p.parts, p.texts, torch.tensor(p.own), adv, metrics)


def play_games(engine, starts: list[str], step: int, s: Games) -> Played:
    """The games of a step: num_generations from each start, all live games' positions
    sampled together each half-move (engine.sample_prompts), the opponent's moves between."""
    G = engine.G
    games = []
    for k, fen in enumerate(starts):
        for i in range(G):
            colour = None if s.opponent == "self" else \
                (chess.WHITE if (k + i) % 2 == 0 else chess.BLACK)
            games.append(Game(k, chess.Board(fen), colour))
    opponent = s.opponent_mover(engine.settings.seed * 1_000_003 + step)
    judged: list[tuple[int, str, str]] = []  # (row, position, move) of legal model moves
    rows: list[Sample] = []
    texts: list[str] = []
    own: list[float] = []  # each row's own reward: a move's legality, an A row's score
    parts = []
    env_scores: dict[int, float] = {}
    reward = engine.reward.at(step)
    live = list(range(len(games)))
    salt = 0
    while live:
        mine = [i for i in live if games[i].model_colour in (None, games[i].board.turn)]
        theirs = [i for i in live if i not in mine]
        if mine:
            fens = [games[i].board.fen() for i in mine]
            salt += 1
            r = engine.sample_prompts([policy_prompt(f) for f in fens], "P", step, salt)
            said = engine.policy.decode_completions(r.completion_ids, r.completion_mask)
            idx = list(range(len(rows), len(rows) + len(mine)))
            parts.append((idx, r))
            env_asks = []
            for i, row, fen, text in zip(mine, idx, fens, said):
                g = games[i]
                rows.append(Sample("P", policy_prompt(fen), "", PolicyTruth(fen, (), (), "",
                                                                            "episode")))
                texts.append(text)
                move = legal_move(g.board, parse_policy(text).best)
                g.moves.append((row, g.board.turn, move is not None))
                own.append(float(move is not None))
                if move is None:
                    g.offender = g.board.turn
                    g.result = "0-1" if g.board.turn == chess.WHITE else "1-0"
                    g.termination = ILLEGAL if parse_policy(text).best else UNPARSEABLE
                    continue
                judged.append((row, fen, move.uci()))
                if s.env == "model":
                    history = [m.uci() for m in g.board.move_stack[-9:]] + [move.uci()]
                    env_asks.append(env_sample(fen, move.uci(), history))
                _push(g, move, s.max_plies)
            if env_asks:
                salt += 1
                r = engine.sample_prompts([a.prompt for a in env_asks], "A", step, salt)
                said = engine.policy.decode_completions(r.completion_ids, r.completion_mask)
                idx = list(range(len(rows), len(rows) + len(env_asks)))
                parts.append((idx, r))
                asked = [i for i in mine if games[i].moves[-1][2]]
                for i, row, sample, text in zip(asked, idx, env_asks, said):
                    rows.append(sample)
                    texts.append(text)
                    games[i].env_rows.append(row)
                    env_scores[row] = reward(sample, text).score
                    own.append(env_scores[row])
        for i, move in zip(theirs, opponent.moves([games[i].board for i in theirs], theirs)):
            _push(games[i], chess.Move.from_uci(move), s.max_plies)
        live = [i for i in live if not games[i].termination]
    losses = {}
    if s.engine_weight > 0 and judged:
        rows_, fens, moves = zip(*judged)
        losses = {r: m.loss for r, m in zip(rows_, move_losses(s.scorer(), fens, moves))}
    return Played(games, rows, texts, own, parts, env_scores, losses)


def _push(g: Game, move: chess.Move, max_plies: int) -> None:
    g.board.push(move)
    if (ended := game_over(g.board)) is not None:
        g.result, g.termination = ended
    elif len(g.board.move_stack) >= max_plies:
        g.result, g.termination = "1/2-1/2", PLY_LIMIT


def episode_metrics(games: list[Game], rows: list[Sample]) -> dict:
    """games/*: the model's score per side it played, endings, half-moves per game. The
    step's reward/P/* is each model move's legality (a P row's own reward), reward/A/* the
    A rows' scores."""
    scores = [g.score(c, Games(win=1.0, draw=0.5, loss=0.0))
              for g in games for c in (chess.WHITE, chess.BLACK)
              if g.model_colour in (None, c) and any(cc == c for _, cc, _ in g.moves)]
    plies = [len(g.board.move_stack) for g in games]
    n = len(games)
    return {"games/score": sum(scores) / max(len(scores), 1),
            "games/illegal_end_share": sum(g.termination == ILLEGAL for g in games) / n,
            "games/no_move_end_share": sum(g.termination == UNPARSEABLE for g in games) / n,
            "games/ply_limit_share": sum(g.termination == PLY_LIMIT for g in games) / n,
            "games/plies_mean": sum(plies) / n,
            "games/legal_move_share": sum(ok for g in games for *_, ok in g.moves)
            / max(sum(len(g.moves) for g in games), 1),
            "games/rows": float(len(rows)),
            "games/env_rows": float(sum(len(g.env_rows) for g in games))}
