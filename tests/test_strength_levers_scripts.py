"""The strength-levers experiment's diagnostics: how often a group of samples holds the right
move (pass_at_k.py) and the seen-positions training file and its measure
(seen_positions.py): their judging on hand-made answers, and the scripts run as the
experiment's README runs them (slow: they load the model and read the bundled splits)."""

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rookworld.chess_tasks.sample import PolicyTruth
from rookworld.config import pkg_data
from rookworld.data.loaders import read_lines
from rookworld.strength.puzzles import Puzzle

LEVERS = Path(__file__).resolve().parents[1] / "experiments" / "strength_levers"
SHARE = re.compile(r"(-?\d\.\d{3}) ± (\d\.\d{3})")
KINGS = "8/8/8/8/8/8/4k3/K7 w - - 0 1"  # white king a1: a1b1, a1a2, a1b2 legal
TRUTH = PolicyTruth(KINGS, ("a1b1", "a1a2"), (0.5, -1.0), "a1b1")
# black to move; the listed first move is Qd1+ (not mate), and Qb2# (the queen guarded by
# the king on c3) mates, which solves the puzzle too
MATE = Puzzle("m", "8/8/8/8/8/2k5/3q4/K7 b - - 0 1", ("d2d1",), 1000, (), 2)


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, LEVERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def answer(best: str) -> str:
    return f"M: {best} a1a2 E: 0.1 0.0 B: {best}"


def test_group_shares_count_answers_groups_with_any_and_mixed_groups():
    pass_at_k = script("pass_at_k")
    assert pass_at_k.group_shares([[True, False], [False, False]]) == (0.25, 0.5, 0.5)
    assert pass_at_k.group_shares([[True, True], [True, False]]) == (0.75, 1.0, 0.5)


def test_a_puzzle_is_solved_by_its_move_or_any_mate_and_the_best_move_by_its_label():
    pass_at_k = script("pass_at_k")
    assert pass_at_k.solves(MATE, answer("d2d1")) and pass_at_k.solves(MATE, answer("d2b2"))
    assert not pass_at_k.solves(MATE, answer("d2c1"))
    assert pass_at_k.names_best(TRUTH, answer("a1b1"))
    assert not pass_at_k.names_best(TRUTH, answer("a1a2"))
    # legal moves of different labelled quality differ; an illegal one does not count
    assert pass_at_k.quality_differs(TRUTH, [answer("a1b1"), answer("a1a2")])
    assert not pass_at_k.quality_differs(TRUTH, [answer("a1b1"), answer("a1c3")])
    assert not pass_at_k.quality_differs(TRUTH, [answer("a1a2"), answer("a1a2")])


def test_seen_positions_scores_a_labelled_an_unlabelled_an_illegal_and_no_move():
    got = script("seen_positions").scores([TRUTH] * 4, ["a1b1", "a1b2", "a1c3", None])
    assert got == {"best": [1.0, 0.0, 0.0, 0.0], "quality": [1.0, 0.0, 0.0, 0.0],
                   "legal": [1.0, 1.0, 0.0, 0.0]}
    assert script("seen_positions").scores([TRUTH], ["a1a2"])["quality"] == [0.5]


def run(name: str, *args: str) -> str:
    return subprocess.run([sys.executable, str(LEVERS / f"{name}.py"), *args],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_seen_positions_writes_training_p_rows_and_measures_paired_changes(tmp_path):
    out = tmp_path / "seen.jsonl.gz"
    run("seen_positions", "write", str(out), "--n", "4")
    rows = [json.loads(line) for line in gzip.open(out, "rt")]
    train = {json.loads(line)["truth"]["fen"] for line in
             read_lines(Path(pkg_data("train.jsonl.gz")))}
    assert len(rows) == 4 and all(r["task"] == "P" and r["truth"]["fen"] in train
                                  for r in rows)
    first = out.read_bytes()
    run("seen_positions", "write", str(out), "--n", "4")
    assert out.read_bytes() == first  # the same draw, byte for byte, every time
    table = run("seen_positions", "measure", str(out), "shipped", "shipped").splitlines()
    change = next(line for line in table if line.startswith("| change against shipped"))
    assert [float(m) for m, _ in SHARE.findall(change)] == [0.0, 0.0, 0.0]  # greedy twice


@pytest.mark.slow
def test_pass_at_k_prints_a_row_per_prompt_set_and_temperature():
    table = run("pass_at_k", "shipped", "--positions", "6", "--k", "3",
                "--temperatures", "1.0")
    assert sum("3 at T=1.0" in line for line in table.splitlines()) == 2
    assert sum("| greedy |" in line for line in table.splitlines()) == 2
    assert "groups at T=1.0 whose legal B: moves differ" in table
