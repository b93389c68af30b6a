"""What the repro tests share: the search budget and strategy that find a
planted bug, the check every written file must pass (fails planted, in the
kit's check; passes unplanted; imports vLLM, pytest and the standard library
only; lints clean), and the small runs the writer's tests start from.

The repro tests (``tests/findings/test_scheduler_repro*.py``,
``test_repro_kit.py``, ``test_repro_trees.py``) import from here;
``scripts/repro_sizes.py`` swaps :func:`check_repro` where a test module
holds it, to record each file's size instead.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from fuzz.adapter import planted_scheduler_bug
from fuzz.model import InvariantViolation
from fuzz.repro.scheduler import WRITABLE, _check_of
from strategies.single_shot import single_shot_scenarios
from tests.invariants.planted_cases import FIXED_CASES
from tests.support.harnesses import harness_of

ROOT = Path(__file__).resolve().parents[2]

SEARCH = settings(max_examples=2000, derandomize=True, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))

ALLOWED_IMPORTS = {"collections", "dataclasses", "enum", "json", "pytest", "torch", "traceback", "typing", "vllm"}


def planted_search_strategy():  # type: ignore[no-untyped-def]
    """The single-shot scenarios without the twins and load flavours: those
    build the open vLLM 0.33.0 bugs' states on purpose, and a repro shrunk
    from such a scenario fails on unmodified vLLM too (the undercount's
    ValueError), which these planted-bug repros must not."""
    return single_shot_scenarios(shortcut=False, allow_over=False)


def run_repro(path: Path, tmp_path: Path, bug: str | None) -> BaseException | None:
    """Import the file under its own module name (its connector is loaded by
    that name) and run its test, with ``bug`` planted; the failure, or None."""
    name = f"kvtrunc_repro_{path.stem}_{bug or 'unplanted'}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        (test,) = [getattr(module, n) for n in dir(module) if n.startswith("test_")]
        planted = planted_scheduler_bug(bug) if bug else contextlib.nullcontext()
        with pytest.MonkeyPatch.context() as mp, planted:
            run_dir = tmp_path / (bug or "unplanted")
            run_dir.mkdir()
            test(run_dir, mp)
    except (AssertionError, pytest.fail.Exception) as exc:
        return exc
    finally:
        del sys.modules[name]
    return None


# The claims every file states without a kit check of their own, and where
# a failing file states them: the pool check's frame, or (no-exception) the
# step's pytest.fail, whose text says what escaped.
_STATED_AT = {"no-leaked-blocks": "_assert_no_leaked_blocks"}
_ESCAPED = "escaped the scheduler"


def _header_invariant(source: str) -> str:
    """The claim a written file's header names (``invariant: x``)."""
    return next(line.split(": ", 1)[1] for line in source.splitlines() if line.startswith("invariant: "))


def imports_of(source: str) -> set[str]:
    """The top-level packages ``source`` imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names


def ruff(*paths: Path) -> subprocess.CompletedProcess[str]:
    """ruff's pyflakes and syntax rules over ``paths`` (skips the test
    without ruff)."""
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install ruff)")
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F,E9", "--line-length", "120",
         *map(str, paths)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )


def check_repro(source: str | None, bug: str, tmp_path: Path, check: str | None = None) -> Path:
    """Write ``source``, run it with ``bug`` planted (it must fail, in the
    kit's ``check``: by default the check of the claim its header names, the
    one the suite's invariant broke on the run it replays) and without (it
    must pass). Every file written here thus shows the kit's check and the
    suite's invariant agreeing on one recorded run, planted and not."""
    assert source, f"{bug}: no repro written"
    claim = _header_invariant(source)
    check = check or _check_of(claim) or _STATED_AT.get(claim)
    assert imports_of(source) <= ALLOWED_IMPORTS, imports_of(source)
    assert "pytestmark = pytest.mark.cpu_test" in source
    # A file with the connector loads it by its own module path; one without has none of it.
    has_connector = "class ScriptedConnector(" in source
    assert ("kv_connector_module_path=__name__" in source) == has_connector, source
    assert has_connector or "KVTransferConfig" not in source and "STORE = " not in source, source
    path = tmp_path / f"test_repro_{bug}.py"
    path.write_text(source)
    if importlib.util.find_spec("ruff") is not None:  # in requirements/lean.txt: CI lints every file written
        lint = ruff(path)
        assert lint.returncode == 0, f"{bug}: the repro does not lint clean\n{lint.stdout}{lint.stderr}\n{source}"
    failure = run_repro(path, tmp_path, bug)
    assert failure is not None, f"{bug}: the repro passes with the bug planted\n{source}"
    frames = [frame.name for frame in traceback.extract_tb(failure.__traceback__)]
    if check is None:  # no-exception
        assert claim == "no-exception" and _ESCAPED in str(failure), f"{bug}: no exception escapes: {failure!r}\n{source}"
    else:
        assert check in frames, f"{bug}: the repro fails outside {check}: {failure!r}\n{source}"
    assert run_repro(path, tmp_path, None) is None, f"{bug}: the repro fails on unmodified vLLM\n{source}"
    return path


def fixed_case_log(bug: str):  # type: ignore[no-untyped-def]
    """The fixed run tests/invariants/test_scheduler_planted.py shows ``bug`` caught on
    (its FIXED_CASES), planted: its log and the invariant it breaks."""
    check, invariant, run = next((c, i, r) for c, i, b, r, _ in FIXED_CASES if b == bug)
    with planted_scheduler_bug(bug), pytest.raises(InvariantViolation) as caught:
        run((check,))
    return caught.value.oplog, invariant


def fixed_run_cases() -> dict[str, tuple[Callable[..., None], str]]:
    """Planted bug -> (check, invariant) of every fixed run whose claim a file can state."""
    return {bug: (check, name) for check, name, bug, *_ in FIXED_CASES if name in WRITABLE}


def tiny_log(**draw):  # type: ignore[no-untyped-def]
    """Two steps of one request (8 tokens, an external hit of 4) on one
    full-attention group: ``draw`` sets any other SchedulerDraw field."""
    from fuzz.model import ExternalReply, LayoutDraw, SpecDraw

    harness = harness_of(LayoutDraw((SpecDraw("FullAttentionSpec", 4),), 4, 16), **draw)
    harness.add_request(range(8), reply=ExternalReply("store", store_len=4))
    harness.step()
    harness.step()
    return harness.oplog
