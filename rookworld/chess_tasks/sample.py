"""The unit of data: one prompt, its reference completion and typed ground truth.

Everything that trains, scores or evaluates passes `Sample`s around; rewards
read `sample.truth` and never re-derive it from text, so the ground truth can
not be silently dropped on the way (a trap the earlier code fell into).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Task = Literal["P", "A"]


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class EnvTruth:
    """What python-chess says happens after `move` (A task)."""

    fen: str
    move: str
    history: tuple[str, ...]
    new_fen: str
    reward: str
    terminated: int
    truncated: int


@dataclass(frozen=True)
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
        """Inverse of `to_json`; raises KeyError/TypeError/ValueError on a bad row."""
        task = row["task"]
        t = dict(row["truth"])
        if task == "P":
            truth = PolicyTruth(fen=t["fen"], moves=tuple(t["moves"]),
                                evals=tuple(float(e) for e in t["evals"]),
                                best=t["best"], source=t.get("source", ""))
        elif task == "A":
            truth = EnvTruth(fen=t["fen"], move=t["move"], history=tuple(t["history"]),
                             new_fen=t["new_fen"], reward=str(t["reward"]),
                             terminated=int(t["terminated"]), truncated=int(t["truncated"]))
        else:
            raise ValueError(f"unknown task {task!r}; expected 'P' or 'A'")
        return Sample(task=task, prompt=row["prompt"], completion=row["completion"],
                      truth=truth, meta=dict(row.get("meta", {})))
