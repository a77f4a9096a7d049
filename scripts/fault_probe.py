"""Fault probe of `python -m rookworld.train` with real processes: SIGKILLs at random points
of a run then resumes, damaged checkpoints, bad inputs and a killed joblib sweep. Prints the
Markdown tables of docs/reliability.md.

    .venv/bin/python scripts/fault_probe.py --kills 10     # about 10 minutes on 2 cores

Runs a tiny random GPT-2 on the bundled held-out split (mechanics, not learning), one
torch thread per process, in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_faults_checkpoint import CORRUPTIONS  # noqa: E402 - the tests' damage kinds
from test_faults_processes import children, running  # noqa: E402

from rookworld.run_dir import MetricsFile, latest_checkpoint  # noqa: E402

DATA = ROOT / "rookworld" / "assets" / "data" / "eval.jsonl.gz"
TINY = ["model=tiny_random", "model.n_layer=2", "model.n_embd=32", "model.n_head=2",
        "model.n_positions=320", "logger=none", f"data.train={DATA}", f"data.eval={DATA}",
        "data.eval_per_task=4", "task_mix=mixed", "prompts_per_step=2", "num_generations=2",
        "sampler.max_new_tokens=24", "sampler.per_task.A.max_new_tokens=24",
        "optim=adamw_cosine", "optim.schedule.warmup_steps=1", "optim.lr=0.01",
        "kl=adaptive", "checkpoint_every=1", "eval_every=2", "guard.kl.threshold=1000"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYDRA_FULL_ERROR="1")


def train(args: list[str], cwd: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rookworld.train", *args], cwd=cwd, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def done_steps(run: Path) -> int:
    rows = MetricsFile(run / "metrics.jsonl").read() if (run / "metrics.jsonl").exists() else []
    return 1 + max((r["step"] for r in rows if "reward/mean" in r), default=-1)


def weights(run: Path) -> dict:
    return load_file(str(latest_checkpoint(run) / "model" / "model.safetensors"))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def finish(p: subprocess.Popen) -> tuple[int, str]:
    out, _ = p.communicate(timeout=900)
    return p.returncode, out


def kills(n: int, steps: int, tmp: Path, rng: random.Random) -> list[str]:
    whole = tmp / "whole"
    rc, out = finish(train(TINY + [f"steps={steps}", f"hydra.run.dir={whole}"], tmp))
    assert rc == 0, out[-2000:]
    ref, rows = weights(whole), []
    for k in range(n):
        run = tmp / f"killed{k}"
        at, delay = rng.randrange(steps - 1), rng.uniform(0.0, 0.6)
        p = train(TINY + [f"steps={steps}", f"hydra.run.dir={run}"], tmp)
        while not (run / "metrics.jsonl").exists() and p.poll() is None:  # started
            time.sleep(0.02)
        while done_steps(run) < at and p.poll() is None:
            time.sleep(0.02)
        time.sleep(delay)
        finished_first = p.poll() is not None
        p.kill()
        p.wait()
        resumes = 0
        while True:
            rc, out = finish(train([f"resume={run}"], tmp))
            resumes += 1
            if rc == 0 or resumes == 3:
                break
        ok = rc == 0 and same(weights(run), ref)
        rows.append(f"| {k + 1} | after step {at} + {delay:.2f} s"
                    f"{' (it had finished)' if finished_first else ''} | {resumes} | "
                    f"{'yes' if ok else 'NO'} |")
    return rows


def corruptions(tmp: Path) -> list[str]:
    base = tmp / "base"
    rc, out = finish(train(TINY + ["steps=2", f"hydra.run.dir={base}"], tmp))
    assert rc == 0, out[-2000:]
    rows = []
    for i, (name, damage) in enumerate(sorted(CORRUPTIONS.items())):
        run = tmp / f"damaged{i}"
        shutil.copytree(base, run)
        newest = latest_checkpoint(run)
        damage(newest)
        rc, out = finish(train([f"resume={run}", "steps=3"], tmp))
        detected = f"checkpoint {newest.name} skipped" in out
        resumed = rc == 0 and "step-000003" == latest_checkpoint(run).name
        rows.append(f"| {name} | {'yes' if detected else 'NO'} | "
                    f"{'from the previous checkpoint' if resumed else f'exit {rc}'} |")
    return rows


BAD = ["optim.lr=1e9 optim.weight_decay=0.1", "data.train={tmp}", "data.train=/nonexistent.jsonl",
       "hydra.run.dir=/proc/x/run", "sampler.top_p=0", "sampler.temperature=0", "steps=abc",
       "eval_per_task=0", "+optim.lrr=1e-4", "device=cuda", "prompts_per_step=0",
       "resume=/nonexistent"]


def bad_inputs(tmp: Path) -> list[str]:
    rows = []
    for i, arg in enumerate(BAD):
        arg = arg.replace("{tmp}", str(tmp))
        extra = [] if arg.startswith("hydra.run.dir") else [f"hydra.run.dir={tmp / f'bad{i}'}"]
        t0 = time.monotonic()
        rc, out = finish(train(TINY + ["steps=2", "eval_every=0", *extra, *arg.split()], tmp))
        out = out.replace(str(tmp), "<dir>")
        lines = [x for x in out.splitlines() if x.startswith(("rookworld:", "[rookworld] warn",
                                                               "[rookworld] outcome"))]
        said = (lines[-1] if lines else out.strip().splitlines()[-1])[:110].replace("|", "/")
        rows.append(f"| `{arg.replace(str(tmp), '<dir>')}` | {rc} | "
                    f"{'yes' if 'Traceback' in out else 'no'} | {time.monotonic() - t0:.0f} s "
                    f"| {said} |")
    return rows


def joblib_kill(tmp: Path) -> str:
    args = ["-m", "hparams_search=grpo_stability", "hydra.sweeper.params=null", "batch_size=4",
            *TINY, "steps=30", "hydra.sweeper.n_trials=2", "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2", "hydra.sweeper.n_jobs=2"]
    p = train(args, tmp)
    trial = tmp / "multirun" / "grpo_stability" / "trial-0"
    while done_steps(trial) < 1 and p.poll() is None:
        time.sleep(0.5)
    workers = children(p.pid)
    p.kill()
    p.wait()
    t0 = time.monotonic()
    while any(running(w) for w in workers) and time.monotonic() - t0 < 60:
        time.sleep(0.25)
    left = [w for w in workers if running(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    return (f"{len(workers)} worker processes; {len(workers) - len(left)} ended "
            f"{time.monotonic() - t0:.1f} s after the driver's SIGKILL, {len(left)} left")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=10, help="SIGKILLs at random points")
    ap.add_argument("--steps", type=int, default=8, help="steps of each killed run")
    ap.add_argument("--seed", type=int, default=0, help="where the kills fall")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print("| kill | when | resumes | final weights bit-identical |\n|---|---|---|---|")
        print("\n".join(kills(args.kills, args.steps, tmp, random.Random(args.seed))))
        print("\n| damage to the newest checkpoint | named and skipped | resume |\n|---|---|---|")
        print("\n".join(corruptions(tmp)))
        print("\n| bad input | exit | traceback | time | last line |\n|---|---|---|---|---|")
        print("\n".join(bad_inputs(tmp)))
        print(f"\nKilled joblib sweep: {joblib_kill(tmp)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
