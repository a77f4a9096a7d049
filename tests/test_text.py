"""Tracked text describes the project as it is: no diary words (names of work periods, the
project's own ticket numbers), no Markdown link or cited repository path that leads nowhere."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = (".md", ".py", ".yaml", ".yml", ".c", ".h", ".sh", ".toml")
# the words are spelled in parts so that this file does not match itself; the pytest fixture
# scope (a quoted word) is code, not a diary
WORK_PERIOD, TICKET, ITEM = "sess" + "ions?", "iss" + "ues?", "work[- ]" + "items?"
DIARY = re.compile(rf"\b{WORK_PERIOD}\b(?!\")|\b{TICKET} #?\d+|\b{ITEM}\b", re.IGNORECASE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"\b(?:docs|benchmarks|experiments|rookworld|conf|tests|scripts|fuzz|\.ci)/"
                   r"[\w./-]+\.(?:md|py|yaml|json|png|c|txt|gz|jsonl|sh)\b")


def tracked_text() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / f for f in out if f.endswith(TEXT) and (ROOT / f).is_file()]


def diary_lines(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
            if DIARY.search(line)]


def dead_references(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    dead = []
    if path.suffix == ".md":
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            if not (path.parent / target.split("#")[0]).exists():
                dead.append(f"{path.relative_to(ROOT)}: link {target}")
    for cited in CITED.findall(text):
        if not (ROOT / cited).exists():
            dead.append(f"{path.relative_to(ROOT)}: path {cited}")
    return dead if path.name != "test_text.py" else []


def test_no_tracked_text_reads_like_a_diary():
    found = [hit for p in tracked_text() for hit in diary_lines(p)]
    assert not found, "\n".join(found)


def test_every_link_and_cited_path_exists():
    found = [hit for p in tracked_text() for hit in dead_references(p)]
    assert not found, "\n".join(found)


def test_the_checks_catch_what_they_look_for(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    md = tmp_path / "a.md"
    md.write_text("As of " + "sess" + "ion 12 (" + "iss"
                  + "ue 7): see [x](missing.md), [ok](a.md), "
                  "[web](https://example.org) and docs/none.md\n")
    assert len(diary_lines(md)) == 1
    assert dead_references(md) == ["a.md: link missing.md", "a.md: path docs/none.md"]
    md.write_text('@pytest.fixture(scope="' + "sess" + 'ion")\n')
    assert diary_lines(md) == []
