"""Config plumbing: the resolver for packaged data, the execution whitelist, and
validation that fails before any model is built, naming the key and the fix."""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate as _instantiate
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from .engine_settings import EngineSettings, check_backend
from .errors import ConfigError
from .files import is_hub_id

PACKAGE_DIR = Path(__file__).parent


@dataclass
class TrainConfig(EngineSettings):
    """The schema of conf/train.yaml (Hydra's ConfigStore name `train_schema`, first in its
    defaults): the engine's keys (`EngineSettings`, `ReferenceSettings`) and the run's,
    typed, so that Hydra rejects a value of the wrong type as it composes, naming the key.
    The yaml holds the values and a comment per key; range checks live in the settings
    classes (`EngineSettings.__post_init__`, run by `validate`) and in `validate` for the
    run's keys. Groups and nodes that build an object (`_target_`) are typed by that
    object's signature instead (`check_targets`)."""

    prompts_per_step: int = 16
    batch_size: int | None = None
    cpu_matmul: str = "auto"
    dry_run: bool = False
    resume: str | None = None
    eval_every: int = 0
    checkpoint_every: int = 50
    examples_to_log: int = 4
    eval_train_batch: bool = False
    model: Any = MISSING
    data: Any = MISSING
    reward: Any = MISSING
    algorithm: Any = MISSING
    kl: Any = MISSING
    optim: Any = MISSING
    sampler: Any = MISSING
    task_mix: Any = MISSING
    logger: Any = None
    strength: Any = None
    anchor: Any = None
    prompt_filter: Any = None
    guard: Any = None
    sweep: Any = None


ConfigStore.instance().store(name="train_schema", node=TrainConfig)
# instantiate() may only build the project's own callables (Hydra 1.4 execution whitelist).
WHITELIST = ["rookworld.*"]


def pkg_data(name: str) -> str:
    """${pkg_data:train.jsonl.gz} -> absolute path of a file shipped in rookworld/assets/data."""
    return str(PACKAGE_DIR / "assets" / "data" / name)


def pkg_strength(name: str) -> str:
    """${pkg_strength:openings.txt} -> absolute path of a file shipped in
    rookworld/assets/strength (the puzzle sample, the opening positions)."""
    return str(PACKAGE_DIR / "assets" / "strength" / name)


if not OmegaConf.has_resolver("pkg_data"):
    OmegaConf.register_resolver("pkg_data", pkg_data)
if not OmegaConf.has_resolver("pkg_strength"):
    OmegaConf.register_resolver("pkg_strength", pkg_strength)


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


# the checks of the train config's own keys that no typed settings object holds (the
# engine's are `EngineSettings`', the algorithm's `grpo.Algorithm`'s)
_INT_RULES = {  # key: (minimum, why)
    "prompts_per_step": (1, "an integer >= 1"),
    "eval_every": (0, "an integer >= 0"),
    "checkpoint_every": (0, "an integer >= 0"),
    "examples_to_log": (0, "an integer >= 0"),
    "data.eval_per_task": (0, "an integer >= 0 (0 = all)"),
    "sweep.replicas": (1, "an integer >= 1"),
}
_BOOL_KEYS = ("dry_run",)
_NOT_NULL = {  # parts every run builds -> what to write instead of null
    "prompt_filter": "prompt_filter.oversample=1 turns it off",
    "anchor": "anchor.coef=0 turns it off",
    "guard": "guard.kl=null turns the KL guard off; the NaN guard always runs",
    "guard.nan": "the NaN guard always runs (guard.nan.max_consecutive sets its patience)",
}


def check_ints(cfg: DictConfig, rules: dict) -> None:
    """ConfigError naming the key for each `key: (minimum, what it takes)` of rules whose
    value is not an integer at least the minimum (a bool is no integer here)."""
    for key, (low, rule) in rules.items():
        v = _get(cfg, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(f"{key} must be {rule}, got {v!r}")


def _get(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def validate(cfg: DictConfig) -> None:
    """Reject impossible settings before anything heavy is built."""
    check_targets(cfg)
    check_ints(cfg, _INT_RULES)
    try:
        s = EngineSettings.from_config(cfg)
        check_backend(s.backend, s.autocast, s.device, cfg.model.get("_target_") == HF_LOADER,
                      s.recompute_activations)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for key in _BOOL_KEYS:
        if not isinstance(_get(cfg, key), bool):
            raise ConfigError(f"{key} must be true or false, got {_get(cfg, key)!r}")
    for key, off in _NOT_NULL.items():
        if _get(cfg, key) is None:
            raise ConfigError(f"{key} cannot be null: {off}")
    fo = cfg.sweep.failed_objective
    if isinstance(fo, bool) or not isinstance(fo, int | float) or not math.isfinite(fo):
        raise ConfigError(f"sweep.failed_objective must be a finite number, got {fo!r}")
    objective = cfg.sweep.get("objective")
    if not isinstance(objective, str) or not objective.startswith("eval/"):
        raise ConfigError(f"sweep.objective={objective!r} must name a metric of the final "
                          "held-out evaluation (eval/..., e.g. eval/reward)")
    counts = ("puzzles", "random_games", "engine_games", "selfplay_games", "acpl_positions")
    if objective.startswith("eval/strength/") and not any(
            OmegaConf.select(cfg, f"strength.{k}", default=0) for k in counts):
        raise ConfigError(f"sweep.objective={objective} is a strength measure, and strength="
                          "none measures none: set strength=fast or full")
    beat, grace = (OmegaConf.select(cfg, f"sweep.{k}", default=None)
                   for k in ("heartbeat_s", "grace_s"))
    if beat is not None and grace is not None and not 0 < 2 * beat <= grace:
        raise ConfigError(f"sweep.grace_s={grace} must be at least twice sweep.heartbeat_s="
                          f"{beat} (> 0): a live trial beats several times within its grace")
    warmup = OmegaConf.select(cfg, "optim.schedule.warmup_steps", default=None)
    if isinstance(warmup, int) and warmup > cfg.steps:
        raise ConfigError(f"optim.schedule.warmup_steps={warmup} is more than steps={cfg.steps}; "
                          "lower the warmup or raise steps")
    check_model_path(cfg.model.get("path"))
    n_embd, n_head = cfg.model.get("n_embd"), cfg.model.get("n_head")
    if isinstance(n_embd, int) and isinstance(n_head, int) and (n_head < 1 or n_embd % n_head):
        raise ConfigError(f"model.n_head={n_head} must divide model.n_embd={n_embd}")
    bs = cfg.get("batch_size")
    if bs is not None:
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 2:
            raise ConfigError(f"batch_size must be an integer >= 2 or null, got {bs!r}")
        if bs % cfg.num_generations:
            raise ConfigError(f"num_generations={cfg.num_generations} must divide "
                              f"batch_size={bs}; pick a divisor or set batch_size=null")
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)  # torchrun's process count
    if world > 1 and cfg.task_mix.get("_target_") == "rookworld.episodes.Games":
        raise ConfigError("task_mix=games runs in one process: its episodes are not split "
                          "over torchrun's ranks; run it without torchrun")
    critic = OmegaConf.select(cfg, "algorithm.critic", default=None)
    if critic is not None and cfg.task_mix.get("_target_") == "rookworld.episodes.Games":
        raise ConfigError("task_mix=games scores whole games with its own per-game advantages; "
                          "a critic (algorithm=ppo) does not apply to them: use a GRPO "
                          "algorithm with task_mix=games")
    if critic is not None and cfg.get("zero_variance") == "drop":
        raise ConfigError("zero_variance=drop leaves out groups whose advantages are all 0; "
                          "a critic's (algorithm=ppo) come from its values, not the group: "
                          "set zero_variance=keep")
    if critic is not None and world > 1:
        raise ConfigError("algorithm.critic (PPO) runs in one process; run it without torchrun")
    if world > 1 and prompts_per_step(cfg) % world:
        raise ConfigError(f"{prompts_per_step(cfg)} prompts per step do not split over "
                          f"{world} ranks (torchrun); make prompts_per_step a multiple of "
                          f"{world}")
    if cfg.task_mix.get("_target_") == "rookworld.task_mix.FixedBatch" and \
            OmegaConf.select(cfg, "prompt_filter.oversample", default=1) != 1:
        raise ConfigError("task_mix=fixed_batch trains on the same prompts every step, but "
                          f"prompt_filter.oversample={cfg.prompt_filter.oversample} would pick "
                          "a part of a larger draw each step; set prompt_filter.oversample=1")
    from .grpo import FULL_ESTIMATORS
    watched = OmegaConf.select(cfg, "guard.kl.estimator", default=None)
    if str(watched).startswith("full_") and cfg.algorithm.kl_estimator not in FULL_ESTIMATORS:
        raise ConfigError(f"guard.kl.estimator={watched} needs both models' logits, which only "
                          "a full KL penalty computes: set algorithm.kl_estimator to full_forward, "
                          "full_reverse or full_symmetric, or watch k1, k2 or k3")
    if cfg.data.on_defect not in ("drop", "relabel"):
        raise ConfigError(f"data.on_defect must be drop or relabel, got {cfg.data.on_defect!r}")
    for key, dev in (("device", s.device), ("reference.device", s.reference.device)):
        if str(dev).startswith("cuda"):
            import torch
            if not torch.cuda.is_available():
                raise ConfigError(f"{key}={dev}: this torch build or machine has no CUDA "
                                  "device (torch.cuda.is_available() is False); use cpu")
    sampler = cfg.get("sampler") or {}
    for task, over in {"": sampler, **{f"per_task.{t}.": v for t, v in
                                         (sampler.get("per_task") or {}).items()}}.items():
        if (over or {}).get("legal_moves") == "mask":
            raise ConfigError(f"sampler.{task}legal_moves=mask is for evaluation and play only: "
                              "GRPO's update scores the sampled tokens under the unmasked "
                              "policy; train with legal_moves=free")
        t = (over or {}).get("temperature")
        if t is not None and isinstance(t, int | float) and t <= 0:
            raise ConfigError(f"sampler.{task}temperature={t}: training samples a group of "
                              "completions per prompt, and at temperature 0 (greedy) they are "
                              "all the same and carry no signal; use a temperature > 0 "
                              "(evaluation is greedy anyway)")


HF_LOADER = "rookworld.backends.hub.load_hf"  # model=hf: transformers' models only


def _locate(target: str, key: str):
    """The callable a whitelisted `_target_` names, imported only after the check."""
    if not any(target.startswith(w[:-1]) if w.endswith("*") else target == w
               for w in WHITELIST):
        raise ConfigError(f"{key}._target_={target!r} is outside the execution whitelist "
                          f"{WHITELIST}: configs may only build the project's own callables")
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name, None)
        module = getattr(obj, "__module__", None) or ""
        if callable(obj) and module.split(".")[0] == "rookworld":
            return obj
        break
    raise ConfigError(f"{key}._target_={target!r} does not name a callable of the project")


_SCALARS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,),
            "None": (type(None),)}


def _allowed_types(annotation) -> tuple | None:
    """The Python types a parameter annotated e.g. `float | None` accepts; None when
    the annotation is not made of plain scalars (then it is not checked here)."""
    text = annotation if isinstance(annotation, str) else getattr(
        annotation, "__name__", None) if isinstance(annotation, type) else str(annotation)
    if not text:
        return None
    names = [t.strip().removeprefix("typing.").replace("NoneType", "None")
             for t in text.replace("Optional[", "None|").rstrip("]").split("|")]
    if not all(n in _SCALARS for n in names):
        return None
    return tuple(t for n in names for t in _SCALARS[n])


def _check_node(node: DictConfig, key: str) -> None:
    target = node.get("_target_")
    fn = _locate(str(target), key)
    sig = inspect.signature(fn)
    params = sig.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for name in node:
        if str(name).startswith("_"):
            continue
        full = f"{key}.{name}" if key else str(name)
        if name not in params and not takes_any:
            raise ConfigError(f"{full} is not an option of {target}; it takes "
                              f"{', '.join(p for p in params if p != 'self') or 'nothing'}")
        value = node._get_node(name)._value()
        if name not in params or isinstance(value, DictConfig | ListConfig) or \
                OmegaConf.is_interpolation(node, name):
            continue
        allowed = _allowed_types(params[name].annotation)
        bad_bool = isinstance(value, bool) and bool not in (allowed or ())
        if allowed and (bad_bool or not isinstance(value, allowed)):
            raise ConfigError(f"{full} must be of type {params[name].annotation}, got {value!r}")


def check_targets(cfg: DictConfig, key: str = "") -> None:
    """Every `_target_` under cfg is a project callable (the execution whitelist,
    checked before anything is imported), every key beside it one of its
    arguments, and every scalar of the type its annotation names. The message
    names the full key: `optim.lr must be of type float, got 'abc'`."""
    if isinstance(cfg, DictConfig):
        if "_target_" in cfg:
            _check_node(cfg, key)
        for name in cfg:
            child = cfg._get_node(name)
            if isinstance(child, DictConfig | ListConfig):
                check_targets(child, f"{key}.{name}" if key else str(name))
    elif isinstance(cfg, ListConfig):
        for i, child in enumerate(cfg._iter_ex(resolve=False)):
            if isinstance(child, DictConfig | ListConfig):
                check_targets(child, f"{key}[{i}]")


def check_model_path(path) -> None:
    """model.path: an existing local directory, or a hub id `owner/name`."""
    if path is None:
        return
    text = str(path)
    if not is_hub_id(text) and not Path(text).expanduser().exists():
        raise ConfigError(f"model.path={text!r} does not exist (give a local model directory "
                          "or a hub id owner/name)")


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


# keys named at the top level of one command's config but under `data` in all of them
MISPLACED = {"eval_per_task": "data.eval_per_task"}


def check_argv(argv: list[str]) -> None:
    """Exit with one line naming the right key when a command line names a misplaced one
    (before Hydra, whose message would only say the key is not in the config)."""
    import sys
    for arg in argv:
        key = arg.split("=", 1)[0].lstrip("+~")
        if key in MISPLACED:
            sys.exit(f"rookworld: {key} is {MISPLACED[key]} (the same key in "
                     "python -m rookworld.train, evaluate and pretrain)")


def unread_additions(cfg: DictConfig, cfg_overrides: list[str]) -> list[str]:
    """Warnings for `+key=value` overrides: Hydra accepts `+` only for a key that the
    composed config does not have, and nothing reads such a key unless its component
    takes it, so a typo (`+data.eval_per_taks=8`) would run silently. Each warning suggests
    the nearest existing keys. No warning for a key the run checks is read: an argument of a
    `_target_` node (`check_targets`) or a per-task sampler setting (`sampler.per_task.P.*`,
    which the sampler checks)."""
    import difflib
    warnings = []
    for o in cfg_overrides:
        if not o.startswith("+") or o.startswith("++"):
            continue
        key = o[1:].split("=", 1)[0]
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if (isinstance(node, DictConfig) and "_target_" in node) or \
                re.fullmatch(r"sampler\.per_task\.[^.]+", parent):
            continue
        siblings = [str(k) for k in node.keys() if k != leaf] \
            if isinstance(node, DictConfig) else []
        near = difflib.get_close_matches(leaf, siblings, n=2)
        hint = f"; did you mean {' or '.join(f'{parent}.{n}'.lstrip('.') for n in near)}?" \
            if near else ""
        warnings.append(f"+{key} adds a key that no default config has; nothing reads it "
                        f"unless its component takes it{hint}")
    return warnings


MOVE_PARTS = ("best", "top5")  # ContinuousReward's P parts that judge which move is written


def unreached_reward(cfg: DictConfig) -> list[str]:
    """A warning when move credit keeps the reward's judgement of the moves from their own
    characters: under algorithm.credit=moves a move's characters get its legality's
    advantage (with move_quality / listed_quality, the labelled engine quality), so a reward
    part that scores which move is best or listed (ContinuousReward's best and top5; the
    graduated, binary, engine and curriculum rewards' best move) reaches only the other
    tokens."""
    if OmegaConf.select(cfg, "algorithm.credit") != "moves":
        return []
    reward = cfg.get("reward") or {}
    target = str(reward.get("_target_", ""))
    if not target:
        return []
    what = "its score of the B: move"
    if target.endswith("ContinuousReward"):
        weights = reward.get("policy_weights") or {}
        parts = [k for k in MOVE_PARTS if float(weights.get(k, 0) or 0) > 0]
        if not parts:
            return []
        what = f"its {' and '.join(parts)} part{'s' if len(parts) > 1 else ''}"
    return [f"algorithm.credit=moves gives each move's characters the advantage of its "
            f"legality: what the reward scores of the moves ({what}) reaches only the other "
            f"tokens; algorithm.credit=sequence lets it reach the moves "
            f"(algorithm.move_quality weighs the labelled engine quality under move credit)"]


# settings whose default is not what a run made before they existed did: such a run
# resumes with the value that does what it did
BEFORE_THEY_EXISTED = {"prompt_filter.oversample": 1.0}  # every drawn prompt trained on


def fill_missing(old: DictConfig, new: DictConfig, prefix: str = "") -> list[str]:
    """Add to old (a run's saved config) the settings it lacks from new, so that a run made
    before a setting existed resumes (with `BEFORE_THEY_EXISTED`'s values where listed).
    Descends only into nodes that build the same class: a node of another `_target_` keeps
    its own keys, and a choice of several objects (the loggers) keeps its own members.
    Returns the added keys."""
    added = []
    for k in new:
        if k not in old:
            old[k] = new[k]
            added.append(prefix + str(k))
        elif (OmegaConf.is_dict(old[k]) and OmegaConf.is_dict(new[k])
              and old[k].get("_target_") is not None
              and old[k].get("_target_") == new[k].get("_target_")):
            added += fill_missing(old[k], new[k], f"{prefix}{k}.")
    if not prefix:
        for path, value in before_they_existed(added).items():
            OmegaConf.update(old, path, value)
    return added


def before_they_existed(added: list[str]) -> dict:
    """The `BEFORE_THEY_EXISTED` values for a saved config that lacked the `added` keys."""
    return {path: value for path, value in BEFORE_THEY_EXISTED.items()
            if any(path == a or path.startswith(a + ".") for a in added)}
