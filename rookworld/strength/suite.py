"""The playing-strength suite: puzzles, games and centipawn loss, each with its interval,
for the model's own answers ("free") and with the B: move decoded along legal moves only
("mask"), side by side.

`StrengthSuite(settings, acpl_fens, out_dir)(policy, p_settings, label)` measures one
model and returns flat metrics (`<prefix>/strength/<measure>[_masked]`, each mean with
its standard error under the `_se` prefix and its count under `_n`, as `evaluation`
names them, so the before/after table, W&B and sweeps read them like any held-out
metric), their per-sample values (paired intervals between two evaluations) and a
markdown report; the games go to PGN files under out_dir/<label>/. `common_changes` turns
two evaluations' per-position centipawn losses into the paired change over the positions
both models answered legally (`<prefix>/strength/acpl_both_legal_change`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import chess
from tqdm import tqdm

from ..errors import ConfigError
from ..files import atomic_write_text
from ..held_out import mean_se, n_key, se_key
from . import stats
from .acpl import BLUNDER_CP, CAP, common_loss_change, move_losses
from .games import START, EngineOpponent, RandomMover, play_games, read_openings, write_pgn
from .player import MODES, ModelPlayer
from .puzzles import BANDS, THEMES, read_puzzles, solve


@dataclass(frozen=True)
class SuiteSettings:
    """The `strength` config group (conf/strength/*.yaml says what each key means)."""

    puzzles_file: str
    openings_file: str
    puzzles: int = 1000
    random_games: int = 40
    engine_games: int = 10
    selfplay_games: int = 20
    acpl_positions: int = 500
    modes: tuple[str, ...] = ("free", "mask")
    temperature: float = 0.0
    seed: int = 0
    max_plies: int = 200
    engine_seconds: float = 0.05
    engine_elo: int | None = None
    acpl_depth: int = 10
    processes: int = 2
    progress: bool = True

    def __post_init__(self):
        modes = [self.modes] if isinstance(self.modes, str) else list(self.modes)
        if not modes or any(m not in MODES for m in modes) or len(set(modes)) != len(modes):
            raise ValueError(f"strength.modes must be a list of distinct modes out of {MODES}, "
                             f"got {self.modes!r}")
        object.__setattr__(self, "modes", tuple(modes))
        for key in ("puzzles", "random_games", "engine_games", "selfplay_games",
                    "acpl_positions"):
            if getattr(self, key) < 0:
                raise ValueError(f"strength.{key} must be >= 0 (0 = skip), got "
                                 f"{getattr(self, key)}")
        if self.max_plies < 1 or self.processes < 1 or self.acpl_depth < 1:
            raise ValueError("strength.max_plies, strength.processes and strength.acpl_depth "
                             "must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"strength.temperature must be >= 0, got {self.temperature}")
        if self.engine_seconds <= 0:
            raise ValueError(f"strength.engine_seconds must be > 0, got {self.engine_seconds}")

    @property
    def enabled(self) -> bool:
        return any((self.puzzles, self.random_games, self.engine_games, self.selfplay_games,
                    self.acpl_positions))


def settings_from(node) -> SuiteSettings:
    """SuiteSettings from a config node (a DictConfig or dict; `_target_` ignored);
    ConfigError ('strength: ...') for a bad value or an unknown key."""
    from omegaconf import DictConfig, OmegaConf

    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) \
        else dict(node)
    data.pop("_target_", None)
    try:
        return SuiteSettings(**data)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"strength: {e}") from None


def open_suite(settings: SuiteSettings | None, eval_samples, out_dir: str | Path
               ) -> StrengthSuite | None:
    """The suite over the P positions of eval_samples, writing under out_dir; None when
    there are no settings or every measure is off. ConfigError ('strength: ...') for a
    puzzle or openings file it cannot read."""
    from ..errors import ConfigError
    from .puzzles import PuzzleFileError
    if settings is None or not settings.enabled:
        return None
    try:
        return StrengthSuite(settings, [s.truth.fen for s in eval_samples if s.task == "P"],
                             out_dir)
    except (PuzzleFileError, ValueError, OSError) as e:
        raise ConfigError(f"strength: {e}") from None


class StrengthSuite:
    """Reads the puzzles and openings once and keeps its engines (the ACPL pool, the
    engine opponent) open between evaluations; close() ends them (a context manager)."""

    def __init__(self, settings: SuiteSettings, acpl_fens: list[str] | None = None,
                 out_dir: str | Path | None = None):
        self.s = settings
        self.out_dir = Path(out_dir) if out_dir else None
        self.puzzle_set = read_puzzles(settings.puzzles_file, settings.puzzles) \
            if settings.puzzles else None
        if self.puzzle_set and self.puzzle_set.skipped:
            print(f"[rookworld] strength: {len(self.puzzle_set.skipped)} puzzle line(s) "
                  f"skipped, e.g. {self.puzzle_set.skipped[0]}", flush=True)
        self.openings = [START] + read_openings(settings.openings_file)
        self.acpl_fens = list(acpl_fens or [])[:settings.acpl_positions]
        self._pool = self._opponent = None

    # engines start at first use: a suite without games or ACPL never starts Stockfish
    def pool(self):
        if self._pool is None:
            from ..chess_tasks.stockfish_pool import EnginePool
            self._pool = EnginePool(processes=self.s.processes, depth=self.s.acpl_depth,
                                    multipv=1)
        return self._pool

    def opponent(self) -> EngineOpponent:
        if self._opponent is None:
            self._opponent = EngineOpponent(elo=self.s.engine_elo, seconds=self.s.engine_seconds,
                                            processes=self.s.processes)
        return self._opponent

    def close(self) -> None:
        for engine in (self._pool, self._opponent):
            if engine is not None:
                engine.close()
        self._pool = self._opponent = None

    def __enter__(self) -> StrengthSuite:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _bar(self, total: int | None, desc: str, unit: str = "it"):
        return tqdm(total=total, desc=desc, unit=unit, leave=False, mininterval=2,
                    disable=not self.s.progress)

    def __call__(self, policy, p_settings, label: str = "model", prefix: str = "eval"
                 ) -> tuple[dict, dict, str]:
        """-> (metrics, per-sample values, markdown report) of one model."""
        metrics, values, report = {}, {}, {}
        for mode in self.s.modes:
            # a fresh player (its generator seeded anew) for each measure, so that a sampled
            # measure repeats for a seed whatever the measures before it drew
            def player(mode=mode):
                return ModelPlayer(policy, p_settings, mode, self.s.temperature, self.s.seed)
            suffix = "" if mode == "free" else "_masked"
            part = {}
            if self.puzzle_set and self.puzzle_set.puzzles:
                part["puzzles"] = self._puzzles(player(), mode)
            part["games"] = self._games(player, mode, label)
            if self.acpl_fens:
                part["acpl"] = self._acpl(player(), mode)
            report[mode] = part
            for name, vals in per_item_values(part).items():
                if not vals:  # e.g. no legal answer to take a centipawn loss of
                    continue
                key = f"{prefix}/strength/{name}{suffix}"
                metrics[key], metrics[se_key(key)] = mean_se(vals)
                metrics[n_key(key)] = len(vals)
                if name not in UNPAIRED:
                    values[key] = vals
            for name, value in _flat_scalars(part).items():
                metrics[f"{prefix}/strength/{name}{suffix}"] = value
            if "acpl" in part:  # None for an illegal answer: paired by common_changes only
                values[f"{prefix}/strength/{BY_POSITION}{suffix}"] = part["acpl"]["losses"]
        text = markdown(report, self.s, label)
        if self.out_dir is not None:
            d = self.out_dir / label
            d.mkdir(parents=True, exist_ok=True)
            atomic_write_text(d / "strength.md", text + "\n")
            atomic_write_text(d / "strength.json", json.dumps(_jsonable(report), indent=1))
        return metrics, values, text

    def _puzzles(self, player, mode: str) -> dict:
        puzzles = self.puzzle_set.puzzles
        with self._bar(None, f"puzzles ({mode}, {len(puzzles)} first answers + the lines)",
                       "answer") as bar:
            player.on_batch = bar.update
            try:
                results = solve(puzzles, player)
            finally:
                player.on_batch = None
        rows = [{"id": r.puzzle.puzzle_id, "rating": r.puzzle.rating, "band": r.puzzle.band,
                 "themes": [t for t in r.puzzle.themes if t in THEMES],
                 "first": float(r.first), "line": float(r.line), "illegal": float(r.illegal),
                 "answers": list(r.answers)} for r in results]
        return {"file": self.puzzle_set.path, "skipped": len(self.puzzle_set.skipped),
                "rows": rows}

    def _games(self, new_player, mode: str, label: str) -> dict:
        s, out = self.s, {}
        plan = [("random", s.random_games), ("engine", s.engine_games),
                ("selfplay", s.selfplay_games)]
        for kind, n in plan:
            if not n:
                continue
            opponent = None if kind == "selfplay" else \
                RandomMover(s.seed) if kind == "random" else self.opponent()
            if kind == "selfplay":
                openings = [self.openings[i % len(self.openings)] for i in range(n)]
                colours = [None] * n
            else:
                openings = [self.openings[(i // 2) % len(self.openings)] for i in range(n)]
                colours = [chess.WHITE if i % 2 == 0 else chess.BLACK for i in range(n)]
            with self._bar(n, f"games {kind} ({mode})") as bar:
                records = play_games(openings, colours, new_player(), f"rookworld:{label}",
                                     opponent, s.max_plies, progress=bar.update)
            if self.out_dir is not None:
                write_pgn(records, self.out_dir / label / f"games_{kind}_{mode}.pgn",
                          f"rookworld strength: {kind} ({mode})",
                          {"Mode": mode, "Temperature": s.temperature, "Seed": s.seed,
                           "MaxPlies": s.max_plies})
            out[kind] = {"opponent": opponent.name if opponent else "itself",
                         "anchor": getattr(opponent, "elo", None),
                         "games": [{"opening": r.opening.name, "colour": _colour(r),
                                    "result": r.result, "termination": r.termination,
                                    "score": r.score(), "plies": r.legal_plies(),
                                    "illegal": r.illegal} for r in records]}
        return out

    def _acpl(self, player, mode: str) -> dict:
        with self._bar(len(self.acpl_fens), f"centipawn loss ({mode}): answers",
                       "answer") as bar:
            player.on_batch = bar.update
            try:
                moves = player(self.acpl_fens)
            finally:
                player.on_batch = None
        losses = move_losses(self.pool(), self.acpl_fens, moves)
        return {"limit": self.pool().limit_label, "losses": [m.loss for m in losses]}


# measures whose k-th value is not the k-th item of a fixed list (legal answers only, games
# whose moves do not repeat): kept out of the per-sample values, so that a change is given
# the interval of two independent means, not a paired one
UNPAIRED = ("acpl", "blunder", "engine_score", "engine_illegal_loss")
MEANS = ("acpl", "selfplay_plies")  # the measures that are not shares or game scores
BY_POSITION = "acpl_by_position"  # per-sample key of each position's loss, None if illegal
BOTH_LEGAL = "acpl_both_legal_change"


def common_changes(before: dict[str, list], after: dict[str, list]) -> dict[str, float]:
    """The paired change of the centipawn loss over the positions both evaluations answered
    legally, for each mode both measured it in: `<prefix>/strength/acpl_both_legal_change
    [_masked]` with its standard error (`_se`) and count of positions (`_n`), from two
    evaluations' per-sample values of the same positions. A change-only metric: the table
    prints it in the change column."""
    out = {}
    for key, losses in after.items():
        head, sep, suffix = key.partition(f"/strength/{BY_POSITION}")
        if not sep or key not in before:
            continue
        change = common_loss_change(before[key], losses)
        if change is not None:
            name = f"{head}/strength/{BOTH_LEGAL}{suffix}"
            out[name], out[se_key(name)], out[n_key(name)] = change
    return out


def _colour(r) -> str:
    return "both" if r.model_color is None else ("white" if r.model_color else "black")


def per_item_values(part: dict) -> dict[str, list[float]]:
    """Per-sample values of each measure whose figure is a mean."""
    out = {}
    if "puzzles" in part:
        rows = part["puzzles"]["rows"]
        for k in ("first", "line", "illegal"):
            out[f"puzzles_{k}"] = [r[k] for r in rows]
    for kind, g in part["games"].items():
        games = [x for x in g["games"] if x["result"] != "*"]
        if kind == "selfplay":
            out["selfplay_plies"] = [float(x["plies"]) for x in games]
            continue
        out[f"{kind}_score"] = [x["score"] for x in games]
        out[f"{kind}_illegal_loss"] = [float(x["termination"] in ("illegal move",
                                                                   "unparseable move"))
                                       for x in games]
    if "acpl" in part:
        losses = part["acpl"]["losses"]
        legal = [x for x in losses if x is not None]
        out["acpl"] = legal
        out["blunder"] = [float(x >= BLUNDER_CP) for x in legal]
        out["acpl_illegal"] = [float(x is None) for x in losses]
    return out


def _flat_scalars(part: dict) -> dict[str, float]:
    """Figures that are not means: the self-play median, the Elo estimate and its Wilson
    bounds (at a score of 0 or 1 only the bound the interval allows: engine_elo_high or
    engine_elo_low)."""
    out = {}
    g = part["games"]
    if "selfplay" in g:
        plies = [x["plies"] for x in g["selfplay"]["games"]]
        out["selfplay_plies_median"] = float(stats.median_interval(plies)[0])
    if "engine" in g:
        scores = [x["score"] for x in g["engine"]["games"] if x["score"] is not None]
        est = stats.elo_estimate(scores, g["engine"]["anchor"])
        for name, key in (("engine_elo", "elo"), ("engine_elo_low", "low"),
                          ("engine_elo_high", "high")):
            if est[key] is not None:
                out[name] = est[key]
    return out


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _share(values: list[float]) -> str:
    n = len(values)
    if not n:
        return "- | - | 0"
    k = sum(values)
    lo, hi = stats.wilson(k, n)
    return f"{k / n:.3f} | [{lo:.3f}, {hi:.3f}] | {n}"


def _mean(values: list[float], spec: str = ".3f") -> str:
    m, half = stats.mean_interval(values)
    if math.isnan(m):
        return "- | - | 0"
    return f"{m:{spec}} | ± {half:{spec}} | {len(values)}" if not math.isnan(half) \
        else f"{m:{spec}} | - | {len(values)}"


def markdown(report: dict, s: SuiteSettings, label: str) -> str:
    """The suite's tables for each mode: shares with Wilson ~95% intervals, means with
    Student's t ~95% intervals, the self-play median with a bootstrap interval."""
    how = "Greedy B: move" if s.temperature == 0 else \
        f"B: move sampled at temperature {s.temperature}"
    lines = [f"# Playing strength: {label}", "",
             f"{how} (seed {s.seed}); 'free' reads the "
             "model's own answer, 'mask' decodes the B: move along legal moves only. Shares "
             "carry Wilson ~95% intervals (a game score too, draws counting half), means "
             "Student's t ~95% intervals."]
    for mode, part in report.items():
        lines += ["", f"## {mode}", ""]
        if "puzzles" in part:
            p = part["puzzles"]
            rows = p["rows"]
            lines += [f"### Puzzles ({len(rows)} from {Path(p['file']).name}; "
                      f"{p['skipped']} skipped)", "",
                      "| measure | share | ~95% interval | n |", "|---|---|---|---|",
                      f"| first move solved | {_share([r['first'] for r in rows])} |",
                      f"| whole line solved | {_share([r['line'] for r in rows])} |",
                      f"| first answer illegal or unparseable | "
                      f"{_share([r['illegal'] for r in rows])} |", "",
                      "| rating band | n | first move solved | whole line | illegal |",
                      "|---|---|---|---|---|"]
            for band, _, _ in BANDS:
                sub = [r for r in rows if r["band"] == band]
                if sub:
                    lines.append(f"| {band} | {len(sub)} | " + " | ".join(
                        f"{sum(r[k] for r in sub) / len(sub):.3f}"
                        for k in ("first", "line", "illegal")) + " |")
            lines += ["", "| theme | n | first move solved | whole line | illegal |",
                      "|---|---|---|---|---|"]
            for theme in THEMES:
                sub = [r for r in rows if theme in r["themes"]]
                if sub:
                    lines.append(f"| {theme} | {len(sub)} | " + " | ".join(
                        f"{sum(r[k] for r in sub) / len(sub):.3f}"
                        for k in ("first", "line", "illegal")) + " |")
        lines += _games_lines(part["games"])
        if "acpl" in part:
            losses = part["acpl"]["losses"]
            legal = [x for x in losses if x is not None]
            lines += ["", f"### Centipawn loss ({len(losses)} held-out P positions, "
                      f"{part['acpl']['limit']}, evals clipped to ±{CAP} cp)", "",
                      "| measure | value | ~95% interval | n |", "|---|---|---|---|",
                      f"| average centipawn loss (legal answers) | {_mean(legal, '.1f')} |",
                      f"| blunder share (loss >= {BLUNDER_CP} cp) | "
                      f"{_share([float(x >= BLUNDER_CP) for x in legal])} |",
                      f"| illegal or unparseable answer | "
                      f"{_share([float(x is None) for x in losses])} |"]
    return "\n".join(lines)


def _games_lines(games: dict) -> list[str]:
    lines = []
    vs = {k: v for k, v in games.items() if k != "selfplay"}
    if vs:
        lines += ["", "### Games", "",
                  "| opponent | games | W | D | L | of which at the ply limit | void | illegal "
                  "losses | score | ~95% interval | Elo (~95% interval) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for g in vs.values():
            played = [x for x in g["games"] if x["score"] is not None]
            scores = [x["score"] for x in played]
            c = Counter(x["score"] for x in played)
            illegal = sum(x["termination"] in ("illegal move", "unparseable move")
                          for x in played)
            lo_s, hi_s = stats.wilson(sum(scores), len(scores))
            limit = sum(x["termination"] == "ply limit" for x in played)
            elo = "-"
            if g["anchor"] is not None and scores:
                e = stats.elo_estimate(scores, g["anchor"])
                lo = f"{e['low']:.0f}" if e["low"] is not None else "-inf"
                hi = f"{e['high']:.0f}" if e["high"] is not None else "+inf"
                elo = (f"{e['elo']:.0f} " if e["elo"] is not None else "") + f"[{lo}, {hi}]"
            score = f"{sum(scores) / len(scores):.3f}" if scores else "-"
            lines.append(f"| {g['opponent']} | {len(g['games'])} | {c[1.0]} | {c[0.5]} | "
                         f"{c[0.0]} | {limit} | {len(g['games']) - len(played)} | {illegal} | "
                         f"{score} | [{lo_s:.3f}, {hi_s:.3f}] | {elo} |")
    if "selfplay" in games:
        sp = games["selfplay"]["games"]
        plies = [x["plies"] for x in sp]
        med, lo, hi = stats.median_interval(plies)
        q = sorted(plies)
        ends = Counter(x["termination"] for x in sp)
        lines += ["", f"### Self-play ({len(sp)} games, the model on both sides)", "",
                  f"- legal half-moves before the game ended: median {med:g} "
                  f"(bootstrap ~95% [{lo:g}, {hi:g}]), mean {_mean(plies, '.1f').split(' |')[0]}; "
                  f"quartiles {q[len(q) // 4]}, {q[len(q) // 2]}, {q[3 * len(q) // 4]}; "
                  f"min {q[0]}, max {q[-1]}",
                  "- how the games ended: " + ", ".join(f"{k} {v}" for k, v in
                                                        ends.most_common())]
    return lines
