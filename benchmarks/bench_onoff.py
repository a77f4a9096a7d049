"""On/off figures of the optimisations outside the GRPO step's ablation: each measured with
the optimisation as shipped and switched off, on the same work, in this process (log-prob
chunks: one process per setting, for its peak RSS).

    python benchmarks/bench_onoff.py pool      # the engine pool's cache, reward=engine scoring
    python benchmarks/bench_onoff.py mask      # the legal-move mask's prefix trees
    python benchmarks/bench_onoff.py slots     # Sample / PolicyTruth / EnvTruth with __slots__
    python benchmarks/bench_onoff.py logprobs  # log-prob chunks at GPT-2's vocabulary
    python benchmarks/bench_onoff.py workers   # the data generator's game and label processes

The reward parts' caches: `bench_rewards.py --no-cache`. Switching an optimisation off
replaces the module attribute or method that carries it, here only: nothing in the package
reads a switch for it.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "rookworld" / "assets" / "data"


def policy_samples(n: int):
    """The first n P samples of the bundled eval split (engine-labelled at depth 8)."""
    from rookworld.data.loaders import load_samples

    return [s for s in load_samples(str(ASSETS / "eval.jsonl.gz")).samples if s.task == "P"][:n]


def timed(fn, *args):
    """(seconds, result) of fn(*args)."""
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def bench_pool(a) -> None:
    """reward=engine over GRPO groups: `group` completions per position whose B: moves are
    drawn as a group's are (mostly the position's listed moves, repeats included; one in
    eight any legal move), scored with the pool's per-position cache and without it."""
    import chess

    from rookworld.chess_tasks import policy_prompt, policy_text
    from rookworld.chess_tasks.stockfish_pool import EnginePool
    from rookworld.rewards import EngineReward

    class Uncached(EnginePool):
        def _cached(self, key, compute):  # every question searched again
            return self._run(compute)

    rng = random.Random(a.seed)
    rows = []
    for s in policy_samples(a.positions):
        t = s.truth
        legal = [m.uci() for m in chess.Board(t.fen).legal_moves]
        for _ in range(a.group):
            best = rng.choice(legal) if rng.random() < 0.125 else rng.choice(t.moves)
            rows.append((s, policy_text(t.fen, t.moves, t.evals, best)[
                len(policy_prompt(t.fen)):]))
    print(f"reward=engine, {a.positions} positions x {a.group} completions, depth {a.depth}, "
          f"{a.processes} engine process(es)")
    for name, cls in (("cached", EnginePool), ("uncached", Uncached)):
        reward = EngineReward(cls(depth=a.depth, processes=a.processes))
        try:
            sec, scores = timed(lambda r: [r(s, text).score for s, text in rows], reward)
        finally:
            reward.close()
        print(f"  {name:9s} {sec:7.2f} s  ({len(rows) / sec:6.1f} completions/s, "
              f"mean score {statistics.fmean(scores):.4f})")


def bench_mask(a) -> None:
    """The shipped model's greedy answers on the same positions free and under the
    legal-move mask, and the mask's prefix trees built alone for them: what keeping the
    trees between batches could save at most (the package builds them once a batch)."""
    from rookworld import legal_mask
    from rookworld.policy import load_embedded
    from rookworld.sampling import SamplingSettings
    from rookworld.strength.player import ModelPlayer

    fens = [s.truth.fen for s in policy_samples(a.positions)]
    policy = load_embedded()
    index = legal_mask.token_index(policy.tokenizer)
    print(f"greedy answers, {len(fens)} positions")
    for mode in ("free", "mask", "free", "mask"):
        sec, _ = timed(ModelPlayer(policy, SamplingSettings(), legal_moves=mode), fens)
        print(f"  {mode:4s} {sec:6.2f} s")
    sec, _ = timed(lambda: [index.trie(f) for f in fens])
    print(f"  the {len(fens)} positions' prefix trees alone: {sec:.3f} s")


def bench_slots(a) -> None:
    """Python heap of the bundled train split's samples as the package builds them (slotted
    dataclasses) and as the same dataclasses without __slots__ (tracemalloc; the strings
    are shared by both, so the difference is the instances')."""
    import dataclasses
    import tracemalloc

    from rookworld.chess_tasks import EnvTruth, PolicyTruth, Sample
    from rookworld.data.loaders import load_samples

    def unslotted(cls):
        fields = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
        return dataclasses.make_dataclass(cls.__name__, fields, frozen=True)

    plain = {cls: unslotted(cls) for cls in (Sample, PolicyTruth, EnvTruth)}

    def build(samples, classes):
        out = []
        for s in samples:
            truth = classes[type(s.truth)](*dataclasses.astuple(s.truth, tuple_factory=tuple))
            out.append(classes[Sample](s.task, s.prompt, s.completion, truth, s.meta))
        return out

    samples = load_samples(str(ASSETS / "train.jsonl.gz")).samples
    same = {cls: cls for cls in plain}
    print(f"{len(samples):,} train samples rebuilt")
    for name, classes in (("slots", same), ("no slots", plain)):
        tracemalloc.start()
        built = build(samples, classes)
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        print(f"  {name:9s} {size / 2**20:7.1f} MiB ({size / len(built):5.0f} bytes a sample)")
        del built


LOGPROBS = """
import resource, sys, time, torch
from rookworld.backends.fast_gpt2 import forward
from rookworld.gpt2 import GPT2Config, GPT2LMHeadModel
rows, tokens, vocab = map(int, sys.argv[1:4])
whole = sys.argv[4] == "1"
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=512, n_embd=768, n_layer=1,
                                   n_head=12)).eval()
if whole:  # one chunk: the whole batch's [rows, tokens, vocab] logits at once
    forward.logprob_chunk_rows = lambda t, v: rows
hidden = torch.randn(rows, tokens, 768)
ids = torch.randint(0, vocab, (rows, tokens))
temps = torch.full((rows,), 0.7)
with torch.no_grad():
    forward.token_logprobs_from_hidden(model, hidden[:2], ids[:2], temps[:2])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        forward.token_logprobs_from_hidden(model, hidden, ids, temps)
        times.append(time.perf_counter() - t0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(min(times), base / 1024, peak / 1024)
"""


def bench_logprobs(a) -> None:
    """No-grad token log-probs of rows x tokens completions from their last hidden states
    (the reference pass's head) at GPT-2's vocabulary, in `logprob_chunk_rows`' chunks and
    in one chunk, each in its own process: best of 3 seconds and peak RSS."""
    print(f"token log-probs, {a.rows} rows x {a.tokens} tokens, vocabulary {a.vocab}, "
          f"width 768")
    for name, whole in (("chunked", "0"), ("one chunk", "1")):
        out = subprocess.run([sys.executable, "-c", LOGPROBS, str(a.rows), str(a.tokens),
                              str(a.vocab), whole], capture_output=True, text=True, check=True)
        sec, base, peak = map(float, out.stdout.split())
        print(f"  {name:9s} {sec:6.2f} s, peak RSS {peak:7.0f} MiB ({peak - base:+.0f} MiB "
              f"over the process before the pass)")


def bench_workers(a) -> None:
    """The data generator's two parallel phases at 1 and 2 processes: `play_games` (the
    `workers` setting) and the labeller's `EnginePool.analyse_many` (engine.processes)."""
    from rookworld.chess_tasks.stockfish_pool import EnginePool
    from rookworld.data.games import GameStyle, play_games

    fens = [s.truth.fen for s in policy_samples(a.positions)]
    print(f"{a.games} games (GameStyle defaults); {len(fens)} positions labelled at depth "
          f"{a.depth}, multipv 5")
    for n in (1, 2):
        games, _ = timed(play_games, a.seed, a.games, GameStyle(), n)
        with EnginePool(depth=a.depth, processes=n, multipv=5) as pool:
            label, _ = timed(pool.analyse_many, fens)
        print(f"  {n} process(es): games {games:6.1f} s, labels {label:6.1f} s "
              f"({len(fens) / label:5.1f} positions/s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["pool", "mask", "slots", "logprobs", "workers"])
    ap.add_argument("--positions", type=int, default=None)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=144)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--games", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    a.positions = a.positions or {"pool": 32, "mask": 500, "workers": 200}.get(a.what, 0)
    {"pool": bench_pool, "mask": bench_mask, "slots": bench_slots,
     "logprobs": bench_logprobs, "workers": bench_workers}[a.what](a)
    print(json.dumps({"what": a.what, "maxrss_mib": round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


if __name__ == "__main__":
    main()
