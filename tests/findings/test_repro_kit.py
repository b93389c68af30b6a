"""The standalone repro kit (:mod:`fuzz.kit`) is code: it imports only what a
file in vLLM's test tree may import, lints clean, and the writer copies it
out by selection and specialisation, never by editing text.

The repros themselves (fail planted, pass unplanted) are
tests/findings/test_scheduler_repro.py's.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path

import pytest

from fuzz.kit import COPIED_MODULES, KIT_MODULES, SUITE_CHECK_MODULES, TRUNCATION_KIT_MODULES
from fuzz.repro.scheduler import WRITABLE, _check_of, _constants, scheduler_repro
from fuzz.repro.source import kit_definitions, kit_source, specialise, trim
from fuzz.targets.target_scheduler import UNSUPPORTED
from tests.findings.repro_checks import ruff, tiny_log

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.parametrize("name", KIT_MODULES + TRUNCATION_KIT_MODULES)
def test_the_kit_imports_only_vllm_pytest_and_the_standard_library(name: str) -> None:
    """The suite's check modules a file carries checks from import the
    vocabulary and their own room: a file takes only the definitions it
    reaches from them, and :func:`test_a_written_file_lints_clean` shows
    none of those needs a name the file lacks."""
    source = inspect.getsource(importlib.import_module(name))
    for module in _imported_modules(source):
        top = module.split(".")[0]
        allowed = (
            module == "__future__"
            or top in sys.stdlib_module_names
            or top in THIRD_PARTY
            or module.startswith("fuzz.kit.")
            or module in COPIED_MODULES
            or (name in SUITE_CHECK_MODULES and (module == "fuzz.model" or top == "invariants"))
            or module in SUITE_CHECK_MODULES
        )
        assert allowed, f"{name} imports {module}: a repro file may import vLLM, pytest and the standard library only"


def test_the_kit_lints_clean() -> None:
    modules = [ROOT / (m.replace(".", "/") + ".py") for m in KIT_MODULES + TRUNCATION_KIT_MODULES]
    writers = [ROOT / "fuzz" / "repro" / name for name in ("source.py", "scheduler.py", "shrink.py", "truncation.py")]
    result = ruff(*modules, *writers)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_check_a_file_states_is_a_kit_definition() -> None:
    kit_definitions(TRUNCATION_KIT_MODULES)  # raises if a name is defined twice
    definitions = kit_definitions()
    missing = {inv: check for inv in WRITABLE if (check := _check_of(inv)) is not None and check not in definitions}
    assert not missing, missing


def test_the_kit_s_ownership_record_reads_as_the_suite_s() -> None:
    """The carried claim on reads in flight reads the file's StepOwnership
    where it reads an OwnershipObservation: fields of it, same names."""
    import dataclasses

    from fuzz.kit._ownership import StepOwnership
    from fuzz.model import OwnershipObservation

    kit = {f.name for f in dataclasses.fields(StepOwnership)}
    assert kit <= {f.name for f in dataclasses.fields(OwnershipObservation)}, kit


def test_the_kit_s_lookup_record_reads_as_an_admission() -> None:
    """A file states the hit claim with the suite's own check, which reads an
    AdmissionObservation: the kit's record of a lookup has only fields of
    it, under the same names."""
    import dataclasses

    from fuzz.kit._hits import HitLookup
    from fuzz.model import AdmissionObservation

    kit = {f.name for f in dataclasses.fields(HitLookup)}
    assert kit <= {f.name for f in dataclasses.fields(AdmissionObservation)}, kit


def test_the_kit_s_admission_record_reads_as_an_admission() -> None:
    """A file states the admission claims with the suite's own checks, which
    read an AdmissionObservation: the kit's record of an admission has only
    fields of it, under the same names, and every field of it those checks
    (and the helpers they call) read."""
    import dataclasses
    import inspect

    import invariants.scheduler as checks
    from fuzz.kit._admissions import Admission
    from fuzz.model import AdmissionObservation
    from fuzz.repro.scheduler import _PER_ADMISSION
    from fuzz.repro.source import kit_attributes

    kit = {f.name for f in dataclasses.fields(Admission)}
    suite = {f.name for f in dataclasses.fields(AdmissionObservation)}
    assert kit <= suite, kit - suite
    read = set(kit_attributes(inspect.getsource(checks))) & (suite | {"partial_tail"})
    assert _PER_ADMISSION and all(hasattr(checks, name) for name in _PER_ADMISSION)
    # The module's other readers of an admission (connector_block_ids, ...) are
    # step checks; what the carried admission checks read, the record holds.
    carried = set()
    for name in _PER_ADMISSION:
        carried |= kit_attributes(inspect.getsource(getattr(checks, name)))
    for helper in (checks._fail, checks._settled, checks._local_kept, checks.expects_truncation,
                   checks._truncated_view):
        carried |= kit_attributes(inspect.getsource(helper))
    missing = (carried & read) - kit - {"partial_tail", "describe"}
    assert not missing, missing
    assert hasattr(Admission, "partial_tail") and hasattr(Admission, "describe")


def test_the_kit_s_failed_load_record_reads_as_the_suite_s() -> None:
    import dataclasses

    from fuzz.kit._loads import FailedLoad as Kit
    from fuzz.model import FailedLoad

    kit = {f.name for f in dataclasses.fields(Kit)}
    assert kit <= {f.name for f in dataclasses.fields(FailedLoad)}, kit


def test_the_watch_records_what_every_carried_step_check_reads() -> None:
    """A file calls a carried step check on the watch, which stands for the
    suite's StepObservation: every attribute such a check reads of its step
    is one the kit's watch records (set as ``self.x`` in ``_Watch`` or
    ``watch.x`` in the kit), so no carried claim meets a missing record only
    when it breaks."""
    import ast
    import importlib
    import inspect

    from fuzz.kit import KIT_MODULES
    from fuzz.repro.scheduler import WRITABLE, _PER_ADMISSION, _PER_LOOKUP, _check_of, _ROWS

    recorded = {"describe"}
    for name in KIT_MODULES:
        if name.startswith("fuzz.kit."):
            for node in ast.walk(ast.parse(inspect.getsource(importlib.import_module(name)))):
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                        and isinstance(node.value, ast.Name) and node.value.id in ("self", "watch")):
                    recorded.add(node.attr)
    missing = {}
    for invariant in sorted(WRITABLE):
        check = _check_of(invariant)
        if check is None or check.startswith("_") or check in _PER_ADMISSION | _PER_LOOKUP:
            continue
        fn = _ROWS[invariant].check
        tree = ast.parse(inspect.getsource(fn))
        param = tree.body[0].args.args[0].arg  # type: ignore[attr-defined]
        read = {n.attr for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == param}
        if read - recorded:
            missing[invariant] = read - recorded
    assert not missing, missing


def test_a_file_drops_the_triage_of_the_violations_it_raises() -> None:
    from fuzz.repro.prune_triage import without_triage

    source = (
        'def check(step):\n'
        '    raise InvariantViolation("claim", text(step), where=WHERE, state=_cause(step), group_kind=None)\n'
        '    raise MissedHit(\n        "claim",\n        text(step),\n        where=WHERE,\n    )\n'
        '    raise ValueError("other", where=WHERE)\n'
    )
    assert without_triage(source) == (
        'def check(step):\n'
        '    raise InvariantViolation("claim", text(step))\n'
        '    raise MissedHit(\n        "claim",\n        text(step),\n    )\n'
        '    raise ValueError("other", where=WHERE)\n'
    )


def test_a_file_drops_the_fields_of_its_records_nothing_reads() -> None:
    """A record's field no code of the file reads goes, with the keyword
    that filled it; a field read, filled by position or through ``**``, set
    through another call's keyword, or whose value might change something,
    stays."""
    from fuzz.repro.prune_fields import unread_fields

    record = (
        "@dataclasses.dataclass(frozen=True)\n"
        "class Record:\n"
        "    first: int\n"
        "    read: int  # read below\n"
        "    unread: tuple\n"
        "    replaced: int\n"
        "    costly: list\n"
    )
    sources = {
        "Record": record,
        "build": "def build(x):\n    return Record(first=x, read=x, unread=tuple(x), replaced=x, costly=take(x))\n",
        "take": "def take(x):\n    x.append(1)\n    return x\n",
        "use": "def use(r):\n    return r.read, dataclasses.replace(r, replaced=0)\n",
    }
    out = unread_fields(sources, (), "")
    assert out == {
        "Record": record.replace("    unread: tuple\n", "").replace("    first: int\n", "").rstrip("\n"),
        "build": "def build(x):\n    return Record(read=x, replaced=x, costly=take(x))\n",
    }, out
    positional = {**sources, "build": "def build(x):\n    return Record(x, x, (), x, [])\n"}
    assert unread_fields(positional, (), "") == {}
    spread = {**sources, "build": "def build(x):\n    return Record(**x)\n"}
    assert unread_fields(spread, (), "") == {}


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
    sync = kit_source({"_step", "_Watch"}, {"ASYNC_SCHEDULING": False, "WATCH_POOL": False, "WATCH_TABLES": False,
                                            "WATCH_ADMISSIONS": False, "WATCH_HITS": False, "CONNECTOR": False})
    assert "def _step(" in sync.code and "_queued_step" not in sync.code
    assert "def _watch_blocks" not in sync.code and "def hold(" not in sync.code
    assert "WATCH_POOL" not in sync.constants  # every if on it is gone
    queued = kit_source({"_step", "_Watch"}, {"ASYNC_SCHEDULING": True, "WATCH_POOL": True, "WATCH_TABLES": True})
    assert "def _queued_step(" in queued.code and "def _watch_blocks" in queued.code and "def hold(" in queued.code


# --- trimming ----------------------------------------------------------------

_DOCUMENTED = '''class C:
    """What C is. More about it,
    over two lines.

    A second paragraph."""

    # Why x starts empty.
    def f(self, x):  # a trailing comment stays
        """One line."""
        # What comes next.
        return "# not a comment"
'''


def test_trimming_keeps_first_sentences_and_drops_comment_lines() -> None:
    assert trim(_DOCUMENTED) == (
        'class C:\n    """What C is."""\n\n    def f(self, x):  # a trailing comment stays\n        """One line."""\n'
        '        return "# not a comment"'
    )


def test_the_failing_check_keeps_its_docstring_in_full() -> None:
    from fuzz.kit._checks_scheduler import _check_running_requests_progress as check

    full = kit_source({check.__name__}, {}, in_full={check.__name__})
    trimmed = kit_source({check.__name__}, {})
    assert check.__doc__ in full.code and check.__doc__ not in trimmed.code


# --- dropping what nothing reads ---------------------------------------------

_RECORDS = """class W:
    def __init__(self):
        self.kept = []
        self.unread = {}
        self.by_name = {}
        self.costly = {}

def f(watch, x):
    watch.unread[x] = len(x)
    watch.unread.clear()
    watch.by_name.update(x=1)
    watch.costly[x] = x.pop()
    if x.reset():
        watch.unread = {}
    return watch.kept, getattr(watch, "by_name")"""


def test_a_record_nothing_reads_goes_with_every_store_into_it() -> None:
    """A record of the file's own (self of a plain class, the watch) that no
    attribute or string reads loses its stores (an if they empty keeps its
    test); one read by name, or stored by a call that may change something,
    stays."""
    from fuzz.repro.prune import unread_records, without_lines

    sources = {"W": _RECORDS.split("\n\ndef ")[0], "f": "def " + _RECORDS.split("\n\ndef ")[1]}
    drops = unread_records(sources, {"W"}, extra="")
    kept = {name: without_lines(source, drops.get(name, set())) for name, source in sources.items()}
    assert kept["W"] == "class W:\n    def __init__(self):\n        self.kept = []\n        self.by_name = {}\n        self.costly = {}"
    assert kept["f"] == (
        "def f(watch, x):\n    watch.by_name.update(x=1)\n    watch.costly[x] = x.pop()\n    x.reset()\n"
        '    return watch.kept, getattr(watch, "by_name")'
    )


def test_a_local_nothing_reads_and_an_empty_splat_go() -> None:
    from fuzz.repro.prune import without_unused_locals

    source = "def f(a):\n    x, y = a.b, {}\n    extra = {}\n    z = a.c()\n    return g(\n        1, **extra)\n"
    assert without_unused_locals(source) == "def f(a):\n    z = a.c()\n    return g(\n        1)"


@pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")
def test_admissions_are_watched_only_where_the_file_reads_them() -> None:
    """WATCH_ADMISSIONS: the writer keeps the admission records (and the
    wrapped lookup and allocate_slots) only where the file written without
    them still reads them (watch.admitting, or the Admission records of
    watch.admissions)."""
    log = tiny_log()
    for invariant, reads in (("computed-adds-up", True), ("hits-within-namespace", True),
                             ("preempted-resumable", False), ("events-replay-index", False)):
        source = scheduler_repro(log, invariant=invariant, target="t", seed=0, violation="")
        assert source is not None
        assert ("admitting" in source) == reads, invariant
        assert ("def local_hit(" in source) == reads, invariant
    preempted = scheduler_repro(log, invariant="preempted-resumable", target="t", seed=0, violation="")
    assert preempted is not None and "stale_outputs" not in preempted and "newly_scheduled" not in preempted


# --- the files --------------------------------------------------------------


def test_the_writer_knows_every_constant_the_kit_reads() -> None:
    from fuzz.kit import _params

    names = {n for n in vars(_params) if n.isupper()}
    log = tiny_log()
    assert set(_constants(log, "computed-adds-up", list(log.requests))) == names


@pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    "invariant",
    ["computed-adds-up", "same-step-hazard", "reads-written", "kv-matches-tokens", "hits-within-namespace",
     "events-replay-index", "preempted-resumable", "in-flight-reads-held", "events-chain", "hit-matches-index",
     "eviction-order", "lookahead-allocated", "hits-after-reset"],
)
def test_a_written_file_lints_clean(invariant: str, async_scheduling: bool, tmp_path: Path) -> None:
    source = scheduler_repro(tiny_log(async_scheduling=async_scheduling), invariant=invariant, target="t", seed=0,
                             violation="")
    assert source is not None
    path = tmp_path / "test_repro.py"
    path.write_text(source)
    result = ruff(path)
    assert result.returncode == 0, result.stdout + result.stderr + source
    assert ("def _queued_step(" in source) == async_scheduling
    assert ("class BlockContents" in source) == (
        invariant in ("reads-written", "hits-within-namespace", "lookahead-allocated", "hits-after-reset"))
    assert ("def _watch_blocks" in source) == (invariant in ("same-step-hazard", "in-flight-reads-held"))
    assert ("watch.ownership = _ownership(" in source) == (invariant == "in-flight-reads-held")
    assert ("class EventLog" in source) == (invariant in ("events-replay-index", "events-chain"))
    assert ("def _preempted_states" in source) == (invariant == "preempted-resumable")
    assert ("def allowed_hit" in source) == (invariant == "hit-matches-index")
    assert "def _shortfall" not in source and "HIT_SHORTER" not in source  # the suite's triage stays out
    assert ("class EvictionWatch" in source) == (invariant == "eviction-order")


# --- the failing run's log --------------------------------------------------


@pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")
def test_the_failing_run_s_log_travels_with_the_violation() -> None:
    """The writer reads the failing run's operation log from the violation
    itself: a later run in the same process changes nothing."""
    from fuzz.adapter import SchedulerHarness, planted_scheduler_bug
    from fuzz.model import ExternalReply, InvariantViolation, LayoutDraw, SchedulerDraw, SpecDraw
    from fuzz.repro.scheduler import scheduler_repro_of_failure
    from fuzz.runners.scheduler import ALL_CHECKS, Stepper

    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=1, num_blocks=19)
    draw = SchedulerDraw(layout, max_num_batched_tokens=4, max_num_seqs=1, model_runner="v2")
    with planted_scheduler_bug("pre_fix_assert_all"):
        harness = SchedulerHarness(draw)
        run = Stepper(harness, ALL_CHECKS)
        harness.add_request(range(0, 42, 7), reply=ExternalReply("store", store_len=6))
        run.step()
        harness.add_request(range(0, 70, 7), reply=ExternalReply("store", store_len=10))
        with pytest.raises(InvariantViolation) as caught:
            run.step()
        SchedulerHarness(draw).add_request(range(3), reply=ExternalReply())  # another run, after it
        failure = caught.value
        source = scheduler_repro_of_failure(target="t", seed=0, invariant=failure.invariant, violation=str(failure),
                                            failure=failure)
    assert failure.oplog is harness.oplog
    assert source is not None and "PROMPT_R0 = " in source, source
    assert scheduler_repro_of_failure(target="t", seed=0, invariant=failure.invariant, violation="",
                                      failure=InvariantViolation(failure.invariant, "no log")) is None


# --- one claim, two statements ------------------------------------------------
# The suite's invariant (invariants/*.py, on the harness's observations) and
# the kit's check (fuzz/kit/_checks_*.py, on vLLM's own objects in the file)
# state one claim twice. On the same recorded runs they must agree: both
# break with the planted bug, neither without it.


def _planted_runs():  # type: ignore[no-untyped-def]
    """(planted bug, the suite's check, its invariant, a run returning the
    failing log under the plant): the fixed runs of tests/invariants/planted_cases.py."""
    from tests.invariants.planted_runs import speculating_harness
    from tests.invariants.planted_cases import FIXED_CASES, SPEC_DECODE_CASES

    def stepped(run):  # type: ignore[no-untyped-def]
        def log(check):  # type: ignore[no-untyped-def]
            from fuzz.model import InvariantViolation

            with pytest.raises(InvariantViolation) as caught:
                run((check,))
            return caught.value.oplog

        return log

    def speculating(check):  # type: ignore[no-untyped-def]
        harness = speculating_harness(False)
        harness.drain(context="speculating")
        return harness.oplog

    cases = [(bug, check, invariant, stepped(run)) for check, invariant, bug, run, _ in FIXED_CASES]
    cases += [(bug, check, invariant, speculating) for check, invariant, bug in SPEC_DECODE_CASES]
    return cases


def _run_file(path: Path, bug: str | None, tmp_path: Path) -> BaseException | None:
    """Run the written file's test under its own module name (its connector
    is loaded by that name), with ``bug`` planted: the failure, or None."""
    from fuzz.adapter import planted_scheduler_bug

    name = f"kvtrunc_kit_{path.stem}_{bug or 'unplanted'}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    run_dir = tmp_path / (bug or "unplanted")
    run_dir.mkdir()
    try:
        spec.loader.exec_module(module)
        (test,) = [getattr(module, n) for n in dir(module) if n.startswith("test_")]
        with pytest.MonkeyPatch.context() as mp, planted_scheduler_bug(bug) if bug else contextlib.nullcontext():
            test(run_dir, mp)
    except AssertionError as exc:
        return exc
    finally:
        del sys.modules[name]
    return None


def _claims_on_fixed_runs() -> list[str]:
    """Every claim a file can state that a fixed run shows failing (the
    cases of :func:`_planted_runs`), from the table: a new one is tested here
    without a line in this file."""
    from fuzz.repro.scheduler import WRITABLE
    from tests.invariants.planted_cases import FIXED_CASES, SPEC_DECODE_CASES

    return sorted({name for _, name, *_ in (*FIXED_CASES, *SPEC_DECODE_CASES)} & WRITABLE)


@pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")
@pytest.mark.parametrize("invariant", _claims_on_fixed_runs())
def test_the_suite_s_invariant_and_the_kit_s_check_agree_on_recorded_runs(invariant: str, tmp_path: Path) -> None:
    """A claim the kit restates: both statements break on the planted run and
    hold without the plant. A claim the file states with the suite's own
    check (``fuzz.kit.SUITE_CHECK_MODULES``): the watch's records agree with
    the harness's on the same run."""
    from fuzz.adapter import planted_scheduler_bug
    from fuzz.repro.scheduler import _replay_checked, shrink_oplog

    (bug, check, _, failing_log), *_ = [c for c in _planted_runs() if c[2] == invariant]
    with planted_scheduler_bug(bug):
        log = shrink_oplog(failing_log(check), invariant, checks=(check,))
        suite_planted = _replay_checked(log, invariant, (check,))
    suite_unplanted = _replay_checked(log, invariant, (check,))
    source = scheduler_repro(log, invariant=invariant, target="t", seed=0, violation="")
    assert source is not None
    path = tmp_path / f"test_kit_{invariant.replace('-', '_')}.py"
    path.write_text(source)
    kit_planted, kit_unplanted = _run_file(path, bug, tmp_path), _run_file(path, None, tmp_path)
    kit_check = _check_of(invariant)
    assert suite_planted is not None, f"{bug}: the suite's {invariant} does not break on the recorded run"
    assert kit_planted is not None and any(
        frame.name == kit_check for frame in traceback.extract_tb(kit_planted.__traceback__)
    ), f"{bug}: the kit's {kit_check} does not break on the recorded run: {kit_planted!r}"
    assert suite_unplanted is None, f"{invariant} breaks on the recorded run without {bug}"
    assert kit_unplanted is None, f"{kit_check} breaks on the recorded run without {bug}: {kit_unplanted}"


def test_a_written_truncation_file_lints_clean(tmp_path: Path) -> None:
    from fuzz import adapter
    from fuzz.model import TruncationObservation
    from fuzz.repro.truncation import truncation_repro
    from fuzz.targets.target_truncate import SEED_PR_51468

    obs = TruncationObservation(
        endpoint=0, groups=(), error=None, tuple_obj_id_before=0, tuple_obj_id_after=0,
        free_blocks_before=0, free_blocks_after=0, vllm_version=adapter.VLLM_VERSION,
    )
    source = truncation_repro(SEED_PR_51468, obs, target="t", seed=0, invariant="must-cover", violation="")
    path = tmp_path / "test_truncation_repro.py"
    path.write_text(source)
    result = ruff(path)
    assert result.returncode == 0, result.stdout + result.stderr + source
    assert "def _lookup(" in source and "find_longest_cache_hit_per_group" in source  # the per-group lookup is written


# --- records never filled, fields fixed, calls doing nothing, unused parameters ---


def test_an_if_on_a_record_the_file_never_fills_is_decided() -> None:
    """A record only ever stored empty, emptied or read (any owner) makes
    ``if watch.x:`` false; one filled anywhere (the test too) does not."""
    from fuzz.repro.prune import never_filled

    sources = {"W": "class W:\n    def __init__(self):\n        self.a = []\n        self.b = []\n        self.c = {}",
               "f": "def f(watch):\n    if watch.a:\n        watch.a.clear()\n    watch.b.append(1)\n    return len(watch.c)"}
    assert never_filled(sources, {"W"}, extra="") == {"a", "c"}
    assert never_filled(sources, {"W"}, extra="watch.c[1] = 2") == {"a"}
    assert specialise(sources["f"], {"watch.a": ()}).startswith("def f(watch):\n    watch.b.append(1)")


def test_a_field_set_from_constants_decides_its_ifs_and_unused_parameters_go() -> None:
    from fuzz.repro.prune import calls_doing_nothing, constant_fields, unused_parameters

    sources = {"R": "class R:\n    def __init__(self, fast=False):\n        self.fast = fast\n"
                    "    def go(self, x):\n        if self.fast and x:\n            return 1\n        return 2",
               "g": "def g(w, unused, extra=()):\n    r = R(fast=ASYNC)\n    idle(w)\n    return w\n",
               "idle": 'def idle(w):\n    """Nothing."""'}
    assert constant_fields(sources, {"R"}, "", {"ASYNC": False}) == {"R": {"self.fast": False}}
    assert constant_fields(sources, {"R"}, "R(fast=True)", {"ASYNC": False}) == {}
    assert calls_doing_nothing(sources) == {"g": {2}}
    cut = unused_parameters(sources, {"R"}, extra="g(1, 2)")
    assert cut == {"g": "def g(w, unused):\n    r = R(fast=ASYNC)\n    idle(w)\n    return w\n"}
    passed = unused_parameters(sources, {"R"}, extra="g(1, 2, 3)")  # the test passes both: only idle's go
    assert passed["g"].startswith("def g(w, unused, extra=()):") and passed["idle"] == 'def idle():\n    """Nothing."""'


@pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")
def test_a_sync_file_without_aborts_or_speculation_carries_none_of_their_code() -> None:
    """The worker's async and rejection branches, the abort hook and the
    connector's unused parameters go from a sync file with no connector."""
    log = tiny_log(connector=False, divergent_hits=False)
    source = scheduler_repro(log, invariant="preempted-resumable", target="t", seed=0, violation="")
    assert source is not None
    for gone in ("self.async_scheduling", "unfed_rejections", "_abort_during_step", "recving", "failed_loads", "**options",
                 "reset_preempted"):
        assert gone not in source, gone


def test_a_parameter_the_docstring_names_stays() -> None:
    from fuzz.repro.prune import unused_parameters

    sources = {"f": 'def f(out, done):\n    """For each request of ``out``."""\n    return done',
               "g": "def g(x):\n    return f(x, 1)"}
    assert unused_parameters(sources, set(), extra="") == {}


# --- helpers called once, annotations -----------------------------------------


def test_a_helper_called_once_moves_to_its_call() -> None:
    """Its body replaces the call (parameters renamed to the names passed,
    ``return v`` the call's assignment, a passed call bound first); a
    helper called twice, or whose locals clash with the caller's, stays."""
    from fuzz.repro.prune_inline import inlined_helpers

    sources = {
        "begin": 'def begin(w):\n    """Doc."""\n    w.step += 1\n    w.seen = []',
        "sampled": "def sampled(out, done, step):\n    return [[step] if d else [] for d in done]",
        "step": "def step(s, watch):\n    begin(watch)\n    got = sampled(s, s.run(), watch.step)\n    return got",
    }
    once = inlined_helpers(sources, set(), extra="step(1, 2)")
    assert once == {"step": "def step(s, watch):\n    watch.step += 1\n    watch.seen = []\n"
                             "    got = sampled(s, s.run(), watch.step)\n    return got"}
    twice = inlined_helpers(sources, set(), extra="begin(3)")  # the test calls it too: only sampled moves
    assert "    begin(watch)\n    done = s.run()\n" in twice["step"]
    moved = inlined_helpers({"sampled": sources["sampled"], "step": once["step"]}, set(), extra="step(1, 2)")
    assert moved["step"].endswith("    done = s.run()\n    got = [[watch.step] if d else [] for d in done]\n    return got")
    assert inlined_helpers({"f": "def f(x):\n    y = x + 1\n    return y", "g": "def g(y):\n    z = f(y)\n    return z"},
                           set(), extra="g(1)") == {"g": "def g(y):\n    z = y + 1\n    return z"}
    clash = {"f": "def f(x):\n    y = x + 1\n    return y * 2", "g": "def g(y):\n    z = f(y)\n    return z + y"}
    assert inlined_helpers(clash, set(), extra="g(1)") == {}


def test_a_one_line_method_called_once_moves_into_its_expression() -> None:
    from fuzz.repro.prune_inline import inlined_helpers

    sources = {"W": "class W:\n    def a(self, x):\n        return self.b(x) + 1\n\n    def b(self, y):\n        return y * 2"}
    assert inlined_helpers(sources, {"W"}, extra="W().a(1)") == {"W": "class W:\n    def a(self, x):\n        return (x * 2) + 1"}


def test_annotations_go_but_a_class_body_s_fields_keep_theirs() -> None:
    from fuzz.repro.prune_annotations import without_annotations

    source = ("class C:\n    x: int = 3\n\n    def f(self, a: int,\n          b: str | None = None) -> bool:\n"
              "        y: list[int] = []\n        return bool(y)")
    assert without_annotations(source) == (
        "class C:\n    x: int = 3\n\n    def f(self, a, b=None):\n        y = []\n        return bool(y)"
    )


def test_a_summary_too_long_to_cut_goes_rather_than_a_fragment() -> None:
    long = '''def f():
    """Per request of ``out``, the tokens the scheduler counted before it
    scheduled this step, as the runner reads them from the output, and
    not from scheduler.requests."""
    return 1'''
    clause = long.replace("Per request of ``out``, the tokens", "Per request: the tokens")
    assert trim(long) == "def f():\n    return 1"
    assert trim(clause) == 'def f():\n    """Per request."""\n    return 1'


# --- what a file leaves unsaid ---------------------------------------------------


def test_an_argument_equal_to_vllm_s_declared_default_goes() -> None:
    from fuzz.repro.prune_defaults import without_default_arguments

    defaults = {"Config": {"seed": 0, "flag": True, "mode": "none"}}
    source = ("def make():\n    return Config(\n        seed=SEED,\n        flag=1,\n        mode='none',\n"
              "        other=0,\n    ), Other(seed=0)")
    out = without_default_arguments(source, defaults, {"SEED": 0})
    assert out == "def make():\n    return Config(\n        flag=1,\n        other=0,\n    ), Other(seed=0)"
    # Another value, a value of another type (1 is not True), or one it cannot read statically stays.
    assert without_default_arguments("Config(seed=SEED, flag=f())", defaults, {"SEED": 3}) == "Config(seed=SEED, flag=f())"


def test_the_declared_defaults_are_read_from_vllm() -> None:
    from fuzz.adapter import declared_defaults

    found = declared_defaults(("vllm.config.SchedulerConfig", "vllm.v1.outputs.ModelRunnerOutput"))
    assert found["SchedulerConfig"]["prefill_schedule_interval"] == 1
    assert found["ModelRunnerOutput"]["kv_connector_output"] is None
    assert "req_ids" not in found["ModelRunnerOutput"]  # no default declared


def test_a_literal_bound_once_and_read_once_moves_to_its_read() -> None:
    from fuzz.repro.prune_stores import with_literals_inlined

    source = "def f(s):\n    out = None\n    s.update(x=out)\n    return s"
    assert with_literals_inlined(source) == "def f(s):\n    s.update(x=None)\n    return s"
    twice = "def f(s):\n    out = None\n    s.update(x=out)\n    return out"
    assert with_literals_inlined(twice) == twice
    rebound = "def f(s):\n    out = None\n    if s:\n        out = 1\n    return out"
    assert with_literals_inlined(rebound) == rebound
    attribute = "def f(s):\n    n = 1\n    return n.real"  # 1.real would not parse
    assert with_literals_inlined(attribute) == attribute


def test_a_store_the_next_statement_about_its_owner_overwrites_goes() -> None:
    from fuzz.repro.prune_stores import without_overwritten_stores

    source = "def f(s, w):\n    w.a = []\n    out = s.run()\n    w.a = g(out)\n    return out"
    assert without_overwritten_stores(source) == "def f(s, w):\n    out = s.run()\n    w.a = g(out)\n    return out"
    read = "def f(s, w):\n    w.a = []\n    h(w)\n    w.a = g()"
    assert without_overwritten_stores(read) == read
    reads_itself = "def f(w):\n    w.a = []\n    w.a = w.a + [1]"
    assert without_overwritten_stores(reads_itself) == reads_itself
    leaves = "def f(s, w):\n    w.a = []\n    if s:\n        return\n    w.a = g()"  # w.a is [] after an early return
    assert without_overwritten_stores(leaves) == leaves


def test_a_one_line_helper_called_often_moves_into_each_call() -> None:
    from fuzz.repro.prune_inline import inlined_helpers

    sources = {
        "busy": 'def busy(s):\n    """Doc."""\n    return bool(s.requests)',
        "drain": "def drain(s):\n    if not busy(s):\n        return\n    while busy(s):\n        s.step()\n    left = busy(s)",
    }
    assert inlined_helpers(sources, set(), extra="drain(1)") == {
        "drain": "def drain(s):\n    if not s.requests:\n        return\n    while s.requests:\n        s.step()\n"
                 "    left = bool(s.requests)"
    }
    # The test calls it too: it keeps its name.
    assert inlined_helpers(sources, set(), extra="drain(1)\nbusy(2)") == {}


def test_a_name_bound_to_a_call_and_never_read_keeps_only_the_call() -> None:
    from fuzz.repro.prune_stores import without_unread_names

    source = "def f(s, rid):\n    def g(r):\n        facts = s.pending.pop(r, None)\n        return 1\n    return g(rid)"
    assert without_unread_names(source) == (
        "def f(s, rid):\n    def g(r):\n        s.pending.pop(r, None)\n        return 1\n    return g(rid)"
    )
    read = "def f(s):\n    x = s.pop()\n    return x"
    assert without_unread_names(read) == read
