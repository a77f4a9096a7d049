"""Config diffs for review: `python -m rookworld.diff A [B] [--format text|md]`.

A and B are each one of
- a run directory or a multirun job directory (its `.hydra/config.yaml` and
  `.hydra/overrides.yaml`; `outcome.json` when present),
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
from omegaconf import OmegaConf

from .config import CONF_DIR, compose

MISSING = object()  # a key absent on one side


@dataclass
class Side:
    """One side of a diff: what it is, its resolved config and its overrides."""

    label: str
    config: dict
    overrides: list[str]
    outcome: dict | None = None
    notes: list[str] = field(default_factory=list)


def resolve(cfg) -> dict:
    """An OmegaConf config as plain containers, interpolations resolved where they can be
    (a run's saved config may name resolvers, e.g. `hydra:`, that only a live run has)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # unresolvable interpolations stay as their `${...}` text
        return OmegaConf.to_container(cfg, resolve=False)


def from_run_dir(path: Path) -> Side:
    hydra_dir = path / ".hydra"
    if not (hydra_dir / "config.yaml").exists():
        jobs = sorted(p.parent.parent.name for p in path.glob("*/.hydra/config.yaml"))
        hint = f"; it holds multirun jobs {', '.join(jobs)}: pass one of them" if jobs else ""
        raise SystemExit(f"{path}: no .hydra/config.yaml, not a run directory{hint}")
    overrides_file = hydra_dir / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    outcome_file = path / "outcome.json"
    outcome = json.loads(outcome_file.read_text()) if outcome_file.exists() else None
    return Side(str(path), resolve(OmegaConf.load(hydra_dir / "config.yaml")),
                list(overrides or []), outcome)


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
    cfg, ovr = diff_dicts(a.config, b.config), diff_overrides(a.overrides, b.overrides)
    out = [f"A: {a.label}{outcome_note(a)}", f"B: {b.label}{outcome_note(b)}", ""]
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
    cfg, ovr = diff_dicts(a.config, b.config), diff_overrides(a.overrides, b.overrides)
    out = [f"### Config diff: `{a.label}` → `{b.label}`", ""]
    for tag, side in (("A", a), ("B", b)):
        cmd = " ".join(["python -m rookworld.train", *side.overrides])
        out.append(f"- **{tag}**: `{side.label}`{outcome_note(side)}: `{cmd}`")
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
