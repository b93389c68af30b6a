"""The test house: a test module imports no other test module, and no
script imports from ``tests/``.

What test modules share lives in non-test modules beside them
(``tests/support/``, ``tests/invariants/planted_cases.py``,
``tests/findings/repro_checks.py``, ``tests/known_bugs/runs.py``, ...):
importing a ``test_*`` module loads all of its tests and set-up for one
table or function, ties one test file's edits to another's results, and
hides what is shared. A script imports from ``fuzz/`` or holds what it
needs: the test tree is not its library. Read from the source (``ast``: every import, function-level ones
too); vLLM's own test files under ``tests/known_bugs/upstream/`` import
vLLM's ``tests`` package and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "tests" / "known_bugs" / "upstream"


def _imports(source: str, package: str) -> set[str]:
    """Every module ``source`` imports, and every ``module.name`` a
    ``from module import name`` may name; relative imports resolved
    against ``package``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def imported_test_modules(source: str, package: str) -> set[str]:
    """The ``test_*`` modules (or names) ``source`` imports."""
    return {name for name in _imports(source, package) if any(p.startswith("test_") for p in name.split("."))}


def tests_imported(source: str) -> set[str]:
    """What ``source`` imports from the ``tests`` package."""
    return {name for name in _imports(source, "") if name == "tests" or name.startswith("tests.")}


def _package(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).parent.parts)


def _test_tree() -> list[Path]:
    return sorted(p for p in (ROOT / "tests").rglob("*.py") if UPSTREAM not in p.parents)


def _scripts() -> list[Path]:
    return sorted((ROOT / "scripts").glob("*.py"))


def test_no_test_module_imports_another() -> None:
    found = {}
    for path in _test_tree():
        if names := imported_test_modules(path.read_text(), _package(path)):
            found[str(path.relative_to(ROOT))] = sorted(names)
    assert not found, f"test modules imported (move what is shared into a non-test module beside them): {found}"


def test_no_script_imports_a_test_module_or_the_tests_package() -> None:
    found = {}
    for path in _scripts():
        source = path.read_text()
        if names := imported_test_modules(source, "") | tests_imported(source):
            found[str(path.relative_to(ROOT))] = sorted(names)
    assert not found, f"scripts importing from tests/ (use fuzz/ or hold it in the script): {found}"


def test_the_trees_checked_are_there() -> None:
    # repro_sizes.py runs a test module's test: the script most likely to import one.
    assert len(_test_tree()) > 50 and ROOT / "scripts" / "repro_sizes.py" in _scripts(), (len(_test_tree()), _scripts())


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        ("from tests.invariants import test_table\n", "tests.tooling", {"tests.invariants.test_table"}),
        ("import tests.findings.test_steps_only_repro as steps\n", "tests.tooling",
         {"tests.findings.test_steps_only_repro"}),
        ("def f():\n    from tests.findings.test_upstream_repro import CASES\n", "tests.tooling",
         {"tests.findings.test_upstream_repro", "tests.findings.test_upstream_repro.CASES"}),
        ("from . import test_cli\n", "tests.tooling", {"tests.tooling.test_cli"}),
        ("from .test_cli import run\n", "tests.tooling", {"tests.tooling.test_cli", "tests.tooling.test_cli.run"}),
        ("from tests.support.search import planted_failure\nimport json\n", "tests.tooling", set()),
    ],
)
def test_a_test_module_import_is_seen_in_every_form(source: str, package: str, expected: set[str]) -> None:
    assert imported_test_modules(source, package) == expected


def test_a_script_import_from_tests_is_seen() -> None:
    assert tests_imported("import os\n\ndef main():\n    import tests.findings.repro_checks as checks\n") == {
        "tests.findings.repro_checks"
    }
    assert tests_imported("from tests import support\n") == {"tests", "tests.support"}
    assert tests_imported("import fuzz.upstream\nfrom fuzz.repro import shrink\n") == set()
