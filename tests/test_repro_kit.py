"""The standalone repro kit (:mod:`fuzz.kit`) is code: it imports only what a
file in vLLM's test tree may import, lints clean, and the writer copies it
out by selection and specialisation, never by editing text.

The repros themselves (fail planted, pass unplanted) are
tests/test_scheduler_repro.py's.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.kit import COPIED_MODULES, KIT_MODULES
from fuzz.repro_scheduler import _CHECK_OF, _constants, scheduler_repro
from fuzz.repro_source import kit_definitions, kit_source, specialise
from fuzz.targets.target_scheduler import UNSUPPORTED

ROOT = Path(__file__).resolve().parents[1]
# What a file in vLLM's test tree may import.
THIRD_PARTY = {"vllm", "pytest", "torch"}


def _imported_modules(source: str) -> set[str]:
    out = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(node.module or "")
    return out


@pytest.mark.parametrize("name", KIT_MODULES)
def test_the_kit_imports_only_vllm_pytest_and_the_standard_library(name: str) -> None:
    source = inspect.getsource(importlib.import_module(name))
    for module in _imported_modules(source):
        top = module.split(".")[0]
        allowed = (
            module == "__future__"
            or top in sys.stdlib_module_names
            or top in THIRD_PARTY
            or module.startswith("fuzz.kit.")
            or module in COPIED_MODULES
        )
        assert allowed, f"{name} imports {module}: a repro file may import vLLM, pytest and the standard library only"


def _ruff(*paths: Path) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install ruff)")
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F,E9", "--line-length", "120",
         *map(str, paths)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )


def test_the_kit_lints_clean() -> None:
    modules = [ROOT / (m.replace(".", "/") + ".py") for m in KIT_MODULES]
    result = _ruff(*modules, ROOT / "fuzz" / "repro_source.py", ROOT / "fuzz" / "repro_scheduler.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_check_a_file_states_is_a_kit_definition() -> None:
    definitions = kit_definitions()  # raises if a name is defined twice
    missing = {inv: check for inv, check in _CHECK_OF.items() if check is not None and check not in definitions}
    assert not missing, missing


# --- specialising ------------------------------------------------------------

_SOURCE = '''def f(x):
    if ASYNC:
        # queued
        return g(x)
    else:
        y = x
        if POOL:
            y += 1
        return y
'''


def test_an_if_on_the_constants_keeps_the_branch_they_take() -> None:
    assert specialise(_SOURCE, {"ASYNC": True, "POOL": True}) == "def f(x):\n    # queued\n    return g(x)"
    assert specialise(_SOURCE, {"ASYNC": False, "POOL": False}) == "def f(x):\n    y = x\n    return y"
    assert specialise(_SOURCE, {"ASYNC": False, "POOL": True}) == "def f(x):\n    y = x\n    y += 1\n    return y"


def test_an_if_on_anything_else_stays() -> None:
    source = "def f(x):\n    if x and ASYNC:\n        return 1\n    return 2"
    assert specialise(source, {"ASYNC": True}) == source
    assert specialise(_SOURCE, {}) == _SOURCE


def test_an_elif_on_a_constant_is_refused() -> None:
    with pytest.raises(ValueError, match="elif"):
        specialise("def f():\n    if A:\n        return 1\n    elif B:\n        return 2\n", {"A": False, "B": True})


def test_selection_keeps_what_the_roots_reach_and_the_methods_called() -> None:
    sync = kit_source({"_step", "_Watch"}, {"ASYNC_SCHEDULING": False, "WATCH_POOL": False, "WATCH_TABLES": False})
    assert "def _step(" in sync.code and "_queued_step" not in sync.code
    assert "def _watch_blocks" not in sync.code and "def hold(" not in sync.code
    assert "WATCH_POOL" not in sync.constants  # every if on it is gone
    queued = kit_source({"_step", "_Watch"}, {"ASYNC_SCHEDULING": True, "WATCH_POOL": True, "WATCH_TABLES": True})
    assert "def _queued_step(" in queued.code and "def _watch_blocks" in queued.code and "def hold(" in queued.code


# --- the files --------------------------------------------------------------


def _tiny_log(**draw):  # type: ignore[no-untyped-def]
    from fuzz.adapter import SchedulerHarness
    from fuzz.model import ExternalReply, LayoutDraw, SchedulerDraw, SpecDraw

    harness = SchedulerHarness(SchedulerDraw(LayoutDraw((SpecDraw("FullAttentionSpec", 4),), 4, 16), **draw))
    harness.add_request(range(8), reply=ExternalReply("store", store_len=4))
    harness.step()
    harness.step()
    return harness.oplog


def test_the_writer_knows_every_constant_the_kit_reads() -> None:
    from fuzz.kit import _params

    names = {n for n in vars(_params) if n.isupper()}
    log = _tiny_log()
    assert set(_constants(log, "computed-adds-up", list(log.requests))) == names


@pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("invariant", ["computed-adds-up", "same-step-hazard", "reads-written", "kv-matches-tokens"])
def test_a_written_file_lints_clean(invariant: str, async_scheduling: bool, tmp_path: Path) -> None:
    source = scheduler_repro(_tiny_log(async_scheduling=async_scheduling), invariant=invariant, target="t", seed=0,
                             violation="")
    assert source is not None
    path = tmp_path / "test_repro.py"
    path.write_text(source)
    result = _ruff(path)
    assert result.returncode == 0, result.stdout + result.stderr + source
    assert ("def _queued_step(" in source) == async_scheduling
    assert ("class BlockContents" in source) == (invariant == "reads-written")
    assert ("def _watch_blocks" in source) == (invariant == "same-step-hazard")
