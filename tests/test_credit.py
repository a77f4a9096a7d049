"""Move credit (`algorithm.credit=moves`): each P move's characters carry the advantage of
its own legality within its group; everything else keeps the sequence advantage."""

from types import SimpleNamespace

import pytest
import torch

from rookworld import credit
from rookworld.chess_tasks.policy import policy_sample
from rookworld.config import compose
from rookworld.grpo import PolicyLoss, policy_loss
from rookworld.policy import build_char_tokenizer
from rookworld.sampling import Rollout
from rookworld.train import build_engine, build_parts
from tests.test_engine import LengthReward

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"


class PairTokenizer:
    """Two characters a token, so a move's span starts or ends inside a token."""

    def __init__(self, text: str):
        self.pieces = [text[i:i + 2] for i in range(0, len(text), 2)]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids)


def _advantages(texts, seq, fens=None, group=None, tokenizer=None):
    tok = tokenizer or build_char_tokenizer()
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    ends = [credit.token_ends(tok, i) for i in ids]
    return credit.move_advantages(torch.tensor(seq), fens or [START] * len(texts), texts, ends,
                                  group or len(texts), max(map(len, ids)))


def test_a_fieldless_completion_has_no_move_spans():
    assert credit.move_spans("e2e4 e7e5") == []
    assert credit.move_spans(" M: e2e4 E: 0.1") == []
    assert [s[0] for s in credit.move_spans("M: e2e4  E: 0.1  B:")] == ["M0"]


def test_each_move_gets_its_own_legality_and_the_rest_the_sequence_advantage():
    texts = [" M: e2e4 e2e5  E: 0.3 0.1  B: e2e5",
             " M: e2e4 d2d4  E: 0.3 0.1  B: e2e4"]
    adv = _advantages(texts, [0.5, -0.5])
    for row, text in enumerate(texts):
        spans = {slot: (a, b) for slot, a, b, _ in credit.move_spans(text)}
        a, b = spans["M0"]  # legal in both rows: no signal
        assert adv[row, a:b].eq(0).all()
        sign = -1 if row == 0 else 1  # e2e5 is illegal, d2d4 and e2e4 legal
        for slot in ("M1", "B"):  # two rows, one legal: +-0.5 / std(0, 1)
            a, b = spans[slot]
            assert torch.allclose(adv[row, a:b], torch.tensor(sign * 2 ** -0.5))
        outside = torch.ones(len(text), dtype=torch.bool)
        for a, b in spans.values():
            outside[a:b] = False
        assert adv[row, :len(text)][outside].eq([0.5, -0.5][row]).all()


def test_rows_without_moves_and_other_groups_stay_apart():
    texts = [" M: e2e5  E: 0.1  B: e2e5", " M: e2e4  E: 0.1  B: e2e4",
             "8/8/8/8/8/8/8/8 w - - 0 1+0+0+0", " M: e2e4  E: 0.1  B: e2e4"]
    adv = _advantages(texts, [1.0, 2.0, 3.0, 4.0], fens=[START, START, None, START], group=2)
    assert adv[0, 4:8].lt(0).all() and adv[1, 4:8].gt(0).all()
    assert adv[2, :len(texts[2])].eq(3.0).all()  # not a P row: the sequence advantage
    assert adv[3, :len(texts[3])].eq(4.0).all()  # its group's only P row: nothing to compare


def test_a_span_covers_every_token_it_touches():
    texts = [" M: e2e5  E: 0.1  B: e2e4", " M: e2e4  E: 0.1  B: e2e4"]
    toks = [PairTokenizer(t) for t in texts]
    ids = [list(range(len(t.pieces))) for t in toks]
    ends = [credit.token_ends(t, i) for t, i in zip(toks, ids)]
    adv = credit.move_advantages(torch.tensor([0.0, 0.0]), [START] * 2, texts, ends, 2, 13)
    # "e2e5" spans characters 4-7, tokens 2 (" M"... "e2") and 3 ("e5")
    assert adv[0, :5].sign().tolist() == [0.0, 0.0, -1.0, -1.0, 0.0]


def test_per_token_advantages_equal_to_the_broadcast_give_the_same_loss():
    torch.manual_seed(0)
    logp, old = torch.randn(4, 6), torch.randn(4, 6)
    mask = torch.ones(4, 6)
    seq = torch.randn(4)
    loss = PolicyLoss(clip_low=0.2, clip_high=0.2)
    a, _ = policy_loss(logp, old, seq, mask, loss)
    b, _ = policy_loss(logp, old, seq[:, None].expand(4, 6), mask, loss)
    assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["fast_gpt2", "hf"])
def test_the_engine_trains_on_move_credit(tiny_overrides, backend):
    from rookworld.data.load import read_samples

    cfg = compose(tiny_overrides + [f"backend={backend}", "algorithm.credit=moves",
                                    "sampler.temperature=1.5", "optim.lr=1e-2"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    pools = {t: [s for s in read_samples(cfg.data.train) if s.task == t] for t in "PA"}
    batch = engine.rollout(parts.task_mix.draw(pools, 2, 0, 0), 0)
    assert batch.advantages.shape == batch.rollout.completion_ids.shape
    m = engine.update(batch, 0)
    assert torch.isfinite(torch.tensor(m["loss/policy"]))
    # written-out P answers get their moves' credit through the engine's own path
    rows = [policy_sample(START, ("e2e4", "d2d4"), (0.3, 0.1))] * 2
    texts = [" M: e2e4 e2e5  E: 0.3 0.1  B: e2e5", " M: e2e4 d2d4  E: 0.3 0.1  B: e2e4"]
    ids = [engine.policy.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    comp = torch.tensor([i + [0] * (width - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    r = Rollout(comp[:, :1], mask[:, :1], comp, mask, torch.zeros(2, width),
                torch.zeros(2, dtype=torch.bool))
    adv = credit.MoveCredit(engine.policy.tokenizer)(torch.tensor([0.5, -0.5]), rows, texts,
                                                     r, 2)
    assert torch.equal(adv, _advantages(texts, [0.5, -0.5]))


def test_move_quality_ranks_legal_best_moves_by_their_labelled_loss():
    """Four P rows of one position and an A row: the labelled best, a labelled move 1.5
    pawns worse (quality 0.5), an unlabelled legal move and an illegal one. Legality alone
    separates only the illegal move; with move_quality the legal B: moves are ranked by
    their labelled quality, the illegal one stays lowest, the listed moves keep their
    legality's advantage and the A row its sequence advantage."""
    p = policy_sample(START, ("e2e4", "d2d4"), (0.3, -1.2))
    env = "8/8/8/8/8/8/8/8 w - - 0 1+0+0+0"
    rows = [p] * 4 + [SimpleNamespace(task="A", truth=None)]
    texts = [" M: e2e4  E: 0.3  B: e2e4", " M: e2e4  E: 0.3  B: d2d4",
             " M: e2e4  E: 0.3  B: g1f3", " M: e2e4  E: 0.3  B: e2e5", env]
    tok = build_char_tokenizer()
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    comp = torch.tensor([i + [0] * (width - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    r = Rollout(comp[:, :1], mask[:, :1], comp, mask, torch.zeros(5, width),
                torch.zeros(5, dtype=torch.bool))
    seq = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    plain = credit.MoveCredit(tok)(seq, rows, texts, r, 5)
    ranked = credit.MoveCredit(tok, move_quality=1.0)(seq, rows, texts, r, 5)
    b = [dict((s, (a, e)) for s, a, e, _ in credit.move_spans(t))["B"] for t in texts[:4]]
    plain_b = [plain[i, a].item() for i, (a, _) in enumerate(b)]
    ranked_b = [ranked[i, a].item() for i, (a, _) in enumerate(b)]
    assert plain_b[0] == plain_b[1] == plain_b[2] > plain_b[3]  # legality only
    # slot values 2, 1.5, 1 and 0: strictly in that order
    assert ranked_b[0] > ranked_b[1] > ranked_b[2] > ranked_b[3]
    assert torch.equal(ranked[:4, :b[0][0]], plain[:4, :b[0][0]])  # fields and listed moves
    assert ranked[4, :len(env)].eq(0.5).all()  # the A row: its sequence advantage


def test_listed_quality_ranks_legal_listed_moves_and_leaves_the_best_move_to_legality():
    """Three P rows whose first listed move is the labelled best, a labelled move 1.5 pawns
    worse and an unlabelled legal move, each with the same legal B: move: with
    listed_quality the first listed slot is ranked by labelled quality, the B: slot ties."""
    p = policy_sample(START, ("e2e4", "d2d4"), (0.3, -1.2))
    texts = [f" M: {m}  E: 0.3  B: e2e4" for m in ("e2e4", "d2d4", "g1f3")]
    tok = build_char_tokenizer()
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    comp = torch.tensor(ids)
    mask = torch.ones_like(comp)
    r = Rollout(comp[:, :1], mask[:, :1], comp, mask, torch.zeros(3, comp.shape[1]),
                torch.zeros(3, dtype=torch.bool))
    adv = credit.MoveCredit(tok, listed_quality=1.0)(torch.zeros(3), [p] * 3, texts, r, 3)
    spans = [dict((s, a) for s, a, _, _ in credit.move_spans(t)) for t in texts]
    listed = [adv[i, spans[i]["M0"]].item() for i in range(3)]
    best = [adv[i, spans[i]["B"]].item() for i in range(3)]
    assert listed[0] > listed[1] > listed[2]  # slot values 2, 1.5 and 1
    assert best == [0.0, 0.0, 0.0]  # all legal alike: no quality weight on B:


def test_distinct_moves_values_a_repeated_listed_move_as_an_illegal_one():
    """Two rows listing e2e4 twice and e2e4 then d2d4: without distinct_moves both second
    slots are legal and tie; with it the repeat is worth what an illegal move is."""
    texts = [" M: e2e4 e2e4  E: 0.3 0.3  B: e2e4", " M: e2e4 d2d4  E: 0.3 0.1  B: e2e4"]
    tok = build_char_tokenizer()
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    ends = [credit.token_ends(tok, i) for i in ids]
    spans = [dict((s, a) for s, a, _, _ in credit.move_spans(t)) for t in texts]

    def second_slot(distinct):
        adv = credit.move_advantages(torch.zeros(2), [START] * 2, texts, ends, 2,
                                     max(map(len, ids)), distinct=distinct)
        return [adv[i, spans[i]["M1"]].item() for i in range(2)]

    assert second_slot(False) == [0.0, 0.0]
    repeat, other = second_slot(True)
    assert repeat < 0 < other
    from rookworld.grpo import Algorithm
    with pytest.raises(ValueError, match="distinct_moves"):
        Algorithm(credit="sequence", distinct_moves=True)
    assert compose(["algorithm.distinct_moves=true"]).algorithm.distinct_moves is True


@pytest.mark.parametrize("name", ["move_quality", "listed_quality"])
def test_move_quality_needs_move_credit(name):
    from rookworld.grpo import Algorithm
    with pytest.raises(ValueError, match=name):
        Algorithm(credit="sequence", **{name: 0.5})
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=name):
            Algorithm(credit="moves", **{name: bad})
    assert getattr(Algorithm(credit="moves", **{name: 0.5}), name) == 0.5
    assert getattr(compose([f"algorithm.{name}=0.5"]).algorithm, name) == 0.5


def _two_rows_one_illegal_b(advantage, step):
    """The B: slot's advantages of two rows, the first B: move illegal, under MoveCredit
    with the given run advantage (None: its default) at the given step."""
    texts = [" M: e2e4  E: 0.3  B: e2e5", " M: e2e4  E: 0.3  B: e2e4"]
    tok = build_char_tokenizer()
    comp = torch.tensor([tok(t, add_special_tokens=False)["input_ids"] for t in texts])
    mask = torch.ones_like(comp)
    r = Rollout(comp[:, :1], mask[:, :1], comp, mask, torch.zeros(2, comp.shape[1]),
                torch.zeros(2, dtype=torch.bool))
    rows = [policy_sample(START, ("e2e4",), (0.3,))] * 2
    move_credit = credit.MoveCredit(tok) if advantage is None else \
        credit.MoveCredit(tok, advantage=advantage)  # None: MoveCredit's default
    adv = move_credit(torch.zeros(2), rows, texts, r, 2, step)
    return [adv[i, credit.move_spans(t)[-1][1]].item() for i, t in enumerate(texts)]


def test_move_slots_follow_the_runs_advantage():
    """GRPO's group std gives the slots (0, 1) -+0.707; RLOO's leave-one-out (no std)
    -+1.0 (2/1 x 0.5); a clip bounds them; the reward warm-up scales them by its factor,
    0 at its first step."""
    from rookworld.advantages import RunningAdvantage
    from rookworld.grpo import GroupAdvantage
    grpo = _two_rows_one_illegal_b(GroupAdvantage(min_std=1e-4), 0)
    assert grpo == pytest.approx([-2 ** -0.5, 2 ** -0.5])
    assert _two_rows_one_illegal_b(None, 0) == grpo
    rloo = GroupAdvantage(scale="none", baseline="leave_one_out")
    assert _two_rows_one_illegal_b(rloo, 0) == pytest.approx([-1.0, 1.0])
    assert _two_rows_one_illegal_b(GroupAdvantage(clip=0.5), 0) == pytest.approx([-0.5, 0.5])
    warm = RunningAdvantage(warmup_steps=20, warmup_start=0.0)
    assert _two_rows_one_illegal_b(warm, 0) == [0.0, 0.0]
    assert _two_rows_one_illegal_b(warm, 10) == pytest.approx([-2 ** -0.5 / 2, 2 ** -0.5 / 2])
    assert _two_rows_one_illegal_b(warm, 20) == pytest.approx(grpo)


@pytest.mark.parametrize("preset", ["ema_norm", "ema_baseline", "adaptive_baseline"])
def test_an_advantage_of_running_statistics_compares_move_slots_as_grpo(preset):
    """Their baselines and scales are statistics of the sequence reward, which a move's
    legality does not share: a group's slots are compared by its mean and std, then the
    advantage's warm-up applies; the run builds under move credit."""
    cfg = compose([f"advantage={preset}", "algorithm.advantage.warmup_steps=4"])
    advantage = build_parts(cfg).algorithm.advantage
    assert _two_rows_one_illegal_b(advantage, 4) == pytest.approx([-2 ** -0.5, 2 ** -0.5])
    assert _two_rows_one_illegal_b(advantage, 2) == pytest.approx([-2 ** -0.5 / 2,
                                                                   2 ** -0.5 / 2])


def test_a_listed_move_past_the_fifth_earns_nothing():
    """Six listed moves make the list malformed: the sixth is worth what an illegal move
    is, so a legal sixth and an illegal one tie instead of the legal one gaining."""
    five = "e2e4 d2d4 g1f3 b1c3 c2c4"
    texts = [f" M: {five} h2h3  E: 0.3 0.2 0.2 0.1 0.1 0.0  B: e2e4",
             f" M: {five} h2h6  E: 0.3 0.2 0.2 0.1 0.1 0.0  B: e2e4"]
    adv = _advantages(texts, [0.0, 0.0])
    for row, text in enumerate(texts):
        spans = {slot: (a, b) for slot, a, b, _ in credit.move_spans(text)}
        a, b = spans["M5"]
        assert adv[row, a:b].eq(0).all()


def test_token_ends_follow_a_character_split_over_byte_level_tokens():
    """Byte-level BPE splits a non-ASCII character over tokens that each decode to U+FFFD:
    the offsets still end where each token's text ends in the whole decoded completion,
    so the moves after it keep their own tokens."""
    from tests.test_legal_mask import byte_bpe

    text = " M: e2e4 \u20ac e2e5  E: 0.3 0.1  B: e2e4"
    tok = byte_bpe([" M: e2e4 e2e5  E: 0.3 0.1  B: d2d4"], 300, straddle=False)  # no merge
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert "\ufffd" in tok.decode(ids[8:9])  # the character is split over its bytes' tokens
    ends = credit.token_ends(tok, ids)
    assert ends[-1] == len(text)
    a, b = {s: (a, b) for s, a, b, _ in credit.move_spans(text)}["M2"]
    first = next(k for k, e in enumerate(ends) if e > a)
    assert tok.decode(ids[first:next(k for k, e in enumerate(ends) if e >= b) + 1]).strip() \
        == "e2e5"
