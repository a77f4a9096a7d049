"""The strength suite end to end on the shipped model, centipawn loss against a real
Stockfish, and the suite inside training's before/after table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import chess
import pytest
from test_strength_games import alive

from rookworld.held_out import before_after_table, paired_se
from rookworld.policy import load_embedded
from rookworld.sampling import per_task_settings
from rookworld.strength import StrengthSuite, SuiteSettings, common_changes
from rookworld.strength.acpl import CAP, centipawn_loss, clip_cp, move_losses
from rookworld.strength.player import ModelPlayer

ASSETS = Path(__file__).resolve().parents[1] / "rookworld" / "assets" / "strength"


def small(**over) -> SuiteSettings:
    base = dict(puzzles_file=str(ASSETS / "lichess_puzzles.csv"),
                openings_file=str(ASSETS / "openings.txt"), puzzles=6, random_games=2,
                engine_games=0, selfplay_games=2, acpl_positions=4, max_plies=12,
                progress=False)
    return SuiteSettings(**(base | over))


def test_centipawn_loss_by_hand():
    assert centipawn_loss(1.5, -2.0) == 350  # a blunder
    assert centipawn_loss(0.3, 0.3) == 0 and centipawn_loss(0.2, 0.5) == 0  # never negative
    assert clip_cp(999.99) == CAP and clip_cp(-999.99) == -CAP
    assert centipawn_loss(999.99, 0.5) == CAP - 50  # a missed mate against an even game
    assert centipawn_loss(999.99, -999.99) == 2 * CAP  # the most a position can cost


def test_move_losses_against_stockfish_best_free_blunder_and_illegal(engine_pool):
    # queen against bishop: Qd1-f3 walks onto the bishop's diagonal and is taken
    fen = "4k3/1b6/8/8/8/8/8/3QK3 w - - 0 1"
    pool = engine_pool(processes=1, depth=8, multipv=1)
    best = pool.analyse(fen).moves[0]
    losses = move_losses(pool, [fen, fen, fen, fen], [best, "d1f3", "e1e3", None])
    assert losses[0].loss == 0 and not losses[0].blunder
    assert losses[1].loss >= 300 and losses[1].blunder
    assert losses[2].loss is None and losses[3].loss is None  # illegal, missing
    # the best move is scored as the played one is, by a search of the position after it
    assert losses[1].loss == centipawn_loss(pool.evaluate_after(fen, best),
                                            pool.evaluate_after(fen, "d1f3"))


def test_settings_refuse_bad_values_naming_the_key():
    with pytest.raises(ValueError, match="strength.modes"):
        small(modes=["greedy"])
    with pytest.raises(ValueError, match="strength.random_games"):
        small(random_games=-1)
    assert not small(puzzles=0, random_games=0, selfplay_games=0, acpl_positions=0).enabled


@pytest.mark.usefixtures("stockfish")
def test_the_suite_measures_the_shipped_model_in_both_modes_and_ends_its_engines(tmp_path):
    policy = load_embedded()
    p_settings = per_task_settings()["P"]
    fens = ["rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
            "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
            "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1", "6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1"]
    suite = StrengthSuite(small(), fens, tmp_path)
    metrics, values, text = suite(policy, p_settings, label="shipped")
    pids = suite.pool().pids()
    suite.close()
    assert not any(alive(p) for p in pids)
    for mode in ("", "_masked"):
        for name in ("puzzles_first", "puzzles_line", "puzzles_illegal", "random_score",
                     "random_illegal_loss", "selfplay_plies", "acpl_illegal"):
            key = f"eval/strength/{name}{mode}"
            assert key in metrics and f"eval_se/strength/{name}{mode}" in metrics
            assert 0 <= metrics[key] <= (12 if "plies" in name else 1)
        assert len(values[f"eval/strength/puzzles_first{mode}"]) == 6
        assert len(values[f"eval/strength/random_score{mode}"]) == 2
        assert metrics[f"eval_n/strength/puzzles_first{mode}"] == 6
        assert metrics[f"eval_n/strength/random_score{mode}"] == 2
    # the mask takes illegal B: moves out (an answer without a B: field stays unparseable)
    assert (metrics["eval/strength/puzzles_illegal_masked"]
            <= metrics["eval/strength/puzzles_illegal"])
    assert metrics["eval/strength/puzzles_illegal_masked"] < 1  # the player reads its moves
    assert "## free" in text and "## mask" in text and "Wilson" in text
    d = tmp_path / "shipped"
    assert {p.name for p in d.iterdir()} >= {
        "strength.md", "strength.json", "games_random_free.pgn", "games_random_mask.pgn",
        "games_selfplay_free.pgn", "games_selfplay_mask.pgn"}
    report = json.loads((d / "strength.json").read_text())
    assert len(report["free"]["puzzles"]["rows"]) == 6


@pytest.mark.usefixtures("stockfish")
def test_empty_measures_are_left_out_and_unaligned_ones_are_not_paired(tmp_path):
    """A model with no legal answer has no centipawn loss (not a perfect 0); the loss of
    legal answers only is never paired between two evaluations."""
    policy = load_embedded()
    suite = StrengthSuite(small(puzzles=0, random_games=0, selfplay_games=0, acpl_positions=2,
                                modes=["free"]), ["8/8/8/8/8/8/8/K6k w - - 0 1"] * 2)
    with suite:
        metrics, values, _ = suite(policy, per_task_settings(max_new_tokens=2)["P"])
    assert "eval/strength/acpl" not in metrics and "eval/strength/blunder" not in metrics
    assert metrics["eval/strength/acpl_illegal"] == 1.0
    assert "eval/strength/acpl_illegal" in values
    assert values["eval/strength/acpl_by_position"] == [None, None]
    assert common_changes(values, values) == {}  # no position with two legal answers


def test_the_loss_change_is_paired_on_the_positions_both_models_answered_legally():
    before = {"eval/strength/acpl_by_position": [100.0, None, 50.0, 0.0, 300.0],
              "eval/strength/acpl_by_position_masked": [10.0, 20.0],
              "eval/strength/puzzles_first": [1.0, 0.0]}
    after = {"eval/strength/acpl_by_position": [40.0, 500.0, 50.0, None, 200.0],
             "eval/strength/acpl_by_position_masked": [10.0]}  # not the same positions
    out = common_changes(before, after)
    # positions 0, 2, 4: changes -60, 0, -100; mean -53.33, sd 50.33, se 29.06
    assert set(out) == {"eval/strength/acpl_both_legal_change",
                        "eval_se/strength/acpl_both_legal_change",
                        "eval_n/strength/acpl_both_legal_change"}
    assert out["eval/strength/acpl_both_legal_change"] == pytest.approx(-160 / 3)
    assert out["eval_se/strength/acpl_both_legal_change"] == pytest.approx(29.059, abs=1e-3)
    assert out["eval_n/strength/acpl_both_legal_change"] == 3
    # the per-position losses are no metric's samples: the ordinary paired interval leaves
    # them alone, gaps or none
    assert paired_se(before, after) == {}
    assert paired_se(before, {"eval/strength/acpl_by_position_masked": [5.0, 20.0]}) == {}
    first = {"eval/strength/acpl": 112.5, "eval_se/strength/acpl": 60.0}
    last = {"eval/strength/acpl": 197.5, "eval_se/strength/acpl": 100.0} | out
    rows = before_after_table(first, last).splitlines()
    # three positions: Student's t with 2 degrees of freedom, 4.303 x 29.059
    assert "| eval/strength/acpl_both_legal_change | | | -53.333 ± 125.042 |" in rows
    assert any(r.startswith("| eval/strength/acpl | 112.500") for r in rows)


def test_a_sampled_measure_repeats_for_its_seed_whatever_the_measures_before_it(tmp_path):
    """At a temperature above 0 each measure's player is seeded anew: self-play's games are
    the same whether or not games against the random mover drew from a player first."""
    policy, games = load_embedded(), []
    for random_games in (0, 2):
        out = tmp_path / str(random_games)
        suite = StrengthSuite(small(puzzles=0, acpl_positions=0, random_games=random_games,
                                    modes=["free"], temperature=1.0, seed=3), [], out)
        with suite:
            suite(policy, per_task_settings()["P"], label="m")
        report = json.loads((out / "m" / "strength.json").read_text())
        games.append(report["free"]["games"]["selfplay"]["games"])
    assert games[0] == games[1]
    assert (tmp_path / "0" / "m" / "games_selfplay_free.pgn").read_text() == \
        (tmp_path / "2" / "m" / "games_selfplay_free.pgn").read_text()


def test_the_greedy_player_is_deterministic_and_reads_the_b_move():
    policy = load_embedded()
    player = ModelPlayer(policy, per_task_settings()["P"])
    fens = [chess.STARTING_FEN, "8/8/8/4k3/8/8/4P3/4K3 w - - 0 1"]
    first = player.answers(fens)
    assert [a.move for a in first] == player(fens)
    assert any(a.move for a in first)
    assert all(a.move is None or a.move == a.text.split("B:")[1].split()[0] for a in first)
    # under the legal-move mask every answer is a legal move of its position, even with a
    # sampler that sets a least number of new tokens (the constraint needs none)
    masked = ModelPlayer(policy, replace(per_task_settings()["P"], min_new_tokens=5), "mask")
    moves = masked(fens)
    assert all(m is not None and chess.Move.from_uci(m) in chess.Board(f).legal_moves
               for f, m in zip(fens, moves))


@pytest.mark.slow
@pytest.mark.usefixtures("stockfish")
def test_training_carries_strength_into_its_before_after_table(tmp_path, tiny_overrides):
    import subprocess
    import sys

    over = [o for o in tiny_overrides if o != "strength=none"] + [
        "strength=fast", "strength.puzzles=6", "strength.random_games=2",
        "strength.selfplay_games=2", "strength.acpl_positions=4", "strength.max_plies=8",
        "steps=1", f"hydra.run.dir={tmp_path}/run"]
    r = subprocess.run([sys.executable, "-m", "rookworld.train", *over], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    table = (tmp_path / "run" / "eval_before_after.md").read_text()
    row = next(line for line in table.splitlines()
               if line.startswith("| eval/strength/puzzles_first |"))
    assert row.count("±") == 3  # before, after, and the paired change
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in rows if "eval/strength/random_score" in x]
    assert [x["step"] for x in evals] == [-1, 0]
    assert "eval_dse/strength/puzzles_first" in evals[-1]
    assert (tmp_path / "run" / "strength" / "step-1" / "games_random_free.pgn").exists()
    # each evaluation keeps every position's loss (None where illegal), paired at the end
    samples = [json.loads(x)["values"]
               for x in (tmp_path / "run" / "eval_samples.jsonl").read_text().splitlines()]
    assert [len(v["eval/strength/acpl_by_position"]) for v in samples] == [4, 4]
    both = [i for i in range(4) if all(v["eval/strength/acpl_by_position"][i] is not None
                                       for v in samples)]
    assert ("eval/strength/acpl_both_legal_change" in evals[-1]) == bool(both)
