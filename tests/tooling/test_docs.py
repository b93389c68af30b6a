"""The README, docs/, the changelog and the scripts speak of the project only;
links resolve; doc pages stay short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
# What a user runs: the scripts and the CI entry points and examples.
SCRIPT_DIRS = ("scripts", ".ci", "ci-examples")
SCRIPTS = sorted(
    p
    for d in SCRIPT_DIRS
    for p in (ROOT / d).rglob("*")
    if p.is_file() and "__pycache__" not in p.parts
)
# Paths a user does not have: temp and home directories, the directory a
# checkout happened to live in. (`$TMPDIR/...`, `~/src/vllm`, `/dev/null` and
# `#!/usr/bin/env` are portable; test_setup_portable.py checks set-up files
# for local hosts and `file:` URLs too.)
ABSOLUTE_PATH = r"(?<![\w.$~{}-])/(?:tmp|var/tmp|var/folders|private/var|home|root|Users|work|mnt|media|srv|opt)/"
# Words about how or where the suite was built.
BUILD_WORDS = (
    r"\.\./shared|this session|workplace|session\(s\) that wrote"
    r"|\bthis (?:machine|box)\b|\b(?:development|build|device) machine\b|no GPU was available"
)
FORBIDDEN = re.compile(f"{ABSOLUTE_PATH}|{BUILD_WORDS}", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")

# A doc page a reader can take in at once; history goes to CHANGELOG.md.
MAX_DOC_LINES = 300
# docs/repros/ holds generated vLLM test files, not pages: their length is
# the repro writer's (tests/findings bound them).
NOT_PAGES = ("docs/repros/",)
DOC_FILES = sorted(
    p
    for p in (ROOT / "docs").rglob("*")
    if p.is_file() and not str(p.relative_to(ROOT)).startswith(NOT_PAGES)
)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def forbidden_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line naming a path or the build of the suite."""
    return [(n, line.strip()[:120]) for n, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)]


@pytest.mark.parametrize("page", PAGES + SCRIPTS, ids=_rel)
def test_a_page_or_script_speaks_of_the_project_only(page: Path) -> None:
    hits = forbidden_lines(page.read_text(errors="replace"))
    assert not hits, f"{_rel(page)}: {hits}"


@pytest.mark.parametrize("line", [
    "python -m fuzz run --coverage --db /tmp/cov5/covdb",
    "# installs into /home/dev/wheels first",
    "`/work/main/fuzz-out/report.md`",
    "see ../shared/notes.md",
    "Measured on this machine while other jobs ran",
    "on the 2-core development machine",
    "a device machine without network needs wheels placed there beforehand",
    "prepared for an H200, not yet run: no GPU was available when it was written",
])
def test_the_scan_catches_a_planted_line(line: str) -> None:
    assert forbidden_lines(f"# fine\n{line}\n") == [(2, line.strip()[:120])]


@pytest.mark.parametrize("line", [
    "#!/usr/bin/env bash",
    'kill "${pids[@]}" 2>/dev/null',
    "cache under $TMPDIR/vllm-env-cache/<version>/",
    "python -m fuzz matrix --vllm-src ~/src/vllm",
    "[PR 51468](https://github.com/vllm-project/vllm/pull/51468)",
    'work="$(mktemp -d)"; cd "$work/vllm-0.33.0"',
    "`--report-dir fuzz-out/cov/campaign`",
    "Session-wide, once: build the tiny model",
])
def test_the_scan_passes_a_portable_line(line: str) -> None:
    assert forbidden_lines(line) == []


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = [
        target
        for target in LINK.findall(page.read_text())
        if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists()
    ]
    assert not broken, f"{_rel(page)}: links to missing files {broken}"


def test_the_readme_starts_where_a_user_starts() -> None:
    """The README is short: what the suite is, set-up, findings, commands, the
    map; everything else lives in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move detail into docs/"


@pytest.mark.parametrize("doc", DOC_FILES, ids=_rel)
def test_a_doc_says_what_is_true_now_in_few_lines(doc: Path) -> None:
    n = len(doc.read_text().splitlines())
    assert n <= MAX_DOC_LINES, (
        f"{_rel(doc)} has {n} lines (at most {MAX_DOC_LINES}): keep the current figures, each with its "
        "command and commit, and move history to CHANGELOG.md or leave it to the git log"
    )


def test_the_scans_read_the_pages_and_scripts() -> None:
    rel = {_rel(p) for p in DOC_FILES}
    assert {"docs/figures.md", "docs/coverage.md", "docs/known-bugs.md"} <= rel, sorted(rel)
    assert not any(r.startswith(NOT_PAGES) for r in rel)
    assert {"scripts/engine-cuda.sh", ".ci/run", "ci-examples/buildkite-nightly.yml"} <= {_rel(p) for p in SCRIPTS}


def _table_cells(text: str) -> list[tuple[int, str]]:
    cells: list[tuple[int, str]] = []
    in_fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence and line.lstrip().startswith("|"):
            cells += [(n, cell.strip()) for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    return cells


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_table_cell_is_a_paragraph(page: Path) -> None:
    long = [(n, len(cell), cell[:60]) for n, cell in _table_cells(page.read_text()) if len(cell) > 400]
    assert not long, f"{_rel(page)}: table cells over 400 characters (line, length, start): {long}"
