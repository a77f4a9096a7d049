"""Config plumbing: the resolver for packaged data, the execution whitelist, and
validation that fails before any model is built, naming the key and the fix."""

from __future__ import annotations

from pathlib import Path

from hydra.utils import instantiate as _instantiate
from omegaconf import DictConfig, OmegaConf

PACKAGE_DIR = Path(__file__).parent
# instantiate() may only build the project's own callables (Hydra 1.4 execution whitelist).
WHITELIST = ["rookworld.*"]


def pkg_data(name: str) -> str:
    """${pkg_data:train.jsonl.gz} -> absolute path of a file shipped in rookworld/assets/data."""
    return str(PACKAGE_DIR / "assets" / "data" / name)


if not OmegaConf.has_resolver("pkg_data"):
    OmegaConf.register_resolver("pkg_data", pkg_data)


class ConfigError(ValueError):
    """An impossible or conflicting setting; the message names the key."""


def instantiate(node, **kwargs):
    """Hydra's instantiate inside the project's whitelist, with a clear error for a
    `_target_` outside it."""
    try:
        return _instantiate(node, _execution_whitelist_=WHITELIST, **kwargs)
    except Exception as e:  # Hydra wraps every failure; re-raise with the key's target named
        target = node.get("_target_") if isinstance(node, DictConfig) else None
        cause = e.__cause__ or e
        if isinstance(cause, ValueError | TypeError | FileNotFoundError) and cause is not e:
            raise type(cause)(str(cause)) from e
        raise ConfigError(f"cannot build {target or 'config node'}: {e}") from e


_INT_RULES = {  # key: (minimum, why)
    "seed": (0, "a non-negative integer"),
    "steps": (1, "an integer >= 1"),
    "prompts_per_step": (1, "an integer >= 1"),
    "num_generations": (2, "an integer >= 2 (a group of one has no advantage)"),
    "micro_batch": (0, "an integer >= 0 (0 = whole batch)"),
    "eval_every": (0, "an integer >= 0"),
    "checkpoint_every": (0, "an integer >= 0"),
    "examples_to_log": (0, "an integer >= 0"),
    "reference.sync_every": (0, "an integer >= 0"),
}


def _get(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def validate(cfg: DictConfig) -> None:
    """Reject impossible settings before anything heavy is built."""
    for key, (low, rule) in _INT_RULES.items():
        v = _get(cfg, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(f"{key} must be {rule}, got {v!r}")
    bs = cfg.get("batch_size")
    if bs is not None:
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 2:
            raise ConfigError(f"batch_size must be an integer >= 2 or null, got {bs!r}")
        if bs % cfg.num_generations:
            raise ConfigError(f"num_generations={cfg.num_generations} must divide "
                              f"batch_size={bs}; pick a divisor or set batch_size=null")
    if cfg.zero_variance not in ("keep", "drop"):
        raise ConfigError(f"zero_variance must be keep or drop, got {cfg.zero_variance!r}")
    alpha = cfg.reference.sync_alpha
    if not isinstance(alpha, int | float) or not 0 < alpha <= 1:
        raise ConfigError(f"reference.sync_alpha must be in (0, 1], got {alpha!r}")
    if cfg.algorithm.kl_estimator not in ("k1", "k2", "k3", "full"):
        raise ConfigError(f"algorithm.kl_estimator must be k1, k2, k3 or full, got "
                          f"{cfg.algorithm.kl_estimator!r}")
    ni = cfg.algorithm.num_iterations
    if isinstance(ni, bool) or not isinstance(ni, int) or ni < 1:
        raise ConfigError(f"algorithm.num_iterations must be an integer >= 1, got {ni!r}")
    if cfg.data.on_defect not in ("drop", "relabel"):
        raise ConfigError(f"data.on_defect must be drop or relabel, got {cfg.data.on_defect!r}")
    if not str(cfg.device).startswith(("cpu", "cuda")):
        raise ConfigError(f"device must be cpu, cuda or cuda:N, got {cfg.device!r}")


def prompts_per_step(cfg: DictConfig) -> int:
    return cfg.batch_size // cfg.num_generations if cfg.get("batch_size") else cfg.prompts_per_step


CONF_DIR = PACKAGE_DIR.parent / "conf"


def compose(overrides: list[str] | tuple = (), config_name: str = "train") -> DictConfig:
    """The config `python -m rookworld.train <overrides>` would run with (for tests,
    notebooks and tools), without Hydra's run directory."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR)):
        return hydra_compose(config_name=config_name, overrides=list(overrides))
