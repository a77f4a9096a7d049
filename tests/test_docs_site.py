"""The documentation site (mkdocs.yml, mkdocs-material) builds with --strict: every page is in
the nav and every link resolves inside docs/; docs/index.md lists every page."""

import os
import re
import subprocess
import sys

import pytest
import yaml
from test_text import ROOT

DOCS = ROOT / "docs"


def build(config, site) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[dev]' "
                                         "installs mkdocs-material, which brings it")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(config), "--site-dir", str(site)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)


def test_the_site_builds_strictly(tmp_path):
    proc = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "site" / "guides" / "rewards" / "index.html").exists()


def test_a_link_out_of_the_docs_fails_the_strict_build(tmp_path):
    """The control: the site's settings turn a link that leaves docs/ into a failure."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n\nSee [train](../rookworld/train.py).\n")
    config.update(docs_dir=str(tmp_path / "docs"), nav=["index.md"])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    proc = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0 and "../rookworld/train.py" in proc.stderr


def test_the_index_lists_every_page():
    linked = set(re.findall(r"\]\(([^)#]+\.md)\)", (DOCS / "index.md").read_text()))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")} - {"index.md"}
    assert pages == linked
