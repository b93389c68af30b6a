"""The README and docs/ speak of the project only, and their links resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Words about how or where the suite was built, and paths a user does not have.
FORBIDDEN = re.compile(r"\.\./shared|/work/|this session|workplace|session\(s\) that wrote", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_speaks_of_the_project_only(page: Path) -> None:
    hits = [(n, line.strip()[:120]) for n, line in enumerate(page.read_text().splitlines(), 1) if FORBIDDEN.search(line)]
    assert not hits, f"{page.relative_to(ROOT)}: {hits}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = [
        target
        for target in LINK.findall(page.read_text())
        if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists()
    ]
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files {broken}"


def test_the_readme_starts_where_a_user_starts() -> None:
    """The README is short: what the suite is, set-up, findings, commands, the
    map; everything else lives in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move detail into docs/"


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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_table_cell_is_a_paragraph(page: Path) -> None:
    long = [(n, len(cell), cell[:60]) for n, cell in _table_cells(page.read_text()) if len(cell) > 400]
    assert not long, f"{page.relative_to(ROOT)}: table cells over 400 characters (line, length, start): {long}"
