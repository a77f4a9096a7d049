"""The strength-levers experiment's diagnostics: the seen-positions training file and its
measure, and how often a group of samples holds the right move (pass_at_k.py), run as the
experiment's README runs them, on a few positions of the shipped model."""

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

from rookworld.config import pkg_data
from rookworld.data.loaders import read_lines

LEVERS = Path(__file__).resolve().parents[1] / "experiments" / "strength_levers"
SHARE = re.compile(r"(\d\.\d{3}) ± (\d\.\d{3})")


def run(script: str, *args: str) -> str:
    return subprocess.run([sys.executable, str(LEVERS / script), *args], capture_output=True,
                          text=True, check=True).stdout


def test_seen_positions_writes_training_p_rows_and_measures_each_model(tmp_path):
    out = tmp_path / "seen.jsonl.gz"
    run("seen_positions.py", "write", str(out), "--n", "4")
    rows = [json.loads(line) for line in gzip.open(out, "rt")]
    train = {json.loads(line)["truth"]["fen"] for line in
             read_lines(Path(pkg_data("train.jsonl.gz")))}
    assert len(rows) == 4 and all(r["task"] == "P" and r["truth"]["fen"] in train
                                  for r in rows)
    first = out.read_bytes()
    run("seen_positions.py", "write", str(out), "--n", "4")
    assert out.read_bytes() == first  # the same draw, byte for byte, every time
    table = run("seen_positions.py", "measure", str(out), "shipped")
    row = next(line for line in table.splitlines() if line.startswith("| shipped"))
    shares = [float(m) for m, _ in SHARE.findall(row)]
    assert len(shares) == 3 and all(0 <= s <= 1 for s in shares)
    assert shares[0] <= shares[1]  # the engine's best move has labelled quality 1


def test_pass_at_k_never_below_one_sample_and_counts_mixed_groups():
    table = run("pass_at_k.py", "shipped", "--positions", "6", "--k", "3",
                "--temperatures", "1.0")
    sampled = [line for line in table.splitlines() if "3 at T=1.0" in line]
    assert len(sampled) == 2  # puzzles and held-out positions
    for line in sampled:
        one, any_of_k, mixed = (float(m) for m, _ in SHARE.findall(line))
        assert one <= any_of_k and mixed <= any_of_k
    assert "groups at T=1.0 whose legal B: moves differ" in table
