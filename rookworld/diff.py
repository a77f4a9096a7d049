"""Config diffs for review: `python -m rookworld.diff A [B] [--format text|md]`.

A and B are each one of
- a run directory or a multirun job directory: its `run_config.yaml` (the config it
  ran with, and a resume continues with; `.hydra/config.yaml` where there is none),
  the overrides of its command (`.hydra/overrides.yaml`) and of each resume
  (`.hydra-resumes/<name>/overrides.yaml`, in name order, listed as `resume: key`),
  and `outcome.json` when present,
- `defaults`: the composed conf/train.yaml with no overrides,
- an experiment name (conf/experiment/<name>.yaml): the config of
  `python -m rookworld.train experiment=<name>`,
- overrides, space-separated in one argument ("kl=none seed=3"): the config
  those overrides compose.
With one argument, B is compared with `defaults`: `python -m rookworld.diff dapo`
is an experiment's diff against the defaults. The output lists the resolved
configs' added, removed and changed keys (dotted paths) and the command-line
overrides of each side; `--format md` prints Markdown for a pull request.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import Container, OmegaConf

from .config import CONF_DIR, compose
from .run_dir import RUN_CONFIG

MISSING = object()  # a key absent on one side


@dataclass
class Side:
    """One side of a diff: what it is, its resolved config, its command's overrides and
    those of each resume of it."""

    label: str
    config: dict
    overrides: list[str]
    outcome: dict | None = None
    notes: list[str] = field(default_factory=list)
    resumes: list[list[str]] = field(default_factory=list)

    def all_overrides(self) -> list[str]:
        return with_resumes(self.overrides, self.resumes)


def resolve(cfg) -> dict:
    """An OmegaConf config as plain containers, interpolations resolved where they can be:
    one a run's saved config cannot resolve outside a live run (e.g. `${hydra:...}`)
    keeps its `${...}` text, and only that one."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        out = OmegaConf.to_container(cfg, resolve=False)
        _resolve_leaves(cfg, out)
        return out


def _resolve_leaves(node, out) -> None:
    """Replace, in `out` (node's unresolved containers), each `${...}` value by node's
    resolved value where it resolves."""
    for key, value in (out.items() if isinstance(out, dict) else enumerate(out)):
        if isinstance(value, (dict, list)):
            _resolve_leaves(node[key], value)  # a section, not an interpolation: walk it
        elif isinstance(value, str) and "${" in value:
            try:
                v = node[key]  # resolved against the whole config
                out[key] = resolve(v) if isinstance(v, Container) else v
            except Exception:  # e.g. a resolver only a live run has: the text stays
                pass


def run_config_file(path: Path) -> Path | None:
    """A run's config: run_config.yaml (what it ran with, choices such as the backend
    resolved, `steps` as a resume raised it), else Hydra's .hydra/config.yaml."""
    return next((f for f in (path / RUN_CONFIG, path / ".hydra" / "config.yaml")
                 if f.exists()), None)


def read_overrides(file: Path) -> list[str]:
    return list(yaml.safe_load(file.read_text()) or []) if file.exists() else []


def resume_overrides(path: Path) -> list[list[str]]:
    """The overrides of each command that resumed the run, in name order (Hydra's
    dated names: the order they ran); a `dry_run=true` resume changed nothing and is left
    out."""
    runs = [read_overrides(d / "overrides.yaml")
            for d in sorted((path / ".hydra-resumes").glob("*")) if d.is_dir()]
    return [r for r in runs if "dry_run=true" not in r]


def with_resumes(overrides: list[str], resumes: list[list[str]]) -> list[str]:
    """The command's overrides, then each resume's labelled `resume: steps=5` (without its
    `resume=<run>`, which names the run itself; a resume takes only steps from the rest)."""
    return overrides + [f"resume: {o}" for r in resumes for o in r
                        if split_override(o)[0].lstrip("+") != "resume"]


def from_run_dir(path: Path) -> Side:
    cfg_file = run_config_file(path)
    if cfg_file is None:
        jobs = sorted(p.parent.parent.name for p in path.glob("*/.hydra/config.yaml"))
        hint = f"; it holds multirun jobs {', '.join(jobs)}: pass one of them" if jobs else ""
        raise SystemExit(f"{path}: no {RUN_CONFIG} or .hydra/config.yaml, not a run "
                         f"directory{hint}")
    outcome_file = path / "outcome.json"
    outcome = json.loads(outcome_file.read_text()) if outcome_file.exists() else None
    return Side(str(path), resolve(OmegaConf.load(cfg_file)),
                read_overrides(path / ".hydra" / "overrides.yaml"), outcome,
                resumes=resume_overrides(path))


def from_overrides(overrides: list[str], label: str) -> Side:
    return Side(label, resolve(compose(overrides)), list(overrides))


def load_side(spec: str) -> Side:
    """A run directory, `defaults`, an experiment name, or space-separated overrides."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return from_run_dir(path)
    if spec == "defaults":
        return from_overrides([], "defaults")
    if "=" in spec:
        return from_overrides(spec.split(), spec)
    if (CONF_DIR / "experiment" / f"{spec}.yaml").exists():
        return from_overrides([f"experiment={spec}"], f"experiment={spec}")
    names = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    raise SystemExit(f"{spec!r} is not a directory, 'defaults', overrides (key=value) or an "
                     f"experiment (conf/experiment: {', '.join(names) or 'none'})")


def flatten(d: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1, 'c': {}}, 'l': [1]} -> {'a.b': 1, 'a.c': {}, 'l': [1]}: dotted paths
    to leaves; lists and empty dicts are leaves."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def diff_dicts(a: dict, b: dict) -> dict[str, list[tuple]]:
    """Flattened a vs b -> {'added': [(key, b)], 'removed': [(key, a)],
    'changed': [(key, a, b)]}, each sorted by key. A key whose value turns from a
    section into a leaf (or back) shows as that section's leaves removed or added."""
    fa, fb = flatten(a), flatten(b)
    return {
        "added": [(k, fb[k]) for k in sorted(fb.keys() - fa.keys())],
        "removed": [(k, fa[k]) for k in sorted(fa.keys() - fb.keys())],
        "changed": [(k, fa[k], fb[k]) for k in sorted(fa.keys() & fb.keys())
                    if fa[k] != fb[k]],
    }


def split_override(o: str) -> tuple[str, str]:
    """'kl=none' -> ('kl', 'none'); '+x.y=1' -> ('+x.y', '1'); '~key' -> ('~key', '')."""
    key, _, value = o.partition("=")
    return key, value


def diff_overrides(a: list[str], b: list[str]) -> dict[str, list[tuple]]:
    """Overrides as key -> value, diffed like configs (the last override of a key wins)."""
    return diff_dicts(dict(map(split_override, a)), dict(map(split_override, b)))


def fmt(v) -> str:
    """A value as it would be written on the command line (YAML flow style)."""
    if v is MISSING:
        return "-"
    if isinstance(v, str):
        return v
    return (yaml.safe_dump(v, default_flow_style=True, width=10**6)
            .strip().removesuffix("...").strip())


def rows(diff: dict[str, list[tuple]]) -> list[tuple]:
    """diff_dicts output -> [(mark, key, a, b)] sorted by key; mark ~ changed, + added
    (only in B), - removed (only in A); the absent side is MISSING."""
    out = ([("~", k, va, vb) for k, va, vb in diff["changed"]]
           + [("+", k, MISSING, v) for k, v in diff["added"]]
           + [("-", k, v, MISSING) for k, v in diff["removed"]])
    return sorted(out, key=lambda r: r[1])


def counts(diff: dict[str, list[tuple]]) -> str:
    return ", ".join(f"{len(diff[k])} {k}" for k in ("changed", "added", "removed"))


def outcome_note(side: Side) -> str:
    o = side.outcome
    if not o:
        return ""
    obj = o.get("objective")
    obj = f"{obj:.4g}" if isinstance(obj, float) else obj
    return f" ({o.get('status')} at step {o.get('step')}, objective {obj})"


def render_text(a: Side, b: Side) -> str:
    cfg = diff_dicts(a.config, b.config)
    ovr = diff_overrides(a.all_overrides(), b.all_overrides())
    out = []
    for tag, side in (("A", a), ("B", b)):
        out.append(f"{tag}: {side.label}{outcome_note(side)}")
        out += [f"   resumed: {' '.join(['python -m rookworld.train', *r])}" for r in side.resumes]
    out.append("")
    for title, diff in (("Command-line overrides", ovr), ("Resolved config", cfg)):
        out.append(f"{title}: {counts(diff)}")
        r = rows(diff)
        width = max([len(x[1]) for x in r] + [1])
        out += [f"  {m} {k:<{width}}  " + (f"{fmt(va)} -> {fmt(vb)}" if m == "~" else
                                            fmt(vb if m == "+" else va)) for m, k, va, vb in r]
        out.append("")
    if not any(cfg.values()):
        out.append("The resolved configs are identical.")
    return "\n".join(out).rstrip() + "\n"


def md_cell(v) -> str:
    return "-" if v is MISSING else "`" + fmt(v).replace("|", "\\|").replace("`", "'") + "`"


def md_table(diff: dict[str, list[tuple]]) -> list[str]:
    r = rows(diff)
    if not r:
        return []
    return ["| key | A | B |", "|---|---|---|"] + [
        f"| `{k}` | {md_cell(va)} | {md_cell(vb)} |" for _, k, va, vb in r] + [""]


def render_md(a: Side, b: Side) -> str:
    cfg = diff_dicts(a.config, b.config)
    ovr = diff_overrides(a.all_overrides(), b.all_overrides())
    out = [f"### Config diff: `{a.label}` → `{b.label}`", ""]
    for tag, side in (("A", a), ("B", b)):
        cmd = " ".join(["python -m rookworld.train", *side.overrides])
        out.append(f"- **{tag}**: `{side.label}`{outcome_note(side)}: `{cmd}`")
        out += [f"  - resumed: `{' '.join(['python -m rookworld.train', *r])}`"
                for r in side.resumes]
    out += ["", f"**Command-line overrides**: {counts(ovr)}.", "", *md_table(ovr),
            f"**Resolved config**: {counts(cfg)}.", "", *md_table(cfg)]
    if not any(cfg.values()):
        out.append("The resolved configs are identical.")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m rookworld.diff", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="run dir, multirun job dir, 'defaults', experiment name or overrides")
    ap.add_argument("b", nargs="?", help="the same kinds; omitted: A is compared with defaults")
    ap.add_argument("--format", choices=("text", "md"), default="text",
                    help="text for the terminal, md for a pull request description")
    args = ap.parse_args(argv)
    a, b = (load_side("defaults"), load_side(args.a)) if args.b is None else (
        load_side(args.a), load_side(args.b))
    text = (render_md if args.format == "md" else render_text)(a, b)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
