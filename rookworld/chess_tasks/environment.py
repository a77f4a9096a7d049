"""The A (environment) task per docs/formats.md, and its oracle (python-chess).

    prompt     = "A: " + fen + "+" + move + "+" + history + "+"
    completion = new_fen + "+" + reward + "+" + terminated + "+" + truncated

`history` is the last <= 10 half-moves in UCI, oldest first, including `move`.
The oracle sees only the prompt: the game is over when `board.is_game_over()`
says so on the board set from the FEN (so repetition, which needs the game's
positions, is never claimed; the 75-move rule and material are).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import chess

from .policy import NUMBER_RE
from .sample import EnvTruth, Sample

HISTORY_LEN = 10
REWARD_LEGAL, REWARD_MATE, REWARD_DRAW, REWARD_ILLEGAL = "0.001", "1.0", "0.5", "-1.0"
REWARD_VALUES = {REWARD_LEGAL: 0.001, REWARD_MATE: 1.0, REWARD_DRAW: 0.5, REWARD_ILLEGAL: -1.0}


def env_prompt(fen: str, move: str, history) -> str:
    return "A: " + fen + "+" + move + "+" + " ".join(history) + "+"


def env_completion(truth: EnvTruth) -> str:
    return "+".join([truth.new_fen, truth.reward, str(truth.terminated), str(truth.truncated)])


def legal_move(board: chess.Board, move: str | None) -> chess.Move | None:
    """The legal move that `move` names in canonical UCI, the notation of the data and of
    the rewards' legality (castling as the king's two-square move, e1g1; python-chess also
    reads the king taking its rook, e1h1, which is not canonical), else None."""
    try:
        mv = chess.Move.from_uci(move)
    except (ValueError, TypeError):
        return None
    return mv if board.is_legal(mv) and board.uci(mv) == move else None


def env_step(fen: str, move: str, history=None) -> EnvTruth:
    """The oracle: what happens when the side to move plays `move` in `fen`.

    history defaults to (move,). Raises ValueError only for an invalid FEN.
    """
    return _env_step(fen, move, tuple(history) if history is not None else (move,))


@lru_cache(maxsize=64)  # a loader checks a row, then builds its sample: the same question twice
def _env_step(fen: str, move: str, history: tuple[str, ...]) -> EnvTruth:
    board = chess.Board(fen)
    mv = legal_move(board, move)
    if mv is None:
        return EnvTruth(fen, move, history, board.fen(), REWARD_ILLEGAL, 0, 1)
    board.push(mv)
    if board.is_checkmate():
        reward = REWARD_MATE
    elif board.is_game_over():
        reward = REWARD_DRAW
    else:
        reward = REWARD_LEGAL
    return EnvTruth(fen, move, history, board.fen(), reward, int(board.is_game_over()), 0)


def env_sample(fen: str, move: str, history=None, meta: dict | None = None) -> Sample:
    truth = env_step(fen, move, history)
    return Sample("A", env_prompt(fen, move, truth.history), env_completion(truth), truth,
                  meta or {})


@dataclass(frozen=True)
class ParsedEnv:
    """A parsed A completion; fields that parsed are kept for partial credit."""

    ok: bool
    new_fen: str = ""
    fen_valid: bool = False
    reward: float | None = None
    terminated: int | None = None
    truncated: int | None = None
    reason: str = ""


def _flag(tok: str) -> int | None:
    tok = tok.strip()
    return int(tok) if tok in ("0", "1") else None


def _reward(tok: str) -> float | None:
    tok = tok.strip()
    if not NUMBER_RE.match(tok):  # float() would read 5e-1 or 0_1.0 as 0.5 and 1.0
        return None
    x = float(tok)
    return x if x in REWARD_VALUES.values() else None


def parse_env(completion: str) -> ParsedEnv:
    """Parse an A completion: four '+'-separated fields. Never raises.

    >>> parse_env("8/8/8/8/8/8/8/K6k w - - 0 1+0.5+1+0").terminated
    1
    """
    if not isinstance(completion, str):
        return ParsedEnv(False, reason="not a string")
    parts = completion.split("+")
    fen = parts[0].strip()
    try:  # all six fields: python-chess fills in the missing ones of a shorter FEN
        chess.Board(fen)
        fen_valid = len(fen.split()) == 6
    except ValueError:
        fen_valid = False
    reward = _reward(parts[1]) if len(parts) > 1 else None
    terminated = _flag(parts[2]) if len(parts) > 2 else None
    truncated = _flag(parts[3]) if len(parts) > 3 else None
    reasons = []
    if len(parts) != 4:
        reasons.append(f"{len(parts)} '+'-fields, expected 4")
    if not fen_valid:
        reasons.append("FEN does not parse")
    if reward is None:
        reasons.append("reward not one of 0.001/1.0/0.5/-1.0")
    if terminated is None or truncated is None:
        reasons.append("flags not 0/1")
    return ParsedEnv(not reasons, fen, fen_valid, reward, terminated, truncated,
                     "; ".join(reasons))


def split_env_line(line: str) -> tuple[str, str] | None:
    """Split a full A line (with or without "A: ") into (prompt, completion):
    the prompt ends at the third '+'. None when it has fewer than 3."""
    if not line.startswith("A: "):
        line = "A: " + line
    idx, pos = 0, -1
    for _ in range(3):
        pos = line.find("+", idx)
        if pos < 0:
            return None
        idx = pos + 1
    return line[:idx], line[idx:]
