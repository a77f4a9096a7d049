"""Long-running fuzzer for the parsers, the loader, the validators, the rewards and the
redactor: mutates real P and A lines (the bundled data) and checks each target's
contract on every input.

    python fuzz/fuzz_parsers.py --minutes 10            # plain mutation loop (no extra deps)
    python fuzz/fuzz_parsers.py --minutes 10 --atheris  # coverage-guided (pip install atheris)
    python fuzz/fuzz_parsers.py --rewards 10000         # per reward: N hostile inputs, a table

Contracts: parsers never raise; the loader returns consistent counts or raises
ValueError("no usable rows"); rewards return a finite, deterministic score in their
range; redaction never raises and is idempotent. A failing input is written to
fuzz/crashes/<target>-<sha1>.txt (repr of the input and the traceback) and the run
exits 1. The pytest counterpart is tests/test_fuzz.py.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import random
import sys
import time
import traceback
from pathlib import Path

from rookworld.chess_tasks import Sample, parse_env, parse_policy
from rookworld.chess_tasks.environment import split_env_line
from rookworld.chess_tasks.policy import parse_policy_line
from rookworld.chess_tasks.stockfish_pool import LabelPool
from rookworld.config import PACKAGE_DIR
from rookworld.data.loaders import load_lines
from rookworld.data.validate import DEFECTS
from rookworld.redact import redact
from rookworld.rewards import (
    BinaryReward,
    ContinuousReward,
    CurriculumReward,
    EngineReward,
    GraduatedReward,
)

CRASHES = Path(__file__).parent / "crashes"
ALPHABET = "abcdefgh12345678qrbnkpKQRBNPwW-+/ .:MEAB09\n\t"
NASTY = ["nan", "inf", "-inf", "1e309", "-0", "999.99", "+", "++", " ", "\x00", "\ufffd",
         "e2e4", "e7e8q", "0000", "P: ", "A: ", "M: ", "E: ", "B: ", "💥", "\u202e"]


def corpus(limit: int = 400) -> list[Sample]:
    path = PACKAGE_DIR / "assets" / "data" / "train.jsonl.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()[:limit]
    return [Sample.from_json(json.loads(x)) for x in lines]


def mutate(text: str, rng: random.Random, others: list[str]) -> str:
    for _ in range(rng.randint(1, 6)):
        i = rng.randint(0, len(text))
        op = rng.randrange(8)
        if op == 0 and text:  # flip a character
            i = min(i, len(text) - 1)
            text = text[:i] + rng.choice(ALPHABET) + text[i + 1:]
        elif op == 1:  # insert a nasty token
            text = text[:i] + rng.choice(NASTY) + text[i:]
        elif op == 2:  # delete a span
            text = text[:i] + text[i + rng.randint(1, 12):]
        elif op == 3:  # duplicate a span
            text = text[:i] + text[i:i + rng.randint(1, 20)] + text[i:]
        elif op == 4:  # splice with another line
            other = rng.choice(others)
            text = text[:i] + other[rng.randint(0, len(other)):]
        elif op == 5:  # truncate
            text = text[:i]
        elif op == 6:  # any unicode character
            text = text[:i] + chr(rng.randint(0, 0x10FFFF)) + text[i:]
        else:  # whitespace games: collapse or pad
            text = text.replace("  ", " ") if rng.random() < 0.5 else text.replace(" ", "   ")
    return text


def _check_reward(name, reward, sample, text):
    got, again = reward(sample, text), reward(sample, text)
    low, high = reward.range
    assert math.isfinite(got.score) and low <= got.score <= high, (name, got)
    assert got == again, f"{name} is not deterministic"


def check_all(text: str, sample: Sample, rewards: dict) -> None:
    """Every contract on one input; raises AssertionError (or the crash) on a breach."""
    p = parse_policy(text)
    assert p.ok or p.reason
    parse_policy_line(text)
    e = parse_env(text)
    assert e.ok or e.reason
    split_env_line(text)
    for name, reward in rewards.items():
        _check_reward(name, reward, sample, text)
    once = redact(text)
    assert redact(once) == once, "redact is not idempotent"
    try:
        res = load_lines(text.splitlines(), "fuzz", "relabel", json_rows=False)
        r = res.report
        assert r.rows == r.kept + r.dropped and set(r.counts) <= set(DEFECTS)
    except ValueError as err:
        assert "no usable rows" in str(err), err


def save_crash(target: str, text: str) -> Path:
    CRASHES.mkdir(exist_ok=True)
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    path = CRASHES / f"{target}-{digest}.txt"
    path.write_text(repr(text) + "\n\n" + traceback.format_exc())
    return path


def run_loop(minutes: float, seed: int) -> int:
    samples = corpus()
    lines = [s.prompt + s.completion for s in samples]
    rewards = {"binary": BinaryReward(), "graduated": GraduatedReward(),
               "continuous": ContinuousReward(), "engine": EngineReward(LabelPool(samples)),
               "curriculum": CurriculumReward(GraduatedReward(), BinaryReward(), 100).at(40)}
    rng, deadline, n, crashes = random.Random(seed), time.monotonic() + 60 * minutes, 0, set()
    while time.monotonic() < deadline:
        sample = rng.choice(samples)
        base = sample.completion if rng.random() < 0.6 else rng.choice(lines)
        text = mutate(base, rng, lines)
        try:
            check_all(text, sample, rewards)
        except Exception:  # noqa: BLE001 - every breach is recorded, the loop goes on
            crashes.add(save_crash("contract", text))
        n += 1
        if n % 5000 == 0:
            print(f"[fuzz] {n} inputs, {len(crashes)} failing", flush=True)
    print(f"[fuzz] done: {n} inputs in {minutes:g} min, {len(crashes)} failing"
          + "".join(f"\n  {p}" for p in sorted(crashes)))
    return 1 if crashes else 0


def reward_table(n: int, seed: int, slow_ms: float = 50.0) -> int:
    """Each reward on the same n hostile inputs (mutated completions and lines): exceptions,
    scores outside its documented range, non-finite parts and the slowest call, as a
    Markdown table (fuzz/README.md). Exit status 1 when any count is not 0 or a call took
    more than slow_ms."""
    samples = corpus()
    lines = [s.prompt + s.completion for s in samples]
    rewards = {"binary": BinaryReward(), "graduated": GraduatedReward(),
               "continuous": ContinuousReward(), "engine": EngineReward(LabelPool(samples)),
               "curriculum": CurriculumReward(GraduatedReward(), BinaryReward(), 100).at(40)}
    rng = random.Random(seed)
    inputs = []
    for _ in range(n):
        sample = rng.choice(samples)
        base = sample.completion if rng.random() < 0.6 else rng.choice(lines)
        inputs.append((sample, mutate(base, rng, lines)))
    rows, bad = [], False
    for name, reward in rewards.items():
        errors = outside = nonfinite = 0
        slowest, low, high = 0.0, *reward.range
        for sample, text in inputs:
            t0 = time.perf_counter()
            try:
                got = reward(sample, text)
            except Exception:  # noqa: BLE001 - counted, and the input saved
                errors += 1
                save_crash(f"reward-{name}", text)
                continue
            finally:
                slowest = max(slowest, time.perf_counter() - t0)
            outside += not low <= got.score <= high
            nonfinite += not all(math.isfinite(v) for v in got.parts.values())
        bad |= bool(errors or outside or nonfinite) or slowest * 1000 > slow_ms
        rows.append(f"| {name} | {n:,} | {errors} | {outside} | {nonfinite} | "
                    f"{slowest * 1000:.2f} |")
    print("| reward | inputs | exceptions | outside range | non-finite parts | slowest call (ms) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if bad else 0


def run_atheris(seed: int) -> None:  # pragma: no cover - optional, needs atheris
    import atheris

    samples = corpus()
    rewards = {"graduated": GraduatedReward(), "engine": EngineReward(LabelPool(samples))}

    def one(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        sample = samples[fdp.ConsumeIntInRange(0, len(samples) - 1)]
        check_all(fdp.ConsumeUnicodeNoSurrogates(400), sample, rewards)

    atheris.Setup([sys.argv[0], f"-seed={seed}"], one)
    atheris.Fuzz()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=1.0, help="how long the loop runs")
    ap.add_argument("--seed", type=int, default=0, help="mutation seed")
    ap.add_argument("--atheris", action="store_true", help="coverage-guided (needs atheris)")
    ap.add_argument("--rewards", type=int, metavar="N", default=0,
                    help="instead of the loop: each reward on N hostile inputs, as a table")
    args = ap.parse_args(argv)
    if args.rewards:
        return reward_table(args.rewards, args.seed)
    if args.atheris:
        run_atheris(args.seed)
        return 0
    return run_loop(args.minutes, args.seed)


if __name__ == "__main__":
    sys.exit(main())
