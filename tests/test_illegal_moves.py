"""The embedded-baseline experiment's sorting of illegal best moves: one position per kind."""

import pytest


@pytest.fixture(scope="module")
def script(experiment_script):
    return experiment_script("embedded_baseline/illegal_moves.py")


START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
PIN = "4k3/4r3/8/8/8/8/4B3/4K3 w - - 0 1"  # the white bishop on e2 is pinned to its king


@pytest.mark.parametrize("fen, best, kind", [
    (START, "e2e4", "legal"),
    (START, "e4e5", "not the mover's piece"),  # an empty square
    (START, "e7e5", "not the mover's piece"),  # Black's pawn, White to move
    (START, "f1c4", "not a move of that piece"),  # a blocked diagonal
    (START, "e1g1", "not a move of that piece"),  # castling through pieces
    ("4k3/8/8/8/8/8/3r4/4K3 w - - 0 1", "e1e2", "king steps into check"),
    (PIN, "e2d3", "moves a pinned piece"),
    ("4k3/8/8/8/8/8/8/R3K2r w - - 0 1", "a1a2", "does not answer a check"),
    (START, "", "no best move"),
    (START, "e2", "no best move"),
])
def test_each_best_move_is_sorted_into_its_kind(script, fen, best, kind):
    assert script.kind(fen, best) == kind


@pytest.mark.parametrize("fen, kind", [
    ("4k3/8/8/8/8/8/8/R3K2r w - - 0 1", "in check"),
    ("7k/8/8/8/8/8/6PP/7K w - - 0 1", "not in check, <= 5 legal moves"),  # g3 g4 h3 h4 Kg1
    (START, "the rest"),
])
def test_each_position_is_sorted_into_its_kind(script, fen, kind):
    assert script.position(fen) == kind


def test_the_script_prints_kinds_positions_and_what_a_group_holds(script, monkeypatch, capsys):
    """The shipped model on 4 held-out P samples, 2 sampled completions each: every table
    accounts for the 4 positions."""
    monkeypatch.setattr("sys.argv", ["illegal_moves.py", "--samples", "4", "--group", "2"])
    script.main()
    lines = capsys.readouterr().out.splitlines()
    kinds = [line for line in lines if line.split(" | ")[0][2:] in script.KINDS]
    assert sum(int(line.split(" | ")[1].rstrip(" |")) for line in kinds) == 4
    rows = [line for line in lines if line.split(" | ")[0][2:] in script.POSITIONS]
    assert len(rows) == 2 * len(script.POSITIONS)
    assert sum(int(r.split(" | ")[1].split(" / ")[1].rstrip(" |")) for r in rows[:3]) == 4
    assert sum(int(r.split(" | ")[1].split("; ")[1].split(" / ")[1].rstrip(" |"))
               for r in rows[3:]) == 4


def test_data_names_the_file_whose_p_samples_are_sorted(script, monkeypatch, capsys,
                                                         tmp_path):
    """--data: a file of 3 P samples (and one A) gives tables over those 3 positions, not
    over the held-out split's --samples."""
    import gzip
    import json

    from rookworld.config import pkg_data

    rows = [json.loads(line) for line in gzip.open(pkg_data("eval.jsonl.gz"), "rt")]
    picked = [r for r in rows if r["task"] == "P"][:3] + [r for r in rows if r["task"] == "A"][:1]
    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in picked))
    monkeypatch.setattr("sys.argv", ["illegal_moves.py", "--samples", "10", "--data", str(data)])
    script.main()
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.split(" | ")[0][2:] in script.POSITIONS]
    assert sum(int(r.split(" | ")[1].split(" / ")[1].rstrip(" |")) for r in rows) == 3
