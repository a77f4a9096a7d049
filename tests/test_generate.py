"""The generator: config composes, output is deterministic (to the byte, across code
changes too), a re-run reuses its cache, and a kill, a full disk or a damaged cache loses
nothing."""

import errno
import gzip
import hashlib
import os
import resource
import signal
from pathlib import Path

import chess
import pytest
from hydra import compose, initialize_config_dir

from rookworld.data.generate import run
from rookworld.data.loaders import load_samples
from rookworld.data.select import only_move

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _cfg(out: Path, cache: Path, *extra: str):
    with initialize_config_dir(config_dir=CONF):
        return compose("generate", overrides=[
            f"out_dir={out}", f"cache_dir={cache}", "n_games=6", "workers=2", "progress=false",
            "engine.depth=2", "counts.train.P=24", "counts.train.A=30", "counts.eval.P=4",
            "counts.eval.A=4", "eval_fraction=0.2", *extra])


# sha256 of _cfg's train split as this generator writes it with Stockfish 15.1. A model
# card names a training file it does not ship by sha256 and generator command; while this
# small config still comes out byte for byte the same, the generator has not changed what
# it writes, and the command makes that file again.
TRAIN_SHA256 = "26bd85042a215c775bb14224c20b9e18c6c72c62707c8f336b93b528939c2bfd"


def test_config_composes():
    cfg = _cfg(Path("/tmp/x"), Path("/tmp/y"))
    assert cfg.engine.multipv == 5 and set(cfg.counts) == {"train", "eval"}
    assert sum(cfg.a_kinds.values()) == pytest.approx(1.0)
    assert sum(cfg.phase_shares.values()) == pytest.approx(1.0)


def test_the_guarded_folder_is_the_one_runs_read():
    from rookworld.config import pkg_data
    from rookworld.data.generate import SHIPPED_DATA

    assert SHIPPED_DATA == Path(pkg_data("train.jsonl.gz")).parent


@pytest.mark.usefixtures("stockfish")
def test_writing_over_the_shipped_splits_is_refused_unless_asked(tmp_path, monkeypatch):
    """The guard, pointed at a stand-in folder: refused before any game is played, and
    written when replace_shipped=true says so."""
    import rookworld.data.generate as generate
    from rookworld.errors import ConfigError

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(generate, "SHIPPED_DATA", shipped)
    with pytest.raises(ConfigError, match="out_dir=.*replace_shipped=true"):
        run(_cfg(shipped, tmp_path / "cache"))
    assert not list(shipped.iterdir()) and not (tmp_path / "cache").exists()
    run(_cfg(shipped, tmp_path / "cache", "replace_shipped=true"))
    assert {f.name for f in shipped.iterdir()} == {"train.jsonl.gz", "eval.jsonl.gz",
                                                  "DATA_CARD.md"}


def test_the_command_line_refuses_the_shipped_splits_with_a_message(tmp_path):
    """The real shipped folder, from the command line: exit 1 naming the key and the fix.
    Were the guard gone, the engine path that does not exist stops the run before it
    writes anything."""
    import subprocess
    import sys

    from rookworld.data.generate import SHIPPED_DATA

    before = {f.name: f.stat().st_mtime_ns for f in SHIPPED_DATA.iterdir()}
    out = subprocess.run(
        [sys.executable, "-m", "rookworld.data.generate", f"out_dir={SHIPPED_DATA}",
         f"cache_dir={tmp_path / 'cache'}", "n_games=1", "workers=1", "progress=false",
         f"engine.path={tmp_path / 'no-engine'}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 1 and "replace_shipped=true" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert {f.name: f.stat().st_mtime_ns for f in SHIPPED_DATA.iterdir()} == before


@pytest.mark.usefixtures("stockfish")
def test_deterministic_and_resumable(tmp_path):
    first = run(_cfg(tmp_path / "a", tmp_path / "cache_a"))
    run(_cfg(tmp_path / "b", tmp_path / "cache_b"))
    card = (tmp_path / "a" / "DATA_CARD.md").read_text()
    for name in ("train", "eval"):  # the card names each file by its checksum
        sha = hashlib.sha256((tmp_path / "a" / f"{name}.jsonl.gz").read_bytes()).hexdigest()
        assert f"- {name}.jsonl.gz: `{sha}`" in card
    for name in ("train.jsonl.gz", "eval.jsonl.gz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert first["timing"]["labelled"] == 28
    again = run(_cfg(tmp_path / "c", tmp_path / "cache_a"))
    assert again["timing"]["labelled"] == 0  # games and labels read back from the cache
    assert ((tmp_path / "a/train.jsonl.gz").read_bytes()
            == (tmp_path / "c/train.jsonl.gz").read_bytes())
    res = load_samples(tmp_path / "a/train.jsonl.gz")
    assert res.report.dropped == 0 and len([s for s in res.samples if s.task == "P"]) == 24
    if "stockfish 15.1 depth=2" not in card:
        pytest.skip("the recorded checksum is of Stockfish 15.1's moves and labels")
    assert hashlib.sha256((tmp_path / "a/train.jsonl.gz").read_bytes()).hexdigest() == TRAIN_SHA256


@pytest.mark.usefixtures("stockfish")
def test_interrupted_label_cache_resumes(tmp_path):
    run(_cfg(tmp_path / "a", tmp_path / "cache"))
    (labels,) = (tmp_path / "cache").glob("labels-*.jsonl")
    text = labels.read_text()
    labels.write_text(text[:-20])  # the last label cut mid-line, as by a kill
    again = run(_cfg(tmp_path / "b", tmp_path / "cache"))
    assert again["timing"]["labelled"] == 1
    assert ((tmp_path / "a/train.jsonl.gz").read_bytes()
            == (tmp_path / "b/train.jsonl.gz").read_bytes())
    # the label written after the cut starts on a line of its own: the cache is whole again
    assert run(_cfg(tmp_path / "c", tmp_path / "cache"))["timing"]["labelled"] == 0


@pytest.mark.usefixtures("stockfish")
def test_p_kinds_choose_positions_in_check_and_only_move_positions_by_their_share(tmp_path):
    kinds = ["p_kinds.check=0.25", "p_kinds.only_move=0.5", "only_move_gap=1.5"]
    run(_cfg(tmp_path / "a", tmp_path / "cache", *kinds))
    policy = [s for s in load_samples(tmp_path / "a/train.jsonl.gz").samples if s.task == "P"]
    assert len(policy) == 24
    by_kind = {k: [s for s in policy if s.meta.get("kind") == k] for k in ("check", "only_move")}
    assert len(by_kind["check"]) == 6 and len(by_kind["only_move"]) == 12
    assert all(chess.Board(s.truth.fen).is_check() for s in by_kind["check"])
    assert all(only_move(s.truth.evals, 1.5) for s in by_kind["only_move"])
    card = (tmp_path / "a" / "DATA_CARD.md").read_text()
    assert "P samples per kind of position" in card
    run(_cfg(tmp_path / "b", tmp_path / "cache_b", *kinds))  # deterministic, fresh cache
    assert (tmp_path / "a/train.jsonl.gz").read_bytes() == \
        (tmp_path / "b/train.jsonl.gz").read_bytes()


def test_only_move_needs_the_best_move_a_gap_ahead_of_the_second():
    assert only_move([0.2, 1.9, -3.0], 1.5) and not only_move([0.5, 1.9, -3.0], 1.5)
    assert not only_move([999.99], 0.5)  # one legal move: nothing to choose


def test_kind_shares_never_choose_more_positions_than_asked():
    import random

    from rookworld.chess_tasks.stockfish_pool import Analysis
    from rookworld.data.positions import Position
    from rookworld.data.select import policy_positions

    in_check = "4k3/8/8/8/8/8/4q3/4K3 w - - 0 1"
    quiet = [f"4k3/8/8/8/8/8/8/{row} w - - 0 1" for row in ("K7", "1K6", "2K5", "3K4")]
    fresh = [Position(f, "endgame", 0, i, (), "x") for i, f in enumerate([in_check, *quiet])]

    def labels_for(fens):  # every position an only-move one
        return {f: Analysis(("a", "b"), (2.0, 0.0), "test") for f in fens}

    for n in (3, 5):
        chosen, kinds = policy_positions(fresh, n, {"endgame": 1.0},
                                         {"check": 0.5, "only_move": 0.5}, 1.0, labels_for,
                                         random.Random(0))
        assert len(chosen) == n and len(kinds) <= n
        assert [kinds[p.key] for p in chosen if p.fen == in_check] == ["check"]


def test_kind_shares_and_multipv_are_checked_before_any_game_is_played(tmp_path):
    for bad, match in ((["p_kinds.check=0.8", "p_kinds.only_move=0.5"], "sum to <= 1"),
                       (["p_kinds.only_move=0.2", "only_move_gap=0"], "only_move_gap"),
                       (["p_kinds.only_move=0.2", "engine.multipv=1"], "multipv"),
                       (["engine.multipv=6"], r"multipv must lie in 1\.\.5"),
                       (["+p_kinds.pinned=0.1"], "unknown kind")):
        with pytest.raises(ValueError, match=match):
            run(_cfg(tmp_path / "x", tmp_path / "cache", *bad))
        assert not (tmp_path / "cache").exists()


def test_a_kind_shares_are_checked_before_any_game_is_played(tmp_path):
    """played is the rest of the A samples: a share other than 1 - the others is refused,
    as are shares outside [0, 1], the others summing past 1 and unknown kinds."""
    from rookworld.errors import ConfigError

    for bad, match in ((["a_kinds.played=0.1"], r"a_kinds\.played is the rest.*0\.76"),
                       (["a_kinds.illegal=0.2"], r"a_kinds\.played is the rest.*0\.66"),
                       (["a_kinds.illegal=0.9", "a_kinds.mate=0.5", "a_kinds.played=0"],
                        "sum to <= 1"),
                       (["a_kinds.illegal=-0.1", "a_kinds.played=0.96"], r"lie in \[0, 1\]"),
                       (["~a_kinds.played"], r"a_kinds\.played is the rest"),
                       (["+a_kinds.castle=0.1"], "unknown kind")):
        with pytest.raises(ConfigError, match=match):
            run(_cfg(tmp_path / "x", tmp_path / "cache", *bad))
        assert not (tmp_path / "cache").exists()


def test_a_kind_shares_that_sum_to_one_are_accepted():
    from rookworld.data.select import check_a_kinds

    check_a_kinds({"played": 0.66, "illegal": 0.2, "mate": 0.06, "draw": 0.06,
                   "seventyfive": 0.02})
    check_a_kinds({"played": 0, "illegal": 0.7, "mate": 0.2, "draw": 0.1})
    check_a_kinds({"played": 1})


def test_a_kinds_never_make_more_samples_than_asked():
    """Shares rounded up (3 x 0.5 -> 2, twice) stop at n; played fills what the others leave."""
    import random
    from collections import Counter

    from rookworld.data.positions import Position
    from rookworld.data.select import env_samples

    # the rook mates on the back rank (Ra8#) wherever the white king stands
    fens = [f"6k1/5ppp/8/8/8/8/8/R{row} w - - 0 1" for row in ("3K3", "4K2", "5K1", "6K")]
    positions = [Position(f, "endgame", 0, i, (), "a1a2") for i, f in enumerate(fens)]
    for n, kinds in ((3, {"illegal": 2, "mate": 1}), (5, {"illegal": 2, "mate": 2, "played": 1}),
                     (1, {"played": 1})):
        out = env_samples(positions, n, {"played": 0.0, "illegal": 0.5, "mate": 0.5},
                          {"endgame": 1.0}, random.Random(0))
        assert Counter(s.meta["kind"] for s in out) == kinds


# Faults (docs/reliability.md, "The data generator"): each test injects one.

class _Killed(BaseException):
    """A kill, simulated: raised where the process would die, and caught by nothing."""


def _files(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in folder.iterdir()}


def _splits(folder: Path) -> dict[str, bytes]:  # what the card holds besides differs per run
    return {n: (folder / n).read_bytes() for n in ("train.jsonl.gz", "eval.jsonl.gz")}


@pytest.mark.usefixtures("stockfish")
@pytest.mark.parametrize("damage", ["truncated", "garbage", "not games"])
def test_a_damaged_games_cache_is_named_played_again_and_replaced(tmp_path, capsys, damage):
    run(_cfg(tmp_path / "a", tmp_path / "cache"))
    (games,) = (tmp_path / "cache").glob("games-*.json.gz")
    whole = games.read_bytes()
    games.write_bytes({"truncated": whole[:len(whole) // 2],  # as a kill mid-write left it
                       "garbage": b"\x00" * 64,
                       "not games": gzip.compress(b'{"a": 1}')}[damage])
    capsys.readouterr()
    run(_cfg(tmp_path / "b", tmp_path / "cache"))
    assert f"games cache {games} is unreadable" in capsys.readouterr().out
    assert games.read_bytes() == whole
    assert _splits(tmp_path / "a") == _splits(tmp_path / "b")


@pytest.mark.usefixtures("stockfish")
def test_a_full_disk_while_the_games_cache_is_written_leaves_no_part_of_it(tmp_path,
                                                                          monkeypatch):
    """A real file size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as on a full
    disk) set once the games are played: a WriteError naming the cache file, and neither a
    part of it nor a temporary file left to break the next run."""
    import rookworld.data.generate as generate

    play, limits = generate.play_games, resource.getrlimit(resource.RLIMIT_FSIZE)

    def play_then_fill_the_disk(*args):
        games = play(*args)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, limits[1]))
        return games

    monkeypatch.setattr(generate, "play_games", play_then_fill_the_disk)
    on_xfsz = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
    try:
        with pytest.raises(generate.WriteError, match=r"games cache .*File too large"):
            run(_cfg(tmp_path / "a", tmp_path / "cache"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, on_xfsz)
    monkeypatch.undo()
    assert list((tmp_path / "cache").iterdir()) == [] and not (tmp_path / "a").exists()
    run(_cfg(tmp_path / "a", tmp_path / "cache"))
    assert {f.name for f in (tmp_path / "a").iterdir()} == {"train.jsonl.gz", "eval.jsonl.gz",
                                                           "DATA_CARD.md"}


@pytest.mark.usefixtures("stockfish")
def test_a_damaged_line_of_the_labels_cache_is_named_and_labelled_again(tmp_path, capsys):
    run(_cfg(tmp_path / "a", tmp_path / "cache"))
    (labels,) = (tmp_path / "cache").glob("labels-*.jsonl")
    lines = labels.read_bytes().splitlines(keepends=True)
    lines[3] = b"\xff\xfe\x00 not a label\n"  # not even UTF-8
    labels.write_bytes(b"".join(lines))
    capsys.readouterr()
    assert run(_cfg(tmp_path / "b", tmp_path / "cache"))["timing"]["labelled"] == 1
    assert "1 unreadable line(s) skipped" in capsys.readouterr().out
    assert _splits(tmp_path / "a") == _splits(tmp_path / "b")


@pytest.mark.usefixtures("stockfish")
def test_a_full_disk_while_labels_are_appended_is_named_and_a_rerun_labels_them(tmp_path,
                                                                               monkeypatch):
    import pathlib

    import rookworld.data.generate as generate

    open_ = pathlib.Path.open

    def open_on_a_full_disk(self, mode="r", *args, **kwargs):
        if self.name.startswith("labels-") and "a" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return open_(self, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", open_on_a_full_disk)
    with pytest.raises(generate.WriteError, match=r"labels cache .*No space left on device"):
        run(_cfg(tmp_path / "a", tmp_path / "cache"))
    monkeypatch.undo()
    assert not (tmp_path / "a").exists()
    assert run(_cfg(tmp_path / "a", tmp_path / "cache"))["timing"]["labelled"] == 28


@pytest.mark.usefixtures("stockfish")
@pytest.mark.parametrize("when", ["after the splits", "as the set moves in"])
def test_a_rerun_killed_while_writing_its_outputs_loses_nothing(tmp_path, monkeypatch, when):
    """A rerun with other counts killed while building its set leaves out_dir as it was;
    killed as its files move in, it leaves out_dir without DATA_CARD.md (the mark of an
    interrupted set), the previous card's notes kept aside; files of the user's are never
    touched, and a rerun then writes its own set whole, notes included."""
    import rookworld.data.card as card
    import rookworld.data.generate as generate

    out, cache, other = tmp_path / "data", tmp_path / "cache", "counts.train.A=20"
    run(_cfg(out, cache))
    (out / "README.txt").write_text("the user's")
    (out / "DATA_CARD.md").write_text((out / "DATA_CARD.md").read_text()
                                      + f"\n{card.NOTES}\nhand-written\n")
    before = _files(out)

    def killed(*args, **kwargs):
        raise _Killed

    if when == "after the splits":
        monkeypatch.setattr(generate, "write_card", killed)
    else:
        replace = os.replace

        def replace_or_die(src, dst):  # dies as the new eval split would move in
            if Path(dst) == out / "eval.jsonl.gz":
                raise _Killed
            return replace(src, dst)

        monkeypatch.setattr(os, "replace", replace_or_die)
    with pytest.raises(_Killed):
        run(_cfg(out, cache, other))
    monkeypatch.undo()
    if when == "as the set moves in":
        assert not (out / "DATA_CARD.md").exists()
        assert "hand-written" in (out / generate.MOVING).read_text()
        assert (out / "README.txt").read_text() == "the user's"
    else:
        assert _files(out) == before
    run(_cfg(out, cache, other))
    after = _files(out)
    assert after.keys() == before.keys() and after["README.txt"] == b"the user's"
    assert after["train.jsonl.gz"] != before["train.jsonl.gz"]
    assert "hand-written" in after["DATA_CARD.md"].decode()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["cache", "data"]


@pytest.mark.usefixtures("stockfish")
def test_a_full_disk_while_writing_the_outputs_ends_in_one_line_and_keeps_the_previous_set(
        tmp_path, monkeypatch):
    """The disk fills once the rerun's splits are written, as the card is: the command ends
    in one line naming out_dir, the OS error and the cache; out_dir keeps its files and
    nothing is left beside it."""
    import rookworld.data.generate as generate

    out, cache = tmp_path / "data", tmp_path / "cache"
    run(_cfg(out, cache))
    before = _files(out)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(generate, "write_card", disk_full)
    with pytest.raises(SystemExit) as stop:
        generate.main(_cfg(out, cache, "counts.train.A=20"))  # hydra passes a config through
    message = str(stop.value.code)
    assert message.startswith("rookworld: writing ") and "\n" not in message
    assert f"out_dir={out.resolve()}" in message and str(cache) in message
    assert "No space left on device" in message
    assert _files(out) == before
    assert sorted(f.name for f in tmp_path.iterdir()) == ["cache", "data"]
