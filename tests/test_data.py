"""Loaders, validation, splits and the bundled data."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import chess
import pytest

from rookworld.chess_tasks import env_sample, policy_sample
from rookworld.data.loaders import load_lines, load_samples
from rookworld.data.splits import position_key, split_of, split_samples
from rookworld.data.validate import check_env, check_policy

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "rookworld/assets/data"
ROOK_VAL = REPO.parent / "shared/data/rook_val_500.txt"
START = chess.STARTING_FEN
# a real line from rook_val_500 (Black to move, its B: is the LOWEST eval)
P_LINE = ("P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34" + " " * 36
          + "M: a4a3 c8f5 h7f6 h7g5 h7f8      E: -3.06 -2.82 -3.21 -3.16 -2.3            B: h7f6")
A_LINE = ("5R2/6R1/8/3P4/p7/1b2R2P/2p3P1/6K1 b - - 0 58+b3d5+e1e3 a2b3 f7f2 b5b4 g5g7 b4c3 "
          "f2f8 c3c2 d4d5 b3d5+5R2/6R1/8/3b4/p7/4R2P/2p3P1/6K1 w - - 0 59+0.001+0+0")


# --- validation -----------------------------------------------------------------

def test_check_policy_classes():
    assert check_policy(START, ("e2e4", "d2d4"), (0.3, 0.2), "e2e4") == []
    assert check_policy(START, ("e2e4", "d2d4"), (0.3, 0.2), "d2d4") == ["best_not_argmax"]
    assert check_policy(START, ("e2e4", "d2d4"), (0.3,), "e2e4") == ["eval_count"]
    assert check_policy(START, ("e2e5",), (0.3,), "e2e5") == ["illegal_move"]
    assert check_policy(START, (), (), "") == ["no_moves"]
    assert check_policy("not a fen", ("e2e4",), (0.1,), "e2e4") == ["bad_fen"]
    ep = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1"
    assert check_policy(ep, ("e7e5",), (0.0,), "e7e5") == ["fen_not_canonical"]
    nan, inf = float("nan"), float("inf")  # JSON reads NaN and Infinity
    assert check_policy(START, ("e2e4", "d2d4"), (nan, 0.2), "e2e4") == ["bad_eval"]
    assert check_policy(START, ("e2e4",), (inf,), "e2e4") == ["bad_eval"]
    six = ("e2e4", "d2d4", "g1f3", "c2c4", "b1c3", "g2g3")
    assert check_policy(START, six, (0.3, 0.2, 0.2, 0.1, 0.0, 0.0), "e2e4") == ["too_many_moves"]
    castle = "4k3/8/8/8/8/8/8/4K2R w K - 0 1"  # e1h1: the king taking its rook, not canonical
    assert check_policy(castle, ("e1g1",), (0.5,), "e1g1") == []
    assert check_policy(castle, ("e1h1",), (0.5,), "e1h1") == ["illegal_move"]
    # tied for the top eval: the sample's B: is the first listed, so a later one is relabelled
    assert check_policy(START, ("e2e4", "d2d4"), (0.3, 0.3), "d2d4") == ["best_not_argmax"]


def test_check_env_classes():
    s = env_sample(START, "e2e4")
    assert check_env(START, "e2e4", ("e2e4",), s.completion) == []
    assert check_env(START, "e2e4", ("d2d4",), s.completion) == ["bad_history"]
    wrong = s.completion.replace("+0.001+", "+1.0+")
    assert check_env(START, "e2e4", ("e2e4",), wrong) == ["a_completion_wrong"]


# --- text lines -----------------------------------------------------------------

def test_p_line_relabelled_from_argmax():
    res = load_lines([P_LINE], "x", on_defect="relabel")
    s = res.samples[0]
    assert s.truth.best == "h7f8"  # -2.3 is the highest of the five evals
    assert s.completion.endswith("B: h7f8")
    assert res.report.counts["best_not_argmax"] == 1 and res.report.relabelled == 1


def test_p_line_dropped_when_asked():
    with pytest.raises(ValueError, match="no usable rows"):
        load_lines([P_LINE], "x", on_defect="drop")


def test_a_lines_with_and_without_prefix():
    res = load_lines([A_LINE, "A: " + A_LINE], "x", json_rows=False)
    assert len(res.samples) == 2 and res.report.dropped == 0
    assert res.samples[0].prompt.startswith("A: 5R2/")
    assert res.samples[0].prompt + res.samples[0].completion == "A: " + A_LINE


def test_eval_count_mismatch_is_its_own_defect():
    short = P_LINE.replace("-3.16 -2.3", "-3.16")
    res = load_lines([short, A_LINE], "x", on_defect="relabel", json_rows=False)
    assert res.report.counts == {"eval_count": 1} and res.report.dropped == 1


def test_wrong_a_completion_counted_and_relabelled():
    bad = A_LINE.replace("+0.001+0+0", "+1.0+1+0")
    res = load_lines([bad], "x", on_defect="relabel", json_rows=False)
    assert res.report.counts["a_completion_wrong"] == 1
    assert res.samples[0].completion.endswith("+0.001+0+0")


def test_junk_rows_counted_not_raised():
    lines = [P_LINE.replace("B: h7f6", "B: h7f8"), "garbage", "P: 8/8 M: e2 E: x B:",
             "\x00\x01\ufffdjunk", "a+b", A_LINE + "+extra"]
    res = load_lines(lines, "x", json_rows=False)
    assert res.report.rows == 6 and len(res.samples) == 1
    assert res.report.counts["unparseable"] == 5


def test_worker_processes_give_the_serial_result(monkeypatch):
    import rookworld.data.loaders as loaders
    bad_a = A_LINE.replace("+0.001+0+0", "+1.0+1+0")
    lines = [P_LINE, "garbage", bad_a, A_LINE, P_LINE.replace("B: h7f6", "B: h7f8"), "a+b"] * 5
    monkeypatch.setattr(loaders, "PARALLEL_ROWS", 4)
    pools = []

    class CountedPool(loaders.ProcessPoolExecutor):
        def __init__(self, n, **kw):
            pools.append(n)
            super().__init__(n, **kw)

    monkeypatch.setattr(loaders, "ProcessPoolExecutor", CountedPool)
    monkeypatch.setattr(loaders, "_may_fork", lambda: True)  # other tests may leave threads
    for on_defect in ("drop", "relabel"):
        one = load_lines(lines, "x", on_defect, json_rows=False, workers=1)
        three = load_lines(lines, "x", on_defect, json_rows=False, workers=3)
        assert pools.pop() == 3 and not pools  # three workers ran, the serial load none
        assert three.samples == one.samples
        assert [s.meta["row"] for s in three.samples] == [s.meta["row"] for s in one.samples]
        assert three.report == one.report and three.report.rows == len(lines)


def test_a_process_with_other_threads_checks_in_process(monkeypatch):
    import threading

    import rookworld.data.loaders as loaders
    monkeypatch.setattr(loaders, "PARALLEL_ROWS", 4)
    monkeypatch.setattr(loaders, "ProcessPoolExecutor", None)  # any pool would fail
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    lines = [P_LINE, A_LINE] * 8
    try:
        res = load_lines(lines, "x", json_rows=False, workers=3)
    finally:
        stop.set()
        other.join()
    assert res.samples and res.samples == load_lines(lines, "x", json_rows=False,
                                                     workers=1).samples


def test_empty_and_binary_files_raise_clearly(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "junk.bin").write_bytes(bytes(range(256)) * 4)
    for name in ("empty.txt", "junk.bin"):
        with pytest.raises(ValueError, match="no usable rows"):
            load_samples(tmp_path / name)


def test_unknown_on_defect_rejected():
    with pytest.raises(ValueError, match="on_defect"):
        load_lines([A_LINE], "x", on_defect="ignore")


# --- JSON lines and datasets ---------------------------------------------------

def _rows(tmp_path, samples, name="d.jsonl.gz"):
    path = tmp_path / name
    text = "".join(json.dumps(s.to_json()) + "\n" for s in samples)
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    return path


def test_jsonl_round_trip(tmp_path):
    samples = [policy_sample(START, ["e2e4", "d2d4"], [0.3, 0.2], "t"), env_sample(START, "e2e4")]
    for name in ("d.jsonl", "d.jsonl.gz"):
        res = load_samples(_rows(tmp_path, samples, name))
        assert res.samples == samples and res.report.dropped == 0


def test_jsonl_tampered_text_is_caught(tmp_path):
    s = policy_sample(START, ["e2e4", "d2d4"], [0.3, 0.2], "t")
    row = s.to_json()
    row["completion"] = row["completion"].replace("B: e2e4", "B: d2d4")
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row) + "\n" + "{not json\n")
    res = load_samples(path, on_defect="relabel")
    assert res.report.counts["text_mismatch"] == 1 and res.report.counts["unparseable"] == 1
    assert res.samples == [s]


# --- the validated-data cache ------------------------------------------------------

def _counting_loads(monkeypatch):
    from rookworld.data import loaders
    calls = []

    def counted(*a, **k):
        calls.append(1)
        return load_lines(*a, **k)
    monkeypatch.setattr(loaders, "load_lines", counted)
    return calls


def test_a_file_is_validated_once_per_content(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOKWORLD_DATA_CACHE", str(tmp_path / "cache"))
    calls = _counting_loads(monkeypatch)
    samples = [policy_sample(START, ["e2e4", "d2d4"], [0.3, 0.2], "t"), env_sample(START, "e2e4")]
    path = _rows(tmp_path, samples)
    first, again = load_samples(path), load_samples(path)
    assert len(calls) == 1 and again.samples == first.samples == samples
    assert again.report.as_dict() == first.report.as_dict()
    load_samples(path, on_defect="relabel")  # other settings: their own entry
    _rows(tmp_path, samples[:1])  # new content under the same name
    assert load_samples(path).samples == samples[:1] and len(calls) == 3


def test_a_torn_cache_entry_is_validated_again_and_replaced(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROOKWORLD_DATA_CACHE", str(tmp_path / "cache"))
    samples = [env_sample(START, "e2e4")]
    path = _rows(tmp_path, samples)
    load_samples(path)
    [entry] = (tmp_path / "cache").glob("*.pkl")
    entry.write_bytes(entry.read_bytes()[:20])
    calls = _counting_loads(monkeypatch)
    assert load_samples(path).samples == samples and len(calls) == 1
    assert "unreadable" in capsys.readouterr().out
    assert load_samples(path).samples == samples and len(calls) == 1  # replaced whole


LOAD_SLOWLY = """
import sys, time
from pathlib import Path
from rookworld.data import loaders
real = loaders.load_lines
def slow(*a, **k):  # one line per validation, slow enough for the others to start meanwhile
    with open(sys.argv[2], "a") as f:
        f.write("validated\\n")
    time.sleep(2)
    return real(*a, **k)
loaders.load_lines = slow
print(len(loaders.load_samples(sys.argv[1]).samples))
"""


def test_processes_missing_the_same_entry_at_once_validate_it_once(tmp_path):
    samples = [policy_sample(START, ["e2e4", "d2d4"], [0.3, 0.2], "t"), env_sample(START, "e2e4")]
    path, log = _rows(tmp_path, samples), tmp_path / "validations.txt"
    env = {**os.environ, "ROOKWORLD_DATA_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", LOAD_SLOWLY, str(path), str(log)],
                              env=env, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["2"] * 3
    assert log.read_text().splitlines() == ["validated"]


def test_a_cache_that_cannot_be_written_costs_only_time(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ROOKWORLD_DATA_CACHE", str(tmp_path / "file" / "cache"))
    samples = [env_sample(START, "e2e4")]
    assert load_samples(_rows(tmp_path, samples)).samples == samples
    assert "could not cache the validated data" in capsys.readouterr().out
    monkeypatch.setenv("ROOKWORLD_DATA_CACHE", "off")
    calls = _counting_loads(monkeypatch)
    load_samples(_rows(tmp_path, samples)), load_samples(_rows(tmp_path, samples))
    assert len(calls) == 2


def test_local_dataset_directories(tmp_path):
    datasets = pytest.importorskip("datasets")
    lines = [P_LINE, "A: " + A_LINE]
    datasets.Dataset.from_dict({"text": lines}).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw/train.txt").write_text("\n".join(lines) + "\n")
    for d in ("saved", "raw"):
        res = load_samples(str(tmp_path / d), on_defect="relabel")
        assert [s.task for s in res.samples] == ["P", "A"], d


# --- splits ---------------------------------------------------------------------

def test_split_ignores_move_counters():
    a = "8/8/8/8/8/8/k7/K7 w - - 0 1"
    b = "8/8/8/8/8/8/k7/K7 w - - 12 40"
    assert position_key(a) == position_key(b)
    assert all(split_of(a, f) == split_of(b, f) for f in (0.1, 0.5, 0.9))


def test_split_fraction_and_disjoint():
    board, samples = chess.Board(), []
    for i in range(400):
        if board.is_game_over():
            board = chess.Board()
        board.push(sorted(board.legal_moves, key=lambda m: (i * 7919 + m.to_square) % 31)[0])
        samples.append(env_sample(board.fen(), "a1a1"))
    parts = split_samples(samples, 0.25)
    keys = {k: {position_key(s.truth.fen) for s in v} for k, v in parts.items()}
    assert not keys["train"] & keys["eval"]
    assert 0.1 < len(parts["eval"]) / len(samples) < 0.4


# --- bundled and external data ---------------------------------------------------

@pytest.mark.skipif(not ROOK_VAL.exists(), reason="shared/data/rook_val_500.txt absent")
def test_rook_val_500_loads_as_external_eval():
    res = load_samples(ROOK_VAL, on_defect="relabel", tasks="P")
    r = res.report
    assert r.rows == 500 and r.counts["unparseable"] == 0 and len(res.samples) == 500
    assert 200 <= r.counts["best_not_argmax"] < 300
    assert all(s.truth.evals[s.truth.moves.index(s.truth.best)] == max(s.truth.evals)
               for s in res.samples)
    assert len(load_samples(ROOK_VAL, on_defect="drop").samples) < 300


def _keys(path: Path) -> set[str]:
    with gzip.open(path, "rt") as fh:
        return {position_key(json.loads(line)["truth"]["fen"]) for line in fh}


@pytest.mark.skipif(not (ASSETS / "train.jsonl.gz").exists(), reason="not generated")
def test_bundled_splits_disjoint_and_eval_clean():
    assert not _keys(ASSETS / "train.jsonl.gz") & _keys(ASSETS / "eval.jsonl.gz")
    res = load_samples(ASSETS / "eval.jsonl.gz")
    assert res.report.dropped == 0 and not res.report.counts, res.report.summary()
    assert [sum(s.task == t for s in res.samples) for t in "PA"] == [1000, 1000]


@pytest.mark.slow
@pytest.mark.skipif(not (ASSETS / "train.jsonl.gz").exists(), reason="not generated")
def test_bundled_train_clean_with_every_oracle_outcome():
    res = load_samples(ASSETS / "train.jsonl.gz")
    assert res.report.dropped == 0 and not res.report.counts, res.report.summary()
    assert [sum(s.task == t for s in res.samples) for t in "PA"] == [40000, 60000]
    rewards = {s.truth.reward for s in res.samples if s.task == "A"}
    assert rewards == {"0.001", "1.0", "0.5", "-1.0"}
