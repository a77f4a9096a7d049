"""Chess task formats (P and A), parsers, the environment oracle and the engine pool."""

from .environment import (
    ParsedEnv,
    env_completion,
    env_prompt,
    env_sample,
    env_step,
    legal_move,
    parse_env,
)
from .policy import ParsedPolicy, best_of, parse_policy, policy_prompt, policy_sample, policy_text
from .sample import EnvTruth, PolicyTruth, Sample

__all__ = ["EnvTruth", "ParsedEnv", "ParsedPolicy", "PolicyTruth", "Sample", "best_of",
           "env_completion", "env_prompt", "env_sample", "env_step", "legal_move", "parse_env",
           "parse_policy", "policy_prompt", "policy_sample", "policy_text"]
