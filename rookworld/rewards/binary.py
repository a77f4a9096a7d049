"""reward=binary: the harsh perfect-or-nothing baseline."""

from __future__ import annotations

from .base import PartsReward


class BinaryReward(PartsReward):
    """1 when the completion is fully right, else `wrong`.

    P: fully right = well-formed (`format`) and the `B:` move is the engine's
    best (`best`: highest eval, ties all count). A: the whole completion equals
    the oracle's text (`exact`). Range: (wrong, 1.0).

    >>> from rookworld.chess_tasks import env_sample
    >>> s = env_sample("8/8/8/8/8/8/4k3/K7 w - - 0 1", "a1b1")
    >>> BinaryReward()(s, s.completion).score, BinaryReward()(s, s.completion + " ").score
    (1.0, -1.0)
    """

    def __init__(self, wrong: float = -1.0):
        if not wrong < 1.0:
            raise ValueError(f"reward.wrong={wrong} must be below 1.0, the score when right")
        self.wrong = float(wrong)
        self.range = (self.wrong, 1.0)

    def policy_score(self, parts: dict[str, float]) -> float:
        return 1.0 if parts["format"] == 1.0 and parts["best"] == 1.0 else self.wrong

    def env_score(self, parts: dict[str, float]) -> float:
        return 1.0 if parts["exact"] == 1.0 else self.wrong
