"""Choosing P positions and A moves from played games, spread over game phases."""

from __future__ import annotations

import math
import random
from collections import defaultdict

import chess

from rookworld.chess_tasks import env_sample, policy_sample
from rookworld.errors import ConfigError

from .positions import (
    Position,
    drawing_moves,
    illegal_move,
    mating_moves,
    seventyfive_move,
)


def stratified(cands: list, n: int, shares: dict, rng: random.Random, make=lambda c: c) -> list:
    """Up to n items `make(c)` (None = skip c), a share of n per phase, shortfalls
    filled from the other phases. cands have `.phase`."""
    by_phase = defaultdict(list)
    for c in cands:
        by_phase[c.phase].append(c)
    out, rest = [], []
    for phase, share in shares.items():
        pool = by_phase.get(phase, [])
        rng.shuffle(pool)
        quota, used = round(n * share), 0
        for c in pool:
            if quota <= 0:
                break
            used += 1
            if (x := make(c)) is not None:
                out.append(x)
                quota -= 1
        rest += pool[used:]
    rng.shuffle(rest)
    for c in rest:
        if len(out) >= n:
            break
        if (x := make(c)) is not None:
            out.append(x)
    return out[:n]


P_KINDS = ("check", "only_move")
LABEL_CHUNK = 1024  # candidates labelled at a time while looking for only-move positions


def only_move(evals, gap: float) -> bool:
    """The best of a position's labelled evals beats the second by `gap` pawns or more: one
    move keeps the position, as a puzzle's first move does."""
    top = sorted(evals, reverse=True)
    return len(top) >= 2 and top[0] - top[1] >= gap


def check_p_kinds(kinds: dict, gap: float, multipv: int) -> None:
    """ValueError for shares of unknown kinds, outside [0, 1] or summing past 1, a gap <= 0,
    or only-move positions asked of labels with fewer than two moves (multipv < 2)."""
    if unknown := set(kinds) - set(P_KINDS):
        raise ValueError(f"p_kinds: unknown kind(s) {sorted(unknown)}; known: {list(P_KINDS)}")
    if any(not isinstance(v, int | float) or not 0 <= v <= 1 for v in kinds.values()) \
            or sum(kinds.values()) > 1:
        raise ValueError(f"p_kinds: shares must lie in [0, 1] and sum to <= 1, got {kinds}")
    if kinds.get("only_move") and not gap > 0:
        raise ValueError(f"only_move_gap must be > 0 pawns, got {gap}")
    if kinds.get("only_move") and multipv < 2:
        raise ValueError("p_kinds.only_move needs two labelled moves a position: engine.multipv "
                         f">= 2, got {multipv}")


def policy_positions(fresh: list[Position], n: int, shares: dict, kinds: dict, gap: float,
                     labels_for, rng: random.Random) -> tuple[list[Position], dict[str, str]]:
    """Up to n P positions and the kind of those chosen for one: round(n x kinds["check"])
    whose side to move is in check and round(n x kinds["only_move"]) that are only-move
    positions at `gap` (found by labelling shuffled candidates LABEL_CHUNK at a time), each
    kind phase-stratified among its candidates, the rest phase-stratified as without kinds
    (they also fill a kind's shortfall, which is printed). With every share 0 the choice is
    `stratified(fresh, n, shares, rng)`, draw for draw. `check_p_kinds` checks the shares."""
    if not any(kinds.values()):
        return stratified(fresh, n, shares, rng), {}
    kind_of: dict[str, str] = {}

    def left() -> list[Position]:
        return [p for p in fresh if p.key not in kind_of]

    def short(kind: str, want: int) -> None:
        got = sum(k == kind for k in kind_of.values())
        if got < want:
            print(f"[rookworld] p_kinds.{kind}: {got} of {want} positions found; positions "
                  "drawn by phase fill the rest", flush=True)

    if want := round(n * kinds.get("check", 0)):
        in_check = [p for p in fresh if chess.Board(p.fen).is_check()]
        kind_of |= {p.key: "check" for p in stratified(in_check, want, shares, rng)}
        short("check", want)
    if want := min(round(n * kinds.get("only_move", 0)), n - len(kind_of)):
        cands, found = left(), []
        rng.shuffle(cands)
        for i in range(0, len(cands), LABEL_CHUNK):
            chunk = cands[i:i + LABEL_CHUNK]
            labels = labels_for([p.fen for p in chunk])
            found += [p for p in chunk if only_move(labels[p.fen].evals, gap)]
            if len(found) >= want * 2:  # enough to stratify among
                break
        kind_of |= {p.key: "only_move" for p in stratified(found, want, shares, rng)}
        short("only_move", want)
    chosen = [p for p in fresh if p.key in kind_of]
    return chosen + stratified(left(), n - len(chosen), shares, rng), kind_of


def policy_samples(positions: list[Position], labels: dict, seed: int,
                   kind_of: dict[str, str] | None = None) -> list:
    """P samples of the positions with their labels (meta: phase, game, ply, and the kind
    a position was chosen for, if any)."""
    out = []
    for p in positions:
        a = labels[p.fen]
        if not a.moves:
            continue
        order = list(range(len(a.moves)))
        # docs/formats.md: the order carries no rank
        random.Random(f"{seed}:{p.fen}").shuffle(order)
        meta = {"phase": p.phase, "game": p.game, "ply": p.ply}
        if kind_of and p.key in kind_of:
            meta["kind"] = kind_of[p.key]
        out.append(policy_sample(p.fen, [a.moves[i] for i in order], [a.evals[i] for i in order],
                                 source=a.label, meta=meta))
    return out


A_KINDS = ("played", "illegal", "mate", "draw", "seventyfive")


def check_a_kinds(kinds: dict) -> None:
    """ConfigError for shares of unknown kinds or outside [0, 1], the shares other than
    "played" summing past 1, or a "played" share other than the rest, 1 - the others'
    sum: "played" takes the samples the other kinds leave (see env_samples)."""
    if unknown := set(kinds) - set(A_KINDS):
        raise ConfigError(f"a_kinds: unknown kind(s) {sorted(unknown)}; known: {list(A_KINDS)}")
    others = {k: v for k, v in kinds.items() if k != "played"}
    if any(isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1
           for v in kinds.values()) or sum(others.values()) > 1 + 1e-9:
        raise ConfigError("a_kinds: shares must lie in [0, 1] and those other than played sum "
                          f"to <= 1, got {kinds}")
    rest = 1 - sum(others.values())
    if not math.isclose(kinds.get("played", -1), rest, abs_tol=1e-9):
        raise ConfigError(f"a_kinds.played is the rest of the A samples, 1 - the other shares "
                          f"= {rest:.6g}; got {kinds.get('played')} in {kinds}")


def _choice(items: list, rng: random.Random):
    return rng.choice(items) if items else None


def _env(p: Position, move: str | None, fen: str | None = None, kind: str = ""):
    """An A sample for `move` at p (None when there is no such move)."""
    if move is None:
        return None
    return env_sample(fen or p.fen, move, p.history + (move,),
                      meta={"phase": p.phase, "game": p.game, "ply": p.ply, "kind": kind})


def env_samples(positions: list[Position], n: int, kinds: dict, shares: dict,
                rng: random.Random) -> list:
    """Up to n A samples, `kinds` the share of each kind (see positions.py): round(n x share)
    of each kind but "played" (as many as fit in n, kinds in the order given), then "played"
    moves for the rest, which thus fill the places of kinds that find too few moves. The
    "played" share itself is not read: `check_a_kinds` holds it to the rest."""
    positions = [p for p in positions if p.played]  # the game goes on: a legal move exists
    played = list({(p.key, p.played): p for p in positions}.values())
    ends = [p for p in positions if p.phase == "endgame"]
    makers = {
        "played": (played, lambda p: _env(p, p.played, kind="played")),
        "illegal": (positions, lambda p: _env(p, illegal_move(_board(p), rng), kind="illegal")),
        "mate": (positions, lambda p: _env(p, _choice(mating_moves(_board(p)), rng),
                                           kind="mate")),
        "draw": (ends, lambda p: _env(p, _choice(drawing_moves(_board(p)), rng), kind="draw")),
        "seventyfive": (ends, _seventyfive),
    }
    if unknown := set(kinds) - set(makers):
        raise ConfigError(f"a_kinds: unknown kind(s) {sorted(unknown)}; known: {list(A_KINDS)}")
    out, seen = [], set()

    def unique(make):  # the same prompt never twice, whatever kinds produced it
        def made(p):
            s = make(p)
            if s is None or s.prompt in seen:
                return None
            seen.add(s.prompt)
            return s
        return made

    for kind in sorted(kinds, key=lambda k: k == "played"):  # "played" last: fills shortfalls
        cands, make = makers[kind]
        want = n - len(out) if kind == "played" else min(round(n * kinds[kind]), n - len(out))
        out += stratified(cands, want, shares, rng, unique(make))
    return out


def _seventyfive(p: Position):
    found = seventyfive_move(_board(p))
    return _env(p, found[1], found[0], kind="seventyfive") if found else None


def _board(p: Position) -> chess.Board:
    return chess.Board(p.fen)
