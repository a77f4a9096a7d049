"""rookworld.episodes: games as episodes (task_mix=games): how games end, the advantages
per game and per move against a hand computation, the A task's oracle, and a run that
trains, checkpoints and resumes exactly."""

import math
from types import SimpleNamespace

import chess
import pytest
from test_faults import assert_same_run, comparable, crash_at, one_thread  # noqa: F401

from rookworld.config import compose
from rookworld.episodes import Game, Games, episode_advantages, episode_metrics, play_games
from rookworld.rewards.continuous import ContinuousReward
from rookworld.train import resolve_resume, run

START = chess.STARTING_FEN
MATE_IN_1 = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # a1a8 mates
STALEMATE_IN_1 = "7k/8/6K1/8/8/8/5Q2/8 w - - 0 1"  # f2f7 stalemates


class ScriptedEngine:
    """The parts of GRPOEngine that `play` uses, answering from a script: P prompts by
    position (a FEN -> completion, default an illegal move), A prompts by a function."""

    def __init__(self, answers: dict, env_answer=None, group: int = 2):
        self.answers, self.env_answer, self.G = answers, env_answer, group
        self.settings = SimpleNamespace(seed=0)
        self.policy = SimpleNamespace(decode_completions=lambda ids, mask: ids)
        reward = ContinuousReward()
        self.reward = SimpleNamespace(at=lambda step: reward)
        self.prompts = []

    def sample_prompts(self, prompts, task, step, salt):
        self.prompts += prompts
        if task == "A":
            return SimpleNamespace(completion_ids=[self.env_answer(p) for p in prompts],
                                   completion_mask=None)
        fens = [p.removeprefix("P: ").strip() for p in prompts]
        return SimpleNamespace(completion_ids=[self.answers.get(f, " M: a1a1  E: 0.1  B: a1a1")
                                               for f in fens], completion_mask=None)


def answer(move: str) -> str:
    return f" M: {move}  E: 0.5  B: {move}"


def ended(engine, fen: str, **settings) -> list[Game]:
    return play_games(engine, [fen], 0, Games(**settings)).games


def test_games_end_at_mate_stalemate_an_illegal_or_no_move_and_the_ply_limit():
    mate = ended(ScriptedEngine({MATE_IN_1: answer("a1a8")}), MATE_IN_1)
    assert {(g.result, g.termination) for g in mate} == {("1-0", "checkmate")}
    stale = ended(ScriptedEngine({STALEMATE_IN_1: answer("f2f7")}), STALEMATE_IN_1)
    assert {(g.result, g.termination) for g in stale} == {("1/2-1/2", "stalemate")}
    illegal = ended(ScriptedEngine({}), START)  # the default answer a1a1 is illegal
    assert {(g.result, g.termination, g.offender) for g in illegal} == {
        ("0-1", "illegal move", chess.WHITE)}
    none = ended(ScriptedEngine({START: " M: e2e4  E: 0.3"}), START)  # no B: field
    assert {g.termination for g in none} == {"no move"}
    after_e4 = chess.Board()
    after_e4.push_uci("e2e4")
    limited = ended(ScriptedEngine({START: answer("e2e4"), after_e4.fen(): answer("e7e5")}),
                    START, max_plies=2)
    assert {(g.result, g.termination) for g in limited} == {("1/2-1/2", "ply limit")}
    assert all(len(g.board.move_stack) == 2 and len(g.moves) == 2 for g in limited)


def test_the_ending_shares_tell_an_illegal_move_from_a_missing_one():
    illegal = play_games(ScriptedEngine({}), [START], 0, Games())
    none = play_games(ScriptedEngine({START: " M: e2e4  E: 0.3"}), [START], 0, Games())
    assert {k: v for k, v in episode_metrics(illegal.games, illegal.rows).items()
            if k.endswith("end_share")} == {"games/illegal_end_share": 1.0,
                                            "games/no_move_end_share": 0.0}
    assert {k: v for k, v in episode_metrics(none.games, none.rows).items()
            if k.endswith("end_share")} == {"games/illegal_end_share": 0.0,
                                            "games/no_move_end_share": 1.0}


def test_against_the_random_mover_the_model_plays_one_side_per_game():
    engine = ScriptedEngine({START: answer("e2e4")}, group=2)
    games = ended(engine, START, opponent="random", max_plies=4)
    assert [g.model_colour for g in games] == [chess.WHITE, chess.BLACK]
    for g in games:  # every row the model wrote is its own colour's move
        assert {c for _, c, _ in g.moves} == {g.model_colour}


def hand_games() -> list[Game]:
    """Two self-play games of one group. Game 0: white mates (rows 0, 2 white; 1 black,
    all legal). Game 1: white plays row 3 (legal), black row 4 illegal."""
    a = Game(0, chess.Board(), None, [(0, chess.WHITE, True), (1, chess.BLACK, True),
                                     (2, chess.WHITE, True)], result="1-0",
             termination="checkmate")
    b = Game(0, chess.Board(), None, [(3, chess.WHITE, True), (4, chess.BLACK, False)],
             result="1-0", termination="illegal move", offender=chess.BLACK)
    return [a, b]


def test_advantages_per_game_and_per_move_match_a_hand_computation():
    r = 1 / math.sqrt(2)  # (x - mean) / std of two values, unbiased std
    # white: results [win 1, draw 0] (black's illegal move is no win for white) -> [r, -r];
    # its moves all legal -> 0. black: results [loss, loss] -> 0; moves [legal, illegal]
    # -> [r, -r], times move_weight 0.5
    adv = episode_advantages(hand_games(), 5, {}, Games(move_weight=0.5))
    want = [r, 0.5 * r, r, -r, -0.5 * r]
    assert adv.tolist() == pytest.approx(want, abs=1e-6)
    # discount 0.5: white's first move in game 0 has one later white move
    adv = episode_advantages(hand_games(), 5, {}, Games(move_weight=0.0, discount=0.5))
    assert adv.tolist() == pytest.approx([0.5 * r, 0.0, r, -r, 0.0], abs=1e-6)
    # all games alike: no advantage
    same = [hand_games()[0], hand_games()[0]]
    assert episode_advantages(same, 5, {}, Games(move_weight=0.0)).abs().sum() == 0


def test_a_wrong_a_prediction_scores_low_and_the_game_goes_on_from_the_oracle():
    after = chess.Board()
    after.push_uci("e2e4")
    wrong = "8/8/8/8/8/8/8/8 w - - 0 1+0.001+0+0"  # an empty board: the wrong next state

    def env(prompt):
        return wrong if prompt.startswith("A: " + START) else \
            after.fen() + "+0.001+0+0"

    engine = ScriptedEngine({START: answer("e2e4"), after.fen(): answer("e7e5")}, env)
    games = ended(engine, START, env="model", max_plies=2)
    a_prompts = [p for p in engine.prompts if p.startswith("A: ")]
    assert a_prompts[0].startswith("A: " + START + "+e2e4+e2e4+")
    # the next P prompt is the oracle's position, not the model's empty board
    assert any(p.startswith("P: " + after.fen()) for p in engine.prompts)
    g = games[0]
    assert len(g.env_rows) == 2 and len(g.board.move_stack) == 2
    reward = ContinuousReward()
    from rookworld.chess_tasks import env_sample
    first = env_sample(START, "e2e4", ["e2e4"])
    right = env_sample(after.fen(), "e7e5", ["e2e4", "e7e5"])
    assert reward(first, wrong).score < reward(right, right.completion).score


def test_settings_are_checked():
    for bad in ({"opponent": "stockfish9"}, {"env": "dream"}, {"max_plies": 0},
                {"discount": 0.0}, {"win": -1.0}, {"opponent_nodes": 0},
                {"engine_weight": -0.5}, {"engine_depth": 0}):
        with pytest.raises(ValueError, match="task_mix"):
            Games(**bad)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("variant", [
    ["task_mix.env=model"],
    ["task_mix.opponent=engine", "task_mix.engine_weight=0.5", "task_mix.engine_depth=4"]],
    ids=["model_as_environment", "engine_opponent_and_engine_loss"])
def test_task_mix_games_trains_checkpoints_and_resumes_exactly(tiny_overrides, tmp_path,
                                                               monkeypatch, variant, request):
    """The embedded model plays (its moves are legal often enough for advantages), the
    run crashes at step 2 and resumes from the checkpoint of step 1: the same run."""
    if "task_mix.opponent=engine" in variant:
        request.getfixturevalue("stockfish")
    base = [o for o in tiny_overrides if not o.startswith(("model", "sampler.max_new"))]
    overrides = base + ["model=embedded", "task_mix=games", "task_mix.starts_per_step=1",
                        "task_mix.max_plies=4", *variant, "num_generations=2",
                        "steps=3", "checkpoint_every=1", "guard.kl.threshold=1000"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert run(compose(overrides), whole).outcome.status == "success"
    rows = [r for r in comparable(whole) if "games/rows" in r]
    assert len(rows) == 3 and all(r["games/rows"] >= 2 for r in rows)
    assert any(r["adv/abs_mean"] > 0 for r in rows)  # the games differ: advantages
    crash_at(monkeypatch, 2, lambda: run(compose(overrides), cut))
    args = overrides + [f"resume={cut}"]
    resumed, run_dir = resolve_resume(compose(args), args)
    assert run(resumed, run_dir).outcome.status == "success"
    assert_same_run(whole, cut)


def test_against_an_opponent_results_compare_across_the_models_colours():
    r = 1 / math.sqrt(2)
    won = Game(0, chess.Board(), chess.WHITE, [(0, chess.WHITE, True)], result="1-0",
               termination="checkmate")
    lost = Game(0, chess.Board(), chess.BLACK, [(1, chess.BLACK, True)], result="1-0",
                termination="checkmate")
    adv = episode_advantages([won, lost], 2, {}, Games(opponent="random", move_weight=0.0))
    assert adv.tolist() == pytest.approx([r, -r], abs=1e-6)


def test_start_positions_must_be_playable():
    over = SimpleNamespace(truth=SimpleNamespace(fen="7k/5Q2/6K1/8/8/8/8/8 b - - 0 1"))
    with pytest.raises(ValueError, match="playable start positions"):
        Games().starts({"P": [over]}, 0, 0)


def test_an_engine_part_adds_each_legal_moves_normalised_loss_per_side():
    r = 1 / math.sqrt(2)
    # the hand games' white moves 0, 2, 3 lost 0, 50 and 100 centipawns; black's legal
    # move 1 is alone on its side (no comparison), black's row 4 was illegal (not scored)
    losses = {0: 0.0, 2: 50.0, 3: 100.0, 1: 20.0}
    s = Games(move_weight=0.0, engine_weight=0.5)
    plain = episode_advantages(hand_games(), 5, {}, s)
    adv = episode_advantages(hand_games(), 5, {}, s, losses)
    # -losses [0, -50, -100] have mean -50 and std 50: [1, 0, -1]
    assert (adv - plain).tolist() == pytest.approx([0.5, 0.0, 0.0, -0.5, 0.0], abs=1e-6)
    assert plain.tolist() == pytest.approx([r, 0.0, r, -r, 0.0], abs=1e-6)


@pytest.mark.usefixtures("stockfish")
def test_against_the_engine_its_replies_are_the_node_limited_best_moves_and_losses_scored():
    from rookworld.strength.acpl import move_losses
    from rookworld.strength.games import EngineMover

    after_e4 = chess.Board()
    after_e4.push_uci("e2e4")
    s = Games(opponent="engine", max_plies=2, engine_weight=1.0, engine_depth=4)
    try:
        p = play_games(ScriptedEngine({START: answer("e2e4")}, group=2), [START], 0, s)
        white, black = p.games
        reply = EngineMover(nodes=s.opponent_nodes)
        try:
            assert white.board.move_stack[1].uci() == reply.moves([after_e4], [0])[0]
        finally:
            reply.close()
        # the model, as black, answers the engine's first move with the script's illegal
        # default: one row, unscored; as white its e2e4 is scored as acpl scores it
        assert [ok for _, _, ok in black.moves] == [False]
        assert list(p.losses) == [white.moves[0][0]]
        want = move_losses(s.scorer(), [START], ["e2e4"])[0].loss
        assert p.losses[white.moves[0][0]] == pytest.approx(want)
    finally:
        s.close()
