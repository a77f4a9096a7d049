"""Every `python -m rookworld.<train|pretrain|evaluate|data.generate> ...` command written in
the README, docs/, benchmarks/ and experiments/ composes as written: its groups, options
and keys exist (a command with a <placeholder> is composed without that argument)."""

import re
import shlex

import pytest
from test_text import ROOT, tracked_text

from rookworld.config import compose

CONFIG_OF = {"train": "train", "pretrain": "pretrain", "evaluate": "evaluate",
             "data.generate": "generate"}
COMMAND = re.compile(r"python -m rookworld\.(train|pretrain|evaluate|data\.generate)\b(.*)")
FLAGS = {"-m", "--multirun", "--help", "--hydra-help", "--info"}
SWEEPS = ("tag(", "interval(", "choice(", "range(", "glob(")  # the sweeper's, not compose's
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*")  # seed=S, autocast=X, resume=RUN_DIR


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, config name, overrides) of each command in the tracked Markdown files."""
    found = []
    for path in tracked_text():
        if path.suffix != ".md":
            continue
        lines = path.read_text(errors="replace").splitlines()
        for n, line in enumerate(lines):
            m = COMMAND.search(line)
            if not m:
                continue
            text, k = m.group(2), n
            while text.rstrip().endswith("\\") and k + 1 < len(lines):  # continued lines
                k += 1
                text = text.rstrip()[:-1] + " " + lines[k].strip()
            text = re.split(r"\s#|`", text)[0]  # a comment, or the end of inline code
            try:
                words = shlex.split(text)
            except ValueError:
                continue  # prose around the command, not the command
            found.append((f"{path.relative_to(ROOT)}:{n + 1}", CONFIG_OF[m.group(1)],
                          overrides(words)))
    return found


def overrides(words: list[str]) -> list[str]:
    """The Hydra overrides among a command's words: no flags, no Hydra-only or placeholder
    arguments, the first value of a multirun list."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w == "--cfg":
            skip = True  # its argument (job, hydra, all)
            continue
        if w in FLAGS or w.startswith(("hydra.", "hydra/", "|", ">", "&")) or "=" not in w:
            if w.startswith(("|", ">", "&")):
                break
            continue
        if w.startswith("[") and w.endswith("]"):  # an optional argument, shown in brackets
            w = w[1:-1]
        key, value = w.split("=", 1)
        if "<" in w or "..." in w or PLACEHOLDER.fullmatch(value) or value.startswith(SWEEPS):
            continue
        if "," in value and not value.startswith(("[", "{", "'", '"')):
            value = value.split(",")[0]  # a multirun sweep: its first value
        out.append(f"{key}={value}")
    return out


COMMANDS = documented_commands()


def test_the_documents_hold_commands():
    assert len(COMMANDS) > 30


@pytest.mark.parametrize(("where", "config", "args"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_documented_command_composes(where, config, args):
    compose(args, config_name=config)


def test_help_says_what_the_program_does_before_the_groups():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "rookworld.train", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    first, groups = out.index("rookworld.train: GRPO"), out.index("== Configuration groups ==")
    assert first < groups and "algorithm: dapo, dr_grpo, grpo, gspo, ppo" in out
