"""The model card's playing-strength sections: intervals honest at 0 of n, and the command
that writes a strength evaluation, or a strength curve, into a card."""

import json

import pytest

from rookworld.model_card import (
    main,
    replace_section,
    replace_strength_section,
    strength_curve_section,
    strength_section,
)

METRICS = {"eval/strength/random_score": 0.0, "eval_se/strength/random_score": 0.0,
           "eval_n/strength/random_score": 40,
           "eval/strength/puzzles_first": 0.053, "eval_se/strength/puzzles_first": 0.00709,
           "eval_n/strength/puzzles_first": 1000,
           "eval/strength/acpl": 170.8, "eval_se/strength/acpl": 13.0,
           "eval_n/strength/acpl": 365,
           "eval/strength/selfplay_plies_median_masked": 30.0}
CARD = "# model\n\nintro\n\n## Greedy metrics\n\nx\n\n## Compute curve\n\ncurve\n"


def test_shares_carry_wilson_intervals_and_means_a_standard_error():
    text = strength_section(METRICS, "Measured here.")
    rows = {r.split(" | ")[0].strip("| "): r for r in text.splitlines() if r.startswith("| ")}
    assert "0.000 [0.000, 0.088]" in rows["random_score"]  # not "± 0.000" at 0 of 40
    assert "0.053 [0.041, 0.069]" in rows["puzzles_first"]
    assert "170.800 ± 25.565" in rows["acpl"]  # t with 364 degrees of freedom: 1.9666
    assert rows["selfplay_plies_median"].endswith("| - | 30.000 |")
    assert text.startswith("Measured here.")


def test_a_section_is_inserted_once_then_replaced():
    first = replace_strength_section(CARD, "old figures")
    assert first.index("## Playing strength") < first.index("## Compute curve")
    second = replace_strength_section(first, "new figures")
    assert second.count("## Playing strength") == 1 and "old figures" not in second
    assert second.endswith("## Compute curve\n\ncurve\n") and "## Greedy metrics" in second
    with pytest.raises(ValueError, match="Compute curve"):
        replace_strength_section("# a card without sections\n", "figures")


def test_the_command_writes_an_evaluation_into_a_card_or_names_what_is_missing(tmp_path):
    card, evaluation = tmp_path / "MODEL_CARD.md", tmp_path / "shipped.json"
    card.write_text(CARD)
    evaluation.write_text(json.dumps({"strength": METRICS, "per_sample": {}}))
    main([str(evaluation), "--card", str(card), "--source", "Full suite, commit abc."])
    text = card.read_text()
    assert "Full suite, commit abc." in text and "0.000 [0.000, 0.088]" in text
    task_only = tmp_path / "task_only.json"
    task_only.write_text(json.dumps({"eval/P/format": 1.0}))
    with pytest.raises(SystemExit, match="holds no strength evaluation"):
        main([str(task_only), "--card", str(card), "--source", "x"])
    assert card.read_text() == text
    with pytest.raises(SystemExit, match="no such file|No such file"):
        main([str(tmp_path / "shipped.json"), "--card", str(tmp_path / "none.md"),
              "--source", "x"])


def _row(step: int, first: float, n: int = 100) -> dict:
    return {"step": step, "samples": step * 32, "train_minutes": step / 40,
            "eval/P/best_legal": 0.3, "eval_se/P/best_legal": 0.03,
            "eval/strength/puzzles_first": first, "eval_se/strength/puzzles_first": 0.0,
            "eval_n/strength/puzzles_first": n,
            "eval/strength/selfplay_plies": 2.5, "eval_se/strength/selfplay_plies": 0.5,
            "eval_n/strength/selfplay_plies": 4}


def test_a_strength_curve_gives_each_point_its_measures_with_intervals():
    rows = [_row(500, 0.0), _row(1000, 0.05) | {"stage": "shipped"}]
    table = [r for r in strength_curve_section(rows, "From scratch.").splitlines()
             if r.startswith("| ")]
    assert "puzzles_first" in table[0] and "selfplay_plies" in table[0]
    assert "acpl" not in table[0]  # no row carries it
    assert "0.000 [0.000, 0.037]" in table[1]  # Wilson at 0 of 100, not ± 0.000
    # the self-play mean over 4 games: t 3.18 x its standard error 0.5
    assert table[2].startswith("| shipped | 1000 | 32,000 |") and "2.500 ± 1.591" in table[2]


def test_a_section_is_found_by_its_whole_heading_line():
    card = replace_section(CARD, "## Playing strength against compute", "curve rows")
    card = replace_strength_section(card, "figures")
    assert card.count("curve rows") == 1 and card.count("figures") == 1
    card = replace_section(card, "## Playing strength against compute", "new rows")
    assert "curve rows" not in card and card.count("figures") == 1
    assert max(card.index("figures"), card.index("new rows")) < card.index("## Compute curve")


def test_the_command_writes_a_strength_curve_or_names_what_is_missing(tmp_path):
    card, curve = tmp_path / "MODEL_CARD.md", tmp_path / "curve.jsonl"
    card.write_text(CARD)
    curve.write_text("".join(json.dumps(_row(s, 0.01 * s / 500)) + "\n" for s in (500, 1000)))
    main(["--curve", str(curve), "--card", str(card), "--source", "From scratch, commit abc."])
    text = card.read_text()
    assert "## Strength against pretraining compute\n\nFrom scratch, commit abc." in text
    assert "| 1 | 1000 | 32,000 |" in text
    curve.write_text('{"step": 1}\n')
    with pytest.raises(SystemExit, match="every row needs step, samples and train_minutes"):
        main(["--curve", str(curve), "--card", str(card), "--source", "x"])
    with pytest.raises(SystemExit):  # an evaluation and a curve at once
        main([str(curve), "--curve", str(curve), "--card", str(card), "--source", "x"])
    assert card.read_text() == text


@pytest.mark.parametrize("per_task, words", [(0, "(the held-out split, and"),
                                             (3, "(the held-out split's first 3 samples")])
def test_the_card_names_the_evaluation_that_measures_its_figures_again(per_task, words):
    from types import SimpleNamespace

    from transformers import GPT2Config

    from rookworld.model_card import model_card
    stage = {"stage": 1, "start": "random weights", "steps": 2, "samples": 8, "minutes": 1.0,
             "command": "python -m rookworld.pretrain", "data": None, "commit": "abc1234"}
    card = model_card(SimpleNamespace(curve_per_task=1, steps=2,
                                      data=SimpleNamespace(eval_per_task=per_task)),
                      GPT2Config(vocab_size=50, n_positions=40, n_embd=32, n_layer=2, n_head=2),
                      {"eval": {"held_out": {}}, "parameters": 1000},
                      {"stages": [stage], "curve": []})
    assert ("`python -m rookworld.evaluate model.path=<this directory> "
            f"data.eval_per_task={per_task}` {words}") in card
    assert "not measured (`data.external_eval` unset, or its file absent)" in card

