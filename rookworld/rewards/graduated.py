"""reward=graduated: partial credit on a ladder of levels (docs/formats.md)."""

from __future__ import annotations

from .base import PartsReward


class GraduatedReward(PartsReward):
    """Scores -malformed_penalty, 0.2, 0.4, 0.6, 0.8 or 1.0: the first rung,
    from the top, whose condition the parts (parts.py) meet.

    P (policy):
      1.0 exact: well-formed, best right, every listed move legal, top5 == 1
          (exactly the engine's moves) and eval_error <= eval_tolerance
      0.8 near perfect: well-formed and best right
      0.6 most fields right: well-formed, best move legal, legal >= most_share
          and top5 >= most_share
      0.4 some fields right: well-formed, and best move legal or top5 >= some_share
      0.2 well-formed
      -malformed_penalty: not well-formed (format == 0)

    A (environment), with k = fen_exact + reward + flags (0..3):
      1.0 exact: the completion equals the oracle's text
      0.8 near perfect: well-formed, reward and flags right and
          fen_similarity >= near_similarity (an exact FEN has similarity 1)
      0.6 most fields right: well-formed and k >= 2
      0.4 some fields right: well-formed and k >= 1
      0.2 well-formed
      -malformed_penalty: not well-formed

    Every condition only asks a part to be high enough (eval_error low
    enough), so a completion whose parts are all no better never scores
    higher. Range: (-malformed_penalty, 1.0).
    """

    def __init__(self, malformed_penalty: float = 0.3, eval_tolerance: float = 0.5,
                 most_share: float = 0.6, some_share: float = 0.2,
                 near_similarity: float = 0.9):
        if malformed_penalty < 0:
            raise ValueError(f"reward.malformed_penalty={malformed_penalty} must be >= 0 so "
                             "a malformed completion never beats a well-formed one")
        for name, x in (("most_share", most_share), ("some_share", some_share),
                        ("near_similarity", near_similarity)):
            if not 0.0 <= x <= 1.0:
                raise ValueError(f"reward.{name}={x} must lie in [0, 1]")
        if eval_tolerance < 0:
            raise ValueError(f"reward.eval_tolerance={eval_tolerance} must be >= 0 (pawns)")
        self.malformed_penalty = float(malformed_penalty)
        self.eval_tolerance = float(eval_tolerance)
        self.most_share, self.some_share = float(most_share), float(some_share)
        self.near_similarity = float(near_similarity)
        self.range = (-self.malformed_penalty, 1.0)

    def policy_score(self, p: dict[str, float]) -> float:
        if p["format"] != 1.0:
            return -self.malformed_penalty
        if (p["best"] == 1.0 and p["legal"] == 1.0 and p["top5"] == 1.0
                and p["eval_error"] <= self.eval_tolerance):
            return 1.0
        if p["best"] == 1.0:
            return 0.8
        if (p["best_legal"] == 1.0 and p["legal"] >= self.most_share
                and p["top5"] >= self.most_share):
            return 0.6
        if p["best_legal"] == 1.0 or p["top5"] >= self.some_share:
            return 0.4
        return 0.2

    def env_score(self, p: dict[str, float]) -> float:
        if p["exact"] == 1.0:
            return 1.0
        if p["format"] != 1.0:
            return -self.malformed_penalty
        if p["reward"] == 1.0 and p["flags"] == 1.0 and p["fen_similarity"] >= self.near_similarity:
            return 0.8
        right = p["fen_exact"] + p["reward"] + p["flags"]
        if right >= 2:
            return 0.6
        if right >= 1:
            return 0.4
        return 0.2
