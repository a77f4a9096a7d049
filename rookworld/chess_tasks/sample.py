"""The unit of data: one prompt, its reference completion and typed ground truth.

Everything that trains, scores or evaluates passes `Sample`s around; rewards
read `sample.truth` and never re-derive it from text, so the ground truth can
not be silently dropped on the way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Task = Literal["P", "A"]


@dataclass(frozen=True, slots=True)
class PolicyTruth:
    """Engine analysis of a position (P task).

    moves/evals: the engine's MultiPV lines (<= 5), evals in pawns from the
    side to move's point of view; best: argmax(evals), never a stored `B:`.
    source: how the label was made, e.g. "stockfish depth=8" or "rook_val_500".
    """

    fen: str
    moves: tuple[str, ...]
    evals: tuple[float, ...]
    best: str
    source: str = ""


@dataclass(frozen=True, slots=True)
class EnvTruth:
    """What python-chess says happens after `move` (A task)."""

    fen: str
    move: str
    history: tuple[str, ...]
    new_fen: str
    reward: str
    terminated: int
    truncated: int


@dataclass(frozen=True, slots=True)
class Sample:
    """task: "P" or "A"; prompt: what the model sees; completion: the exact
    reference answer (the text the model should write after the prompt);
    truth: typed ground truth; meta: free-form provenance (phase, game id)."""

    task: Task
    prompt: str
    completion: str
    truth: PolicyTruth | EnvTruth
    meta: dict = field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        return {"task": self.task, "prompt": self.prompt, "completion": self.completion,
                "truth": asdict(self.truth), "meta": dict(self.meta)}

    @staticmethod
    def from_json(row: dict) -> Sample:
        """Inverse of `to_json`; raises KeyError/TypeError/ValueError on a bad row,
        including a field of the wrong type (a FEN that is a list, a move list of lists)."""
        task = row["task"]
        t = dict(row["truth"])
        if task == "P":
            truth = PolicyTruth(fen=_str(t, "fen"), moves=_strs(t, "moves"),
                                evals=tuple(float(e) for e in _seq(t, "evals")),
                                best=_str(t, "best"), source=str(t.get("source", "")))
        elif task == "A":
            truth = EnvTruth(fen=_str(t, "fen"), move=_str(t, "move"),
                             history=_strs(t, "history"), new_fen=_str(t, "new_fen"),
                             reward=str(t["reward"]), terminated=int(t["terminated"]),
                             truncated=int(t["truncated"]))
        else:
            raise ValueError(f"unknown task {task!r}; expected 'P' or 'A'")
        return Sample(task=task, prompt=_str(row, "prompt"), completion=_str(row, "completion"),
                      truth=truth, meta=dict(row.get("meta", {})))


def _str(d: dict, key: str) -> str:
    if not isinstance(d[key], str):
        raise TypeError(f"{key}: expected a string, got {type(d[key]).__name__}")
    return d[key]


def _seq(d: dict, key: str) -> list:
    if not isinstance(d[key], (list, tuple)):
        raise TypeError(f"{key}: expected a list, got {type(d[key]).__name__}")
    return d[key]


def _strs(d: dict, key: str) -> tuple[str, ...]:
    items = _seq(d, key)
    if not all(isinstance(x, str) for x in items):
        raise TypeError(f"{key}: expected a list of strings")
    return tuple(items)
