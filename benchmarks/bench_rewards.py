"""Scoring throughput of every reward option, in completions per second on one core.

    .venv/bin/python benchmarks/bench_rewards.py [--positions 400] [--group 8]

Positions come from seeded random games (python-chess), so the benchmark needs
no data files. P labels are 5 random legal moves with random evals; the engine
option's pool answers from those labels (no live engine call: what is measured
is the reward's own work, not Stockfish's). Each position gets `group`
completions in a row, as a GRPO group does: the reference, three corruptions of
it (characters flipped, cut short, another B: move / a changed FEN field) and
free text, cycled. The parts' caches (legal moves, truth squares) are
cleared before each pass; `--no-cache` switches them off (each call computes).
"""

from __future__ import annotations

import argparse
import random
import time

import chess

from rookworld.chess_tasks import env_sample, policy_sample
from rookworld.chess_tasks.stockfish_pool import LabelPool
from rookworld.rewards import (
    BinaryReward,
    ContinuousReward,
    CurriculumReward,
    EngineReward,
    GraduatedReward,
    parts,
)


def random_positions(n: int, rng: random.Random) -> list[chess.Board]:
    """n positions from random games, plies 1..80, none game-over."""
    out: list[chess.Board] = []
    while len(out) < n:
        board = chess.Board()
        for _ in range(rng.randint(1, 80)):
            moves = list(board.legal_moves)
            if not moves or board.is_game_over():
                break
            board.push(rng.choice(moves))
        if not board.is_game_over():
            out.append(board.copy(stack=False))
    return out


def make_samples(boards, rng: random.Random):
    policy, env = [], []
    for board in boards:
        moves = rng.sample([m.uci() for m in board.legal_moves], min(5, board.legal_moves.count()))
        evals = [round(rng.uniform(-5, 5), 2) for _ in moves]
        policy.append(policy_sample(board.fen(), moves, evals, "benchmark"))
        move = rng.choice(moves) if rng.random() < 0.9 else "a1a1"
        env.append(env_sample(board.fen(), move))
    return policy, env


def corruptions(sample, rng: random.Random) -> list[str]:
    ref = sample.completion
    i = rng.randrange(len(ref))
    flipped = ref[:i] + rng.choice("abcdefgh12345678 +/") + ref[i + 1:]
    cut = ref[:rng.randrange(len(ref))]
    if sample.task == "P":
        other = rng.choice(sample.truth.moves)
        changed = ref[:ref.rindex("B:")] + "B: " + other
    else:
        changed = ref.replace(" w ", " b ") if " w " in ref else ref.replace(" b ", " w ")
    return [ref, flipped, cut, changed, "the model rambles on " * rng.randint(1, 8)]


def workload(samples, group: int, rng: random.Random):
    rows = []
    for s in samples:
        texts = corruptions(s, rng)
        rows.extend((s, texts[k % len(texts)]) for k in range(group))
    return rows


def throughput(reward, rows, repeats: int) -> float:
    """Best of `repeats` passes, completions per second (cache cleared each pass)."""
    best = 0.0
    for _ in range(repeats):
        for cached in (parts.legal_moves, parts._truth_squares):
            getattr(cached, "cache_clear", lambda: None)()
        start = time.perf_counter()
        for sample, text in rows:
            reward(sample, text)
        best = max(best, len(rows) / (time.perf_counter() - start))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--positions", type=int, default=400, help="positions per task")
    ap.add_argument("--group", type=int, default=8, help="completions per position")
    ap.add_argument("--repeats", type=int, default=3, help="passes; the best is reported")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cache", action="store_true",
                    help="the parts' caches off: legal moves and truth squares per call")
    args = ap.parse_args()
    if args.no_cache:
        parts.legal_moves = parts.legal_moves.__wrapped__
        parts._truth_squares = parts._squares
    rng = random.Random(args.seed)
    policy, env = make_samples(random_positions(args.positions, rng), rng)
    rewards = {
        "binary": BinaryReward(),
        "graduated": GraduatedReward(),
        "continuous": ContinuousReward(),
        "engine (label pool)": EngineReward(LabelPool(policy)),
        "graduated_curriculum@250": CurriculumReward(GraduatedReward(), BinaryReward(),
                                                     500).at(250),
    }
    print(f"{args.positions} positions per task x {args.group} completions, "
          f"best of {args.repeats}, one thread, parts' caches {'off' if args.no_cache else 'on'}")
    print(f"{'option':26s} {'P compl/s':>10s} {'A compl/s':>10s}")
    rows_p, rows_a = workload(policy, args.group, rng), workload(env, args.group, rng)
    for name, reward in rewards.items():
        p = throughput(reward, rows_p, args.repeats)
        a = throughput(reward, rows_a, args.repeats)
        print(f"{name:26s} {p:10.0f} {a:10.0f}")


if __name__ == "__main__":
    main()
