"""The README and docs/: the results block is what the raw files give, every relative link resolves, the README stays
documentation (short), and the scripts archive says what each archived script was."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.tooling
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "results_table.py"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "scripts").rglob("README.md"))]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_the_readme_results_block_is_generated_from_the_raw_files():
    proc = run("--check")
    assert proc.returncode == 0, proc.stderr + "\nfix: python3 scripts/results_table.py"


def test_check_fails_on_a_stale_block_and_a_rewrite_fixes_it(tmp_path):
    text = (ROOT / "README.md").read_text()
    stale = tmp_path / "README.md"
    stale.write_text(text.replace("<!-- results:end -->", "| a number typed in | 9.99× |\n<!-- results:end -->"))
    proc = run("--check", "--readme", str(stale))
    assert proc.returncode == 1 and "stale" in proc.stderr
    assert run("--readme", str(stale)).returncode == 0
    assert run("--check", "--readme", str(stale)).returncode == 0
    assert stale.read_text() == text


def test_the_results_block_says_where_and_when_each_table_was_measured():
    block = run("--print").stdout
    tables = re.findall(r"^\*\*(.+?)\*\*(.*)$", block, flags=re.M)
    assert tables, block
    for title, rest in tables:
        if title.startswith(("Model suite", "Training steps", "Phase 10")):
            assert re.search(r"torch \d", rest) and re.search(r"\d{4}-\d\d-\d\d", rest), (title, rest)
    names = set(re.findall(r"^\|[^|]*\|[^|]*\| ([a-zA-Z+ ]+) \| [\d.]+ \|", block, re.M))  # Phase 10's variants
    assert "fusion" in names and all(f"*{n}*:" in block for n in names), names  # explained, not only named


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (doc.parent / target).resolve()
            if (ROOT / ".practice.json").exists() and path.is_relative_to(ROOT / "docs"):
                continue  # a practice workspace copies fusion/, tests/ and scripts/, not docs/
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)


README_LINES = 350  # at most, as a learner reads it: a practice workspace's README starts with the workspace's note


def test_the_readme_is_documentation_not_a_log():
    from fusion.practice import workspace

    text = (ROOT / "README.md").read_text()
    if not workspace.is_workspace(ROOT):  # the reference: its workspaces add their note above it
        note = workspace._workspace_readme(b"", SimpleNamespace(regions=[])).decode("utf-8")  # its lines, any regions
        text = note + text
    assert len(text.splitlines()) <= README_LINES, "shorten the README (docs/measurements.md takes the history)"
    for word in ("session", "part ax", "no device time"):
        assert word not in text.lower(), word


def test_every_archived_script_has_a_line_in_the_archive_readme():
    archive = ROOT / "scripts" / "archive"
    if not archive.is_dir():
        pytest.skip("no scripts/archive")
    listed = (archive / "README.md").read_text()
    missing = [p.name for p in archive.iterdir() if p.suffix in (".py", ".sh") and p.name not in listed]
    assert not missing, f"scripts/archive/README.md lacks a line for {missing}"
