"""The `reward` config group: one module per reward family \
(docs/formats.md, "What the rewards measure").

    reward=binary      binary.BinaryReward          +1 fully right, -1 otherwise
    reward=graduated   graduated.GraduatedReward    partial-credit ladder
    reward=continuous  continuous.ContinuousReward  the same parts, linearly
    reward=legal_moves continuous.ContinuousReward  P weighted on legality only (default)
    reward=engine      stockfish.EngineReward       P scored by the engine pool
    reward=graduated_curriculum  curriculum.CurriculumReward  graduated -> binary

The measured parts (parts.py) are shared with the evaluator.
"""

from .base import PartsReward, Reward, Scored
from .binary import BinaryReward
from .continuous import ContinuousReward
from .curriculum import BlendReward, CurriculumReward
from .graduated import GraduatedReward
from .parts import ENV_PARTS, EVAL_CAP, POLICY_PARTS, env_parts, fen_similarity, policy_parts
from .stockfish import EngineReward

__all__ = ["ENV_PARTS", "EVAL_CAP", "POLICY_PARTS", "BinaryReward", "BlendReward",
           "ContinuousReward", "CurriculumReward", "EngineReward", "GraduatedReward",
           "PartsReward", "Reward", "Scored", "env_parts", "fen_similarity", "policy_parts"]
