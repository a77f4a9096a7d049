"""The legal-move constraint: the P task's B: move decoded only along legal moves, for the
character tokenizer and for byte-level BPE tokenizers whose tokens straddle "B:" and the
move; checked against a brute-force reading of every vocabulary entry at every step."""

import random
from types import SimpleNamespace

import chess
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rookworld import backends
from rookworld.backends.fast_gpt2.decode import sample
from rookworld.backends.hf import HFBackend
from rookworld.chess_tasks import parse_policy
from rookworld.config import compose, pkg_data, validate
from rookworld.data.load import read_samples
from rookworld.errors import ConfigError
from rookworld.held_out import Evaluator
from rookworld.legal_mask import legal_move_constraint
from rookworld.policy import build_char_tokenizer, load_embedded
from rookworld.sampling import SamplingSettings, decode_tokens, per_task_settings

EOS = "<|endoftext|>"
# promotions (with and without capture), castling both ways, en passant, check, and
# positions without a legal move (mate, stalemate): those rows stay free
SPECIAL_FENS = [
    "1n5k/P7/8/8/8/8/6p1/K7 w - - 0 1",
    "1n5k/P7/8/8/8/8/6p1/K7 b - - 0 1",
    "r3k2r/pppq1ppp/2n2n2/3pp3/1b1PP3/2N2N2/PPPQ1PPP/R3K2R w KQkq - 0 1",
    "r3k2r/pppq1ppp/2n2n2/3pp3/1b1PP3/2N2N2/PPPQ1PPP/R3K2R b KQkq - 0 1",
    "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
    "4k3/8/8/8/8/8/3q4/4K3 w - - 0 1",
    "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3",
    "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1",
]


@pytest.fixture(scope="module")
def p_samples():
    return [s for s in read_samples(pkg_data("eval.jsonl.gz")) if s.task == "P"]


@pytest.fixture(scope="module")
def embedded():
    return load_embedded()


def random_fens(rng: random.Random, n: int) -> list[str]:
    fens = []
    while len(fens) < n:
        board = chess.Board()
        for _ in range(rng.randint(0, 60)):
            moves = list(board.legal_moves)
            if not moves:
                break
            board.push(rng.choice(moves))
        fens.append(board.fen())
    return fens


def byte_bpe(texts, vocab_size: int, straddle: bool) -> PreTrainedTokenizerFast:
    """GPT-2-style byte-level BPE (straddle=False: GPT-2's pre-tokenizing regex, so
    letters, digits and punctuation merge apart); straddle=True merges across it, and
    adds tokens that hold "B:" with part of a move, or start with ":"."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not straddle)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS,
                                   unk_token=EOS)
    if straddle:
        fast.add_tokens(["B: e2", "B: e7e8q", "B: a7b8", "B:  ", " B: x", "B:e2e4", ":e2",
                         ": g1", ": a7a8", "://", "7e8", "e7e8", "2e4"])
    return fast


@pytest.fixture(scope="module")
def tokenizers(p_samples):
    texts = [s.prompt + s.completion for s in p_samples[:300]]
    return {"char": build_char_tokenizer(), "gpt2_bpe": byte_bpe(texts, 600, straddle=False),
            "straddling_bpe": byte_bpe(texts, 1500, straddle=True)}


def reference_allowed(texts: list[str], eos_id: int, text: str, fen: str | None) -> torch.Tensor:
    """Brute force over the vocabulary: [V] bool, the tokens that may follow `text`."""
    targets = {" " + m.uci() for m in chess.Board(fen).legal_moves} if fen else set()
    if not targets:
        return torch.ones(len(texts), dtype=torch.bool)
    prefixes = {t[:k] for t in targets for k in range(len(t) + 1)}
    out = []
    for i, w in enumerate(texts):
        new = text if i == eos_id else text + w
        k = new.find("B:")
        out.append(k < 0 or (new[k + 2:] in targets if i == eos_id else new[k + 2:] in prefixes))
    return torch.tensor(out)


class Recorder:
    """Wraps a constraint, keeping each step's masked logits."""

    def __init__(self, inner):
        self.inner, self.masked = inner, []

    def mask(self, logits):
        out = self.inner.mask(logits)
        self.masked.append(out.clone())
        return out

    def advance(self, tokens):
        self.inner.advance(tokens)


def script(rng: random.Random, fen: str | None) -> str:
    """Text the fake model leans towards: a B: field with a legal move, a promotion
    without its piece, garbage, or a "B" and ":" that meet across tokens."""
    moves = [m.uci() for m in chess.Board(fen).legal_moves] if fen else ["e2e4"]
    move = rng.choice(moves or ["e2e4"])
    return rng.choice([f"E: 0.{rng.randint(0, 99)}  B: {move}", f"  B: {move[:rng.randint(0, 4)]}",
                       "B: e7e8", "B:e2e4", "B: x9", f"xB: {move}q", "B://", f"4 B: {move}"])


def run_fake(tok, fens, seed, settings):
    """decode_tokens over random logits that lean towards each row's script, with the
    legal-move constraint recorded -> (tokens, logps, done, width, masked, logits, texts)."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    n, v, eos = len(fens), len(tok), tok.eos_token_id
    scripts = [tok(script(rng, f), add_special_tokens=False)["input_ids"] for f in fens]
    raw = []

    def logits_at(t):
        x = torch.randn((n, v), generator=gen) * 1.5
        for row, ids in enumerate(scripts):
            if t < len(ids):
                x[row, ids[t]] += 10.0
        raw.append(x)
        return x

    rec = Recorder(legal_move_constraint(SimpleNamespace(tokenizer=tok, eos_id=eos), fens))
    out, logps, done, width, _ = decode_tokens(logits_at(0), lambda _tok, t: logits_at(t + 1),
                                               settings, eos, gen, rec)
    return out, logps, done, width, rec.masked, raw


def texts_of(tok) -> list[str]:
    return [tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            for i in range(len(tok))]


@pytest.mark.parametrize("name", ["char", "gpt2_bpe", "straddling_bpe"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masked_steps_allow_exactly_the_legal_continuations(tokenizers, name, temperature):
    """At every step of every row, the tokens the mask leaves are exactly those a
    brute-force reading allows; the sampled token is one of them, greedy picks the best
    of them, its log-prob is the masked distribution's (which sums to 1 over them), and
    a finished completion's B: move is a whole legal move."""
    tok = tokenizers[name]
    texts, eos = texts_of(tok), tok.eos_token_id
    rng = random.Random(0)
    settings = SamplingSettings(temperature=temperature, max_new_tokens=24)
    reached = ended_legal = straddled = 0
    for seed in range(3):
        fens = SPECIAL_FENS + random_fens(rng, 8)
        fens[3] = None  # a free row among constrained ones
        out, logps, done, width, masked, raw = run_fake(tok, fens, seed, settings)
        for row, fen in enumerate(fens):
            text = ""
            for t in range(width):
                allowed = reference_allowed(texts, eos, text, fen)
                finite = torch.isfinite(masked[t][row])
                assert torch.equal(finite, allowed), (name, fen, text)
                scaled = masked[t][row] / (temperature or 1.0)
                logp = scaled.log_softmax(-1)
                assert torch.logsumexp(logp[allowed], 0).item() == pytest.approx(0.0, abs=1e-5)
                tok_id = int(out[row, t])
                assert allowed[tok_id]
                assert logps[row, t].item() == pytest.approx(logp[tok_id].item(), abs=1e-5)
                if temperature == 0:
                    assert tok_id == int(raw[t][row].masked_fill(~allowed, -torch.inf).argmax())
                if tok_id == eos:
                    break
                if "B:" not in text and "B:" in text + texts[tok_id] and \
                        not (text + texts[tok_id]).endswith("B:"):
                    straddled += 1
                text += texts[tok_id]
            board = chess.Board(fen) if fen else None
            if "B:" in text and board is not None and any(board.legal_moves):
                reached += 1
                rest = text[text.find("B:") + 2:]
                if done[row]:
                    assert rest[:1] == " " and chess.Move.from_uci(rest[1:]) in board.legal_moves
                    ended_legal += 1
                else:
                    assert any((" " + m.uci()).startswith(rest) for m in board.legal_moves)
    assert reached >= 12 and ended_legal >= 6, (reached, ended_legal)
    if name == "straddling_bpe":
        assert straddled >= 5, straddled  # tokens that carry "B:" and part of the move


def test_a_constraint_of_free_rows_changes_nothing(embedded):
    """Rows without a FEN (or without a legal move) sample exactly what the sampler
    samples with no constraint: same seed, same tokens, same log-probs."""
    prompts = [embedded.encode_prompt(f"P: {f} ") for f in SPECIAL_FENS[:3]]
    prompts += [embedded.encode_prompt(f"P: {SPECIAL_FENS[6]} ")]
    s = SamplingSettings(temperature=1.0, max_new_tokens=40)
    plain = sample(embedded.model, prompts, s, embedded.eos_id, torch.Generator().manual_seed(3))
    free = legal_move_constraint(embedded, [None, None, None, SPECIAL_FENS[6]])  # mate: free
    with_c = sample(embedded.model, prompts, s, embedded.eos_id,
                    torch.Generator().manual_seed(3), constraint=free)
    assert torch.equal(plain.completion_ids, with_c.completion_ids)
    assert torch.equal(plain.logprobs, with_c.logprobs)


def test_outputs_past_the_tokenizer_are_never_written_by_a_constrained_row():
    """A model whose output layer is wider than its tokenizer (a padded embedding): the
    constraint bans the outputs no token stands for, so a row never samples one."""
    tok = build_char_tokenizer()
    width = len(tok) + 32
    policy = SimpleNamespace(tokenizer=tok, eos_id=tok.eos_token_id)
    constraint = legal_move_constraint(policy, [chess.STARTING_FEN])
    logits = torch.zeros(1, width)
    logits[0, width - 1] = 50.0  # the model's favourite output has no token
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=30)
    r = decode_tokens(logits, lambda t, step: logits.clone(), greedy, tok.eos_token_id, None,
                      constraint)
    assert int(r[0].max()) < len(tok)


def test_both_backends_decode_the_same_masked_moves(embedded, p_samples):
    """The hf backend applies the constraint as the fast sampler does: greedy masked
    completions agree, and every B: move is legal."""
    chunk = p_samples[:3]
    prompts = [embedded.encode_prompt(s.prompt) for s in chunk]
    fens = [s.truth.fen for s in chunk]
    s = SamplingSettings(temperature=0.0, max_new_tokens=160)
    fast = backends.of(embedded).sample(embedded.model, prompts, s, embedded.eos_id,
                                        constraint=legal_move_constraint(embedded, fens))
    hf = HFBackend()
    slow = hf.sample(hf.prepare(embedded.model), prompts, s, embedded.eos_id,
                     constraint=legal_move_constraint(embedded, fens))
    a = embedded.decode_completions(fast.completion_ids, fast.completion_mask)
    b = embedded.decode_completions(slow.completion_ids, slow.completion_mask)
    assert a == b
    for fen, text in zip(fens, a):
        assert chess.Move.from_uci(parse_policy(text).best) in chess.Board(fen).legal_moves


def test_evaluator_masks_p_when_its_settings_say_so(embedded, p_samples):
    """Evaluator with legal_moves=mask gives P completions whose B: move is legal, and
    leaves them free otherwise (the shipped model names some illegal ones)."""
    chunk = p_samples[:8]
    rates = {}
    for mode in ("free", "mask"):
        ev = Evaluator(chunk, per_task_settings(legal_moves=mode), batch_size=8)
        metrics, _ = ev(embedded, lambda s, t: SimpleNamespace(score=0.0))
        rates[mode] = metrics["eval/P/best_legal"]
    assert rates["mask"] == 1.0 > rates["free"]


def test_settings_name_the_legal_moves_key():
    with pytest.raises(ValueError, match="sampler.legal_moves must be free or mask"):
        SamplingSettings(legal_moves="on")
    with pytest.raises(ValueError, match="min_new_tokens must be 0 with legal_moves=mask"):
        per_task_settings(per_task={"P": {"legal_moves": "mask", "min_new_tokens": 2}})


@pytest.mark.parametrize("override", ["sampler.legal_moves=mask",
                                      "+sampler.per_task.P.legal_moves=mask"])
def test_training_refuses_the_mask(override):
    validate(compose(["sampler.legal_moves=free"]))
    with pytest.raises(ConfigError, match="legal_moves=mask is for evaluation and play only"):
        validate(compose([override]))


@pytest.mark.slow
def test_shipped_model_names_only_legal_moves_with_the_mask(embedded, p_samples):
    """200 held-out positions, greedy, each prompt twice in one batch: masked and free.
    Masked, every B: field the model reaches holds a legal move; the free rate is printed."""
    chunk = p_samples[:200]
    prompts = [embedded.encode_prompt(s.prompt) for s in chunk for _ in range(2)]
    fens = [f for s in chunk for f in (s.truth.fen, None)]
    r = sample(embedded.model, prompts, SamplingSettings(temperature=0.0, max_new_tokens=160),
               embedded.eos_id, constraint=legal_move_constraint(embedded, fens))
    texts = embedded.decode_completions(r.completion_ids, r.completion_mask)
    counts = {"mask": [0, 0], "free": [0, 0]}  # [reached B:, legal]
    same_before_b = 0
    for i, s in enumerate(chunk):
        board = chess.Board(s.truth.fen)
        masked, free = texts[2 * i], texts[2 * i + 1]
        same_before_b += masked.split("B:")[0] == free.split("B:")[0]
        for mode, text in (("mask", masked), ("free", free)):
            if "B:" in text:
                counts[mode][0] += 1
                best = parse_policy(text).best
                counts[mode][1] += bool(best) and chess.Move.from_uci(best) in board.legal_moves
    print(f"B: legal, greedy, {len(chunk)} held-out positions: "
          f"mask {counts['mask'][1]}/{counts['mask'][0]}, free {counts['free'][1]}/"
          f"{counts['free'][0]}")
    assert counts["mask"][0] >= 190 and counts["mask"][1] == counts["mask"][0]
    assert same_before_b >= 196  # the mask leaves M: and E: to the model
