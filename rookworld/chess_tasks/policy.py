"""The P (policy) task: build, split and parse per docs/formats.md.

    "P: " + fen.ljust(90) + "M: " + moves.ljust(30) + "E: " + evals.ljust(40) + "B: " + best

Prompt = "P: " + fen + " "; the completion is the rest, padding included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .sample import PolicyTruth, Sample

FEN_WIDTH, MOVES_WIDTH, EVALS_WIDTH = 90, 30, 40
MAX_MOVES = 5  # the engine's MultiPV lines: a longer list is malformed, not more credit
UCI_RE = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")
# a plain ASCII decimal: float() also reads exponents, underscores, "nan" and other digits
NUMBER_RE = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")
MAX_COMPLETION_CHARS = 1024  # a P completion is ~125 characters; longer input is malformed


def field_starts(text: str) -> tuple[int, int, int] | None:
    """Offsets of "M:", "E:" and "B:" in "<whitespace>M:<moves>E:<evals>B:<best>": moves end
    at the first "E:", evals at the first "B:" after it; None without that shape. One pass
    of str.find, linear in the text (a lazy regex over the same shape backtracks
    quadratically without a "B:")."""
    m = len(text) - len(text.lstrip())
    if not text.startswith("M:", m):
        return None
    e = text.find("E:", m + 2)
    b = text.find("B:", e + 2) if e >= 0 else -1
    return None if b < 0 else (m, e, b)


def _fields(text: str) -> tuple[str, str, str] | None:
    """(moves, evals, best) of a P completion (`field_starts`)."""
    at = field_starts(text)
    if at is None:
        return None
    m, e, b = at
    return text[m + 2:e], text[e + 2:b], text[b + 2:]


def format_eval(pawns: float) -> str:
    """Pawns with two decimals at most, as the ROOK data prints them:
    -1.2, -2.41, 0.0, 999.99."""
    return str(round(float(pawns), 2))


def policy_prompt(fen: str) -> str:
    return "P: " + fen + " "


def policy_text(fen: str, moves, evals, best: str) -> str:
    """The exact training line. evals are floats in pawns (formatted here)."""
    return ("P: " + fen.ljust(FEN_WIDTH) + "M: " + " ".join(moves).ljust(MOVES_WIDTH)
            + "E: " + " ".join(format_eval(e) for e in evals).ljust(EVALS_WIDTH)
            + "B: " + best)


def best_of(moves, evals) -> str:
    """Ground-truth best move: the move with the highest eval (side to move's view).
    Ties go to the first listed."""
    i = max(range(len(evals)), key=lambda k: evals[k])
    return moves[i]


def policy_sample(fen: str, moves, evals, source: str = "", meta: dict | None = None) -> Sample:
    """Sample whose `B:` is argmax(evals), whatever any source file said."""
    moves, evals = tuple(moves), tuple(float(e) for e in evals)
    best = best_of(moves, evals)
    text = policy_text(fen, moves, evals, best)
    prompt = policy_prompt(fen)
    return Sample("P", prompt, text[len(prompt):],
                  PolicyTruth(fen, moves, evals, best, source), meta or {})


@dataclass(frozen=True)
class ParsedPolicy:
    """A parsed P completion. `ok` is False when a field is missing or malformed;
    `reason` then says which. Fields that did parse are kept for partial credit."""

    ok: bool
    moves: tuple[str, ...] = ()
    evals: tuple[float, ...] = ()
    best: str = ""
    reason: str = ""


def _parse_float(tok: str) -> float | None:
    """A plain decimal number (`NUMBER_RE`): Python's float() also reads 1_0, 5e-1 and nan."""
    return float(tok) if NUMBER_RE.match(tok) else None


def parse_policy(completion: str) -> ParsedPolicy:
    """Parse a P completion whitespace-tolerantly. Never raises.

    >>> parse_policy("   M: e2e4 d2d4  E: 0.3 0.25  B: e2e4").best
    'e2e4'
    """
    if not isinstance(completion, str):
        return ParsedPolicy(False, reason="not a string")
    if len(completion) > MAX_COMPLETION_CHARS:
        return ParsedPolicy(False, reason=f"longer than {MAX_COMPLETION_CHARS} characters")
    fields = _fields(completion)
    if fields is None:
        best = _lone_best(completion)
        return ParsedPolicy(False, best=best, reason="missing M:/E:/B: fields")
    move_toks, eval_toks, best_toks = (f.split() for f in fields)
    moves = tuple(t for t in move_toks if UCI_RE.match(t))
    evals = tuple(x for x in (_parse_float(t) for t in eval_toks) if x is not None)
    best = best_toks[0] if best_toks and UCI_RE.match(best_toks[0]) else ""
    reasons = []
    if not move_toks or len(moves) != len(move_toks):
        reasons.append("moves not all UCI")
    if not eval_toks or len(evals) != len(eval_toks):
        reasons.append("evals not all numbers")
    if len(move_toks) != len(eval_toks):
        reasons.append("moves and evals differ in count")
    if len(move_toks) > MAX_MOVES:
        reasons.append(f"more than {MAX_MOVES} moves")
    if not best:
        reasons.append("best move missing or not UCI")
    elif len(best_toks) > 1:
        reasons.append("text after best move")
    return ParsedPolicy(not reasons, moves, evals, best, "; ".join(reasons))


def _lone_best(text: str) -> str:
    i = text.rfind("B:")
    if i < 0:
        return ""
    toks = text[i + 2:].split()
    return toks[0] if toks and UCI_RE.match(toks[0]) else ""


def parse_policy_line(line: str) -> tuple[str, ParsedPolicy]:
    """Split a full "P: <fen> M: ... B: ..." line into (fen, parsed completion).
    The FEN is everything between "P:" and "M:", stripped. Never raises."""
    if not line.startswith("P:"):
        return "", ParsedPolicy(False, reason="line does not start with 'P:'")
    i = line.find("M:")
    if i < 0:
        return line[2:].strip(), ParsedPolicy(False, reason="missing M:/E:/B: fields")
    return line[2:i].strip(), parse_policy(line[i:])
