"""Hostile text through every parser, loader, validator, the environment oracle and the
redactor (the rewards have their own properties in tests/test_rewards_properties.py).

Each property states what the function promises: parsers never raise and give back
what a well-formed line holds; the loader either returns samples with consistent
counts or raises ValueError("no usable rows"); validators and the oracle never raise
on strings; redaction never raises, is idempotent and removes generated passwords.

Example counts come from the hypothesis profile (tests/conftest.py): HYPOTHESIS_PROFILE=ci
runs 5,000 per property. `python fuzz/fuzz_parsers.py --minutes 10` runs longer.
"""

import json
import math
import random
import re

import chess
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rookworld.chess_tasks import Sample, env_sample, parse_env, parse_policy, policy_sample
from rookworld.chess_tasks.environment import env_step, split_env_line
from rookworld.chess_tasks.policy import field_starts, parse_policy_line
from rookworld.data.loaders import load_lines
from rookworld.data.validate import DEFECTS, check_env, check_policy
from rookworld.redact import MASK, redact, redact_config

CHESSY = "abcdefgh12345678qrbnkpKQRBNPwW-+/ .:MEAB09\n\t"
hostile = st.one_of(st.text(), st.text(alphabet=CHESSY),
                    st.binary().map(lambda b: b.decode("utf-8", "replace")))


def random_position(seed: int) -> tuple[chess.Board, list[str]]:
    """A position a few random plies into a game, and the moves that led there."""
    rng, board, hist = random.Random(seed), chess.Board(), []
    for _ in range(rng.randint(0, 40)):
        legal = list(board.legal_moves)
        if not legal:
            break
        mv = rng.choice(legal)
        hist.append(mv.uci())
        board.push(mv)
    return board, hist


@st.composite
def p_samples(draw):
    board, _ = random_position(draw(st.integers(0, 10**6)))
    legal = sorted(m.uci() for m in board.legal_moves)
    if not legal:
        board = chess.Board()
        legal = sorted(m.uci() for m in board.legal_moves)
    moves = draw(st.lists(st.sampled_from(legal), min_size=1, max_size=5, unique=True))
    evals = draw(st.lists(st.floats(-999.99, 999.99).map(lambda x: round(x, 2)),
                          min_size=len(moves), max_size=len(moves)))
    return policy_sample(board.fen(), moves, evals, "fuzz")


@st.composite
def a_samples(draw):
    board, hist = random_position(draw(st.integers(0, 10**6)))
    if board.is_game_over():
        board, hist = chess.Board(), []
    legal = sorted(m.uci() for m in board.legal_moves)
    move = draw(st.one_of(st.sampled_from(legal), st.sampled_from(["e2e5", "a1a1", "h7h8q"])))
    return env_sample(board.fen(), move, (hist + [move])[-10:])


@st.composite
def mutated(draw, text: str) -> str:
    """`text` with a few characters flipped, deleted, inserted or the tail cut."""
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["flip", "delete", "insert", "cut"]))
        char = draw(st.one_of(st.sampled_from(CHESSY), st.characters()))
        if kind == "cut":
            text = text[:i]
        elif kind == "insert":
            text = text[:i] + char + text[i:]
        elif text:
            i = min(i, len(text) - 1)
            text = text[:i] + (char if kind == "flip" else "") + text[i + 1:]
    return text


# ---------------------------------------------------------------- the P parser

@given(hostile)
def test_parse_policy_never_raises_and_ok_means_consistent(text):
    p = parse_policy(text)
    if p.ok:
        assert len(p.moves) == len(p.evals) >= 1 and p.best
        assert all(math.isfinite(e) for e in p.evals)
    else:
        assert p.reason


_REFERENCE_FIELDS = re.compile(r"^\s*M:(?P<moves>.*?)E:(?P<evals>.*?)B:(?P<best>.*)$", re.DOTALL)
_PIECES = st.sampled_from(["M:", "E:", "B:", " ", "  ", "\n", "e2e4", "0.3", "-1", "x", "M", ":"])


@given(st.lists(_PIECES, max_size=30).map("".join))
def test_parse_policy_fields_are_the_lazy_regexs(text):
    # the linear field split reads the same fields as the regex it replaces
    m = _REFERENCE_FIELDS.match(text)
    at = field_starts(text)
    fields = None if at is None else (text[at[0] + 2:at[1]], text[at[1] + 2:at[2]],
                                      text[at[2] + 2:])
    assert fields == (None if m is None else (m["moves"], m["evals"], m["best"]))


def test_parse_policy_refuses_over_long_input_at_once():
    text = "M:" + " E: 1" * 4000  # many E: and no B:: quadratic for a backtracking regex
    p = parse_policy(text)
    assert not p.ok and "longer than" in p.reason
    assert field_starts(text) is None  # the split itself is one pass


@given(p_samples())
def test_parse_policy_reads_back_a_well_formed_completion(sample):
    p = parse_policy(sample.completion)
    t = sample.truth
    assert p.ok, p.reason
    assert p.moves == tuple(t.moves) and p.best == t.best
    assert p.evals == pytest.approx(tuple(t.evals), abs=0.005)
    fen, line = parse_policy_line(sample.prompt + sample.completion)
    assert fen == t.fen and line.moves == p.moves


@given(st.data())
def test_parse_policy_on_corrupted_completions(data):
    sample = data.draw(p_samples())
    p = parse_policy(data.draw(mutated(sample.completion)))
    assert p.ok or p.reason
    parse_policy_line(data.draw(mutated(sample.prompt + sample.completion)))


@given(hostile)
def test_parse_policy_line_never_raises(text):
    fen, parsed = parse_policy_line(text)
    assert isinstance(fen, str) and (parsed.ok or parsed.reason)


def test_numbers_are_plain_decimals_not_all_that_float_reads():
    assert parse_policy("M: e2e4  E: -0.25  B: e2e4").evals == (-0.25,)
    for junk in ("1_0", "5e-1", "nan", "inf", "+0.3", "0x1", "\u0663.\u0665"):  # Arabic 3.5
        assert not parse_policy(f"M: e2e4  E: {junk}  B: e2e4").ok, junk


# ---------------------------------------------------------------- the A parser

def test_a_fen_is_six_fields_and_a_reward_a_plain_decimal():
    assert parse_env("8/8/8/8/8/8/8/K6k w - - 0 1+0.5+1+0").ok
    # python-chess fills in the fields of a bare placement: not a FEN of the format
    assert not parse_env("8/8/8/8/8/8/8/K6k+0.001+0+0").ok
    for junk in ("5e-1", "0_1.0", "nan"):
        assert not parse_env(f"8/8/8/8/8/8/8/K6k w - - 0 1+{junk}+1+0").ok, junk


@given(hostile)
def test_parse_env_never_raises(text):
    p = parse_env(text)
    assert p.ok or p.reason
    if p.ok:
        assert p.fen_valid and p.terminated in (0, 1) and p.truncated in (0, 1)


@given(a_samples())
def test_parse_env_reads_back_the_oracle(sample):
    t, p = sample.truth, parse_env(sample.completion)
    assert p.ok, p.reason
    assert (p.new_fen, p.reward, p.terminated, p.truncated) == (
        t.new_fen, float(t.reward), t.terminated, t.truncated)
    assert split_env_line(sample.prompt + sample.completion) == (sample.prompt, sample.completion)


@given(st.data())
def test_env_parsers_on_corrupted_lines(data):
    sample = data.draw(a_samples())
    p = parse_env(data.draw(mutated(sample.completion)))
    assert p.ok or p.reason
    if p.ok:
        assert p.fen_valid and p.terminated in (0, 1) and p.truncated in (0, 1)
    split = split_env_line(data.draw(mutated(sample.prompt + sample.completion)))
    assert split is None or (split[0].startswith("A: ") and split[0].count("+") == 3)


@given(hostile)
def test_split_env_line_never_raises(text):
    split = split_env_line(text)
    assert split is None or "".join(split).endswith(text)


# ------------------------------------------------- validators and the oracle

@given(hostile, st.lists(hostile, max_size=6), st.lists(st.floats(allow_nan=True), max_size=6),
       hostile)
def test_check_policy_never_raises_and_names_known_defects(fen, moves, evals, best):
    assert set(check_policy(fen, moves, evals, best)) <= set(DEFECTS)


@given(hostile, hostile, st.lists(hostile, max_size=12), hostile)
def test_check_env_never_raises_and_names_known_defects(fen, move, history, completion):
    assert set(check_env(fen, move, history, completion)) <= set(DEFECTS)


@given(st.integers(0, 10**6), hostile)
def test_the_oracle_takes_any_move_text_in_a_legal_position(seed, move):
    board, hist = random_position(seed)
    t = env_step(board.fen(), move, hist[-9:] + [move])
    legal = move in {m.uci() for m in board.legal_moves}
    assert (t.truncated == 0) == legal and t.terminated in (0, 1)
    if not legal:
        assert t.reward == "-1.0" and t.new_fen == board.fen()


# ------------------------------------------------------------------- the loader

@given(st.lists(st.one_of(hostile, p_samples().map(lambda s: s.prompt + s.completion),
                          a_samples().map(lambda s: s.prompt + s.completion)), max_size=6),
       st.sampled_from(["drop", "relabel"]))
def test_load_text_lines_counts_every_row_or_says_nothing_is_usable(lines, on_defect):
    lines = [x.replace("\n", " ").replace("\r", " ") for x in lines]
    try:
        res = load_lines(lines, "fuzz", on_defect, json_rows=False)
    except ValueError as e:
        assert "no usable rows" in str(e)
        return
    r = res.report
    assert r.kept == len(res.samples) >= 1 and r.rows == r.kept + r.dropped
    assert r.relabelled <= r.kept and set(r.counts) <= set(DEFECTS)
    for s in res.samples:
        assert s.task in ("P", "A") and s.prompt and s.completion


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                           lambda kids: st.lists(kids, max_size=3)
                           | st.dictionaries(st.text(max_size=8), kids, max_size=3), max_leaves=8)


scalar = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
truth_junk = {k: st.text() for k in ("fen", "best", "source", "move", "new_fen", "reward")} | {
    k: st.lists(st.text(), max_size=6) for k in ("moves", "history")} | {
    "evals": st.lists(st.floats() | st.integers(), max_size=6),
    "terminated": scalar, "truncated": scalar}


@st.composite
def json_rows(draw):
    """A sample's JSON row, with a field or two replaced by junk of any type."""
    row = draw(st.one_of(p_samples(), a_samples())).to_json()
    for _ in range(draw(st.integers(0, 2))):
        truth = isinstance(row.get("truth"), dict) and draw(st.booleans())
        target = row["truth"] if truth else row
        key = draw(st.sampled_from(sorted(target) or ["task"]))
        if draw(st.booleans()):
            # inside truth: junk of the right shape half the time, of any shape otherwise
            shaped = truth and draw(st.booleans())
            target[key] = draw(truth_junk.get(key, json_values) if shaped else json_values)
        else:
            target.pop(key, None)
    return json.dumps(row)


@given(st.lists(st.one_of(json_rows(), hostile.map(lambda t: "{" + t)), min_size=1, max_size=5))
def test_load_json_rows_with_junk_fields(lines):
    lines = [x.replace("\n", " ") for x in lines]
    try:
        res = load_lines(lines, "fuzz", "relabel", json_rows=True)
    except ValueError as e:
        assert "no usable rows" in str(e)
        return
    r = res.report
    assert r.rows == r.kept + r.dropped and r.kept == len(res.samples)


@pytest.mark.parametrize("task,key,junk", [("A", "fen", []), ("P", "moves", [[]]),
                                           ("P", "fen", {"a": 1})])
def test_json_row_with_junk_types_in_truth_is_a_defect_not_a_crash(task, key, junk):
    good = env_sample(chess.STARTING_FEN, "e2e4").to_json()
    bad = (env_sample(chess.STARTING_FEN, "e2e4") if task == "A"
           else policy_sample(chess.STARTING_FEN, ["e2e4"], [0.3])).to_json()
    bad["truth"][key] = junk
    res = load_lines([json.dumps(bad), json.dumps(good)], "fuzz", "drop", json_rows=True)
    assert res.report.kept == 1 and res.report.dropped == 1


@given(json_values)
def test_sample_from_json_raises_only_what_the_loader_catches(value):
    try:
        Sample.from_json(value)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass


# --------------------------------------------------------------- redaction

secret_chars = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                       "!$%&()*,;=~_-.", min_size=6, max_size=24)


@given(hostile)
def test_redact_never_raises_and_is_idempotent(text):
    once = redact(text)
    assert redact(once) == once


@given(st.sampled_from(["postgresql+psycopg", "mysql", "redis", "https", "amqp"]),
       st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8), secret_chars,
       st.sampled_from(["127.0.0.1", "db.example.org:5432", "[::1]:6379"]),
       st.text(alphabet="abcdefgh 12345678/-+.\n", max_size=40))
def test_redact_removes_a_url_password_anywhere(scheme, user, password, host, around):
    password = "Z" + password  # a letter the surrounding text never holds
    url = f"{scheme}://{user}:{password}@{host}/db"
    out = redact(around[:20] + " " + url + " " + around[20:])
    assert f"{user}:{MASK}@{host}/db" in out and password not in out


@given(st.sampled_from(["password", "api_key", "WANDB_API_KEY", "hf_token", "client_secret"]),
       secret_chars, json_values)
def test_redact_config_masks_secret_keys_at_any_depth(key, secret, other):
    cfg = {"a": [{"b": {key: secret}}], "other": other}
    out = redact_config(cfg)
    assert out["a"][0]["b"][key] == MASK


def _mutated_copies():
    import gzip
    from pathlib import Path
    raw = gzip.open(Path(__file__).resolve().parents[1] / "rookworld" / "assets" / "data"
                    / "eval.jsonl.gz").read()[:20_000]
    return raw, gzip.compress(raw, mtime=0)


@given(kind=st.sampled_from(["gzip cut", "gzip flip", "text flip", "text cut", "junk line"]),
       at=st.floats(0.0, 1.0), junk=st.binary(min_size=1, max_size=256))
def test_a_damaged_data_file_is_a_named_error_or_a_counted_skip(kind, at, junk):
    """Whole files cut short, with flipped bytes or junk lines: read_samples returns the
    rows it could check (each defect counted) or raises ConfigError naming the file."""
    import tempfile
    from pathlib import Path

    from rookworld.config import ConfigError
    from rookworld.data.load import read_samples

    raw, packed = _mutated_copies()
    data, suffix = (packed, ".jsonl.gz") if kind.startswith("gzip") else (raw, ".jsonl")
    i = int(at * (len(data) - 1))
    if kind.endswith("cut"):
        data = data[:i]
    elif kind.endswith("flip"):
        data = data[:i] + bytes(b ^ 0xFF for b in data[i:i + len(junk)]) + data[i + len(junk):]
    else:
        data = data[:i] + b"\n" + junk + b"\n" + data[i:]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"split{suffix}"
        path.write_bytes(data)
        try:
            samples = read_samples(str(path))
        except ConfigError as e:
            assert str(path) in str(e)
        else:
            assert all(isinstance(s, Sample) for s in samples)
