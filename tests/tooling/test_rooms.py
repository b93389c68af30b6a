"""The rooms of the suite import one way, and stay small.

Read from the source (``ast``: every import, function-level ones too), so
the checks need no vLLM. The vocabulary (``fuzz.model``) is the lowest room;
the checks (``invariants``) and the strategies read only it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ("fuzz", "invariants", "strategies", "engine")

# Room -> the suite packages its modules may import (their own included).
ALLOWED = {
    "fuzz.model": ("fuzz.model",),
    "invariants": ("fuzz.model", "invariants"),
    # The known-bug registry is a table strategies read to steer clear of
    # bugs vLLM has not fixed yet.
    "strategies": ("fuzz.model", "strategies", "fuzz.known_bugs"),
}

MAX_LINES = 600
# Mostly tables of facts: allowed past MAX_LINES.
DATA_TABLES = {"fuzz/known_bugs.py", "fuzz/adapter/_planted.py"}
# Past MAX_LINES today, each held to its size until it is split by job.
CEILINGS: dict[str, int] = {}


def _sources() -> list[Path]:
    return sorted(p for pkg in SUITE for p in (ROOT / pkg).rglob("*.py"))


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _suite_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found.update(n for n in names if n.split(".")[0] in SUITE)
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _wrong_imports(path: Path, allowed: tuple[str, ...]) -> set[str]:
    """The suite modules ``path`` imports that ``allowed`` does not admit.
    ``from fuzz.adapter import _contents`` names both the package and the
    module: a name is fine when it, or a module it names, is allowed."""
    names = _suite_imports(path)
    bad = {n for n in names if not _within(n, allowed)}
    return {n for n in bad if not any(_within(m, allowed) for m in names if m.startswith(n + "."))}


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_a_room_imports_only_what_is_below_it(room: str) -> None:
    wrong = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in _sources()
        if _within(_module(path), (room,)) and (bad := _wrong_imports(path, ALLOWED[room]))
    }
    assert not wrong, f"{room} may import only {ALLOWED[room]}; these reach elsewhere: {wrong}"


def test_the_import_rule_sees_a_wrong_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from fuzz.model import StepObservation\n\ndef f():\n    from fuzz.adapter import SchedulerHarness\n")
    assert _wrong_imports(source, ALLOWED["invariants"]) == {"fuzz.adapter", "fuzz.adapter.SchedulerHarness"}
    copied = tmp_path / "k.py"
    copied.write_text("from fuzz.adapter._contents import BlockContents\nfrom fuzz.adapter import _reports\n")
    assert _wrong_imports(copied, ("fuzz.adapter._contents", "fuzz.adapter._reports")) == set()
    assert _wrong_imports(copied, ALLOWED["invariants"]) == {
        "fuzz.adapter", "fuzz.adapter._contents", "fuzz.adapter._contents.BlockContents", "fuzz.adapter._reports"
    }


def test_sources_stay_small() -> None:
    long = {}
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        n = len(path.read_text().splitlines())
        limit = CEILINGS.get(rel, MAX_LINES)
        if rel not in DATA_TABLES and n > limit:
            long[rel] = (n, limit)
    assert not long, f"sources over their line limit (lines, limit): split them by job: {long}"
