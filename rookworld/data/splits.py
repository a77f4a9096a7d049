"""Train/eval split by a stable hash of the position, so a position never lands
in both splits whatever the move counters, the task or the order of the data."""

from __future__ import annotations

import hashlib


def position_key(fen: str) -> str:
    """The FEN without its move counters (placement, side, castling, en passant)."""
    return " ".join(fen.split()[:4])


def split_hash(fen: str) -> float:
    """A number in [0, 1) fixed by the position: sha1 of `position_key(fen)`."""
    digest = hashlib.sha1(position_key(fen).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(fen: str, eval_fraction: float) -> str:
    """"eval" for about `eval_fraction` of positions, else "train"."""
    return "eval" if split_hash(fen) < eval_fraction else "train"


def split_samples(samples, eval_fraction: float) -> dict[str, list]:
    """Samples (anything with .truth.fen) -> {"train": [...], "eval": [...]}, order kept."""
    out: dict[str, list] = {"train": [], "eval": []}
    for s in samples:
        out[split_of(s.truth.fen, eval_fraction)].append(s)
    return out
