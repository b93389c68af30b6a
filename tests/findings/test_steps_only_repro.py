"""A finding whose claim no assertion states yet (its check attaches no
facts) still gets its repro in vLLM's idiom
(:func:`fuzz.upstream.steps_only_repro`): the run's concrete steps up to
the one that broke the claim, and a docstring naming the claim, the step
and the command that checks it. The campaign writes one file per finding
either way (:func:`fuzz.upstream.scheduler_repro_of_failure`)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from fuzz.adapter import FIXED_RUNS, VLLM_VERSION, planted_scheduler_bug
from fuzz.campaign.findings import Findings
from fuzz.model import InvariantViolation, OpLog, decode_oplog
from fuzz.runners.scheduler import run_fixed
from fuzz.targets.target_scheduler import UNSUPPORTED
from fuzz.upstream import SKIP_REASON, run_in_tree, steps_only_repro, tests_tree
from invariants.table import invariant

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

# A plant on its fixed run. Every planted claim's check now attaches facts;
# a branch that attaches none (a claim no assertion states yet) is this
# violation with its facts dropped.
BUG, CLAIM = "stored_event_names_itself_parent", "events-chain"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, InvariantViolation]:
    """The plant's finding as a campaign worker records it: the repro
    directory, the sidecar, the violation."""
    where = tmp_path_factory.mktemp("repros")
    with planted_scheduler_bug(BUG):
        with pytest.raises(InvariantViolation) as caught:
            run_fixed(FIXED_RUNS[BUG], (invariant(CLAIM).check,))
        assert caught.value.facts, "the check no longer attaches facts: drop this stand-in"
        caught.value.facts = ()
        meta = Findings(repro_dir=where, start=0.0, campaign_seed=None, worker="w0",
                        vllm_version=VLLM_VERSION).record("scheduler-machine", 0, caught.value)
    assert meta is not None
    return where, meta, caught.value


def test_a_finding_without_facts_gets_one_steps_only_file(recorded) -> None:  # type: ignore[no-untyped-def]
    where, meta, violation = recorded
    assert not violation.facts
    assert sorted(p.name for p in where.glob("*.py")) == [meta["repro"]] == [f"test_{meta['stem'].replace('-', '_')}.py"]
    assert meta["upstream_path"] == "v1/core/test_events_chain.py", meta
    source = (where / meta["repro"]).read_text()
    tree = ast.parse(source)
    (test,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert test.name == "test_events_chain"
    doc = " ".join((ast.get_docstring(test) or "").split())
    # The claim, the step it broke at, and the command that checks it.
    assert doc.startswith("Every BlockStored event names as parent_block_hash"), doc
    steps = decode_oplog(json.loads((where / f"{meta['stem']}.json").read_text())["oplog"]).steps
    assert f"breaks it at step {steps[-1].index}" in doc, doc
    assert f"`python -m fuzz replay {meta['stem']}.json`" in doc, doc
    # The steps in vLLM's idiom, each one a schedule(); no assertion, no loop, nothing of the suite.
    assert "create_scheduler(" in source and source.count("scheduler.schedule()") == len(steps), source
    assert not any(isinstance(n, (ast.Assert, ast.For, ast.While)) for n in ast.walk(tree)), source
    roots = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert roots <= {"vllm", "tests", "pytest", "torch"}, roots


def test_a_run_that_cannot_be_stated_gets_no_file(recorded) -> None:  # type: ignore[no-untyped-def]
    _, _, violation = recorded
    assert steps_only_repro(OpLog(violation.repro_oplog.config, []), violation, sidecar="x.json") is None


def test_the_steps_only_file_runs_in_vllm_s_tree(recorded) -> None:  # type: ignore[no-untyped-def]
    """Unmodified vLLM runs the steps to the end: the file passes."""
    if tests_tree() is None:
        pytest.skip(SKIP_REASON)
    where, meta, _ = recorded
    outcomes = run_in_tree({meta["upstream_path"]: (where / meta["repro"]).read_text()})
    assert [o.outcome for o in outcomes.values()] == ["passed"], outcomes
