"""The embedded-baseline experiment's check-heavy training file: every P position in check,
the asked-for number of others and every A sample (slow: it reads all 100,000 bundled rows)."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import chess
import pytest

SCRIPT = (Path(__file__).resolve().parents[1] / "experiments" / "embedded_baseline"
          / "check_share.py")


@pytest.mark.slow
def test_keeps_every_position_in_check_and_the_asked_for_others(tmp_path):
    out = tmp_path / "train.jsonl.gz"
    subprocess.run([sys.executable, str(SCRIPT), str(out), "--others", "100"], check=True,
                   capture_output=True)
    rows = [json.loads(line) for line in gzip.open(out, "rt")]
    policy = [r for r in rows if r["task"] == "P"]
    in_check = sum(chess.Board(r["truth"]["fen"]).is_check() for r in policy)
    assert in_check == 3518 and len(policy) == 3518 + 100  # the bundled file's 3,518
    assert sum(r["task"] == "A" for r in rows) == 60_000
    assert len({r["prompt"] for r in policy}) == len(policy)  # no position twice
