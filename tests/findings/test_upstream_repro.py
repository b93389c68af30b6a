"""Upstream-form repros (:func:`fuzz.upstream.upstream_repro`) of the
planted bugs of the claims whose checks attach facts (issue 47's and 48's,
and the older hit and contents claims): each plant's fixed
run (:data:`fuzz.adapter.FIXED_RUNS`; else the connector protocol's
scenario, the speculating run, a hand-made run, or the self-tests' search: the
block-ownership search for its plants), planted, shrunk with its claim's
check alone and replayed for the violation's facts, is written as a test
for vLLM's tests tree. Here, without vLLM's tree: each file is short, lints
clean and carries nothing of the suite. In the tree
(:func:`fuzz.upstream.run_in_tree`): every file passes on unmodified vLLM
(one subprocess for all) and fails on its assertion under its plant (one
subprocess for all, each file's tests under their own plant).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from fuzz.adapter import FIXED_RUNS, SchedulerHarness, planted_scheduler_bug
from fuzz.model import InvariantViolation, StepObservation
from fuzz.runners.scheduler import run_fixed, step_violations
from fuzz.targets.target_scheduler import UNSUPPORTED
from fuzz.upstream import (
    SKIP_REASON,
    run_in_tree,
    tests_tree,
    upstream_form,
    upstream_repro,
)
from invariants.table import invariant
from tests.findings.repro_checks import SEARCH, planted_search_strategy
from tests.invariants.planted_cases import CONNECTOR_CASES, OWNERSHIP_BUDGET, OWNERSHIP_CASES, OWNERSHIP_SEED
from tests.invariants.planted_runs import failed_load_run
from tests.invariants.planted_runs import CONFIG, LOOKUP_AFTER_ANOTHER, SCENARIOS
from tests.invariants.planted_runs import speculating_harness
from tests.support.search import planted_failure

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

# (planted bug, the claim its run is written for): issue 47's claims first.
CASES = (
    ("hash_ignores_parent", "keys-name-one-prefix"),
    ("free_forgets_keys", "cache-keeps-entries"),
    ("free_forgets_keys", "hit-reaches-model"),
    ("lost_when_pool_full", "request-in-one-place"),
    ("deferred_requests_take_slots", "unblocked-request-admitted"),
    ("stored_event_tokens_shifted", "events-carry-tokens"),
    ("stored_event_drops_lora", "events-carry-namespace"),
    ("hands_off_one_block_short", "hand-off-names-computed-blocks"),
    ("encoder_entry_stays_freeable", "encoder-outputs-held"),
    # Older claims whose checks attach facts.
    ("hash_ignores_parent", "reads-written"),
    ("hit_stops_a_block_early", "hit-matches-index"),
    ("window_hit_needs_a_block_more", "hit-matches-index"),
    ("chunk_hit_stops_a_block_early", "hit-matches-index"),
    # Issue 48's: the isolation, reset, preemption, eviction and index claims.
    ("cache_salt_not_hashed", "hits-within-namespace"),
    ("lora_not_hashed", "hits-within-namespace"),
    ("mm_not_hashed", "hits-within-namespace"),
    ("reset_keeps_index", "hits-after-reset"),
    ("preempt_keeps_computed_tokens", "preempted-resumable"),
    ("free_evicts_head_first", "eviction-order"),
    ("evicted_key_stays_indexed", "index-names-its-prefix"),
    ("window_frees_in_flight", "in-flight-reads-held"),
    ("mamba_adopts_same_step_state", "reads-written"),
    ("mamba_adopts_same_step_state", "same-step-hazard"),
    ("max_tokens_skip_unguarded", "running-request-progresses"),
    ("mamba_tail_state_overwritten", "index-written"),
    # The connector protocol's cases (no fixed run: its scenarios, and
    # tests/invariants/planted_runs.py's failed_load_run).
    ("evicts_invalid_blocks_on_recompute", "failed-load-not-cached"),
    ("failed_async_load_kept", "failed-load-not-cached"),
    ("resumes_past_invalid_block", "failed-load-recomputed"),
    ("failed_async_load_kept", "failed-load-recomputed"),
    ("connector_finished_twice", "finished-once"),
    ("skips_meta_on_empty_step", "meta-built-once"),
    ("async_load_counted_scheduled", "meta-names-scheduled"),
    ("no_sync_load_flag", "sync-load-announced"),
    ("async_load_computes_at_once", "async-load-lands-first"),
    # Plants the single-shot search shows caught (tests/support/search.py).
    ("skipping_request_reads_local_cache", "skip-reads-no-cache"),
    ("caches_async_load_early", "index-written"),
    ("mamba_frees_resume_state", "read-blocks-held"),
    # Speculative decoding (ngram and EAGLE drafts): the drafts a preemption
    # keeps, the EAGLE last-block drop, the lookahead slots, the rejected
    # drafts (SPECULATING_RUNS), the tokens recorded for accepted ones.
    ("preempt_keeps_drafts", "preempted-resumable"),
    ("eagle_drop_forgotten", "hit-matches-index"),
    ("eagle_drop_reapplied", "hit-matches-index"),
    ("lookahead_not_allocated", "lookahead-allocated"),
    ("rejected_drafts_stay_computed", "rejected-drafts-rolled-back"),
    ("records_first_sampled_token", "kv-matches-tokens"),
    # What the scheduler told the connector (get_num_new_matched_tokens,
    # update_state_after_alloc), read back from the file's recording
    # connector; and what it hands the model runner. The first four run the
    # connector protocol's scenarios, the last two the search.
    ("asks_connector_unaligned", "external-contiguous"),
    ("tells_connector_total", "told-external-accounted"),
    ("hands_connector_cached_blocks", "load-blocks-cover"),
    ("keeps_tail_and_loads", "dropped-answer-loads-nothing"),
    ("reports_external_twice", "computed-below-num-tokens"),
    ("skipping_request_loads_external", "skip-reads-no-cache"),
    # Hits, truncation and the hybrid fallback: prompt embeddings, a partial
    # hit's copy-on-write, the external-hit branch's truncation, a crash.
    ("embeds_not_hashed", "hits-within-namespace"),
    ("partial_hit_shares_its_block", "reads-written"),
    ("truncation_one_block_short", "local-part-covered"),
    ("skip_truncation", "computed-adds-up"),
    ("skip_truncation", "truncated-view"),
    ("pre_fix_assert_all", "no-exception"),
    ("fallback_discards_hit", "diverged-falls-back"),
    ("no_divergent_fallback", "mamba-state-at-boundary"),
    # Block ownership, KV events, stale outputs and leaks.
    ("delivers_stale_output", "stale-output-dropped"),
    ("eviction_announces_nothing", "events-replay-index"),
    ("reset_announces_nothing", "events-replay-index"),
    ("stored_event_names_itself_parent", "events-chain"),
    ("truncate_touches_refcounts", "no-leaked-blocks"),
    ("lookup_rounds_limit_up", "lookup-within-limit"),
    ("cow_block_not_reserved", "reservation-covers-allocation"),
    ("mamba_count_goes_negative", "reservation-covers-allocation"),
)
# Planted bug -> the speculating run it is written from (tests/invariants/planted_runs.py's
# speculating_harness: False, ngram drafts under sync scheduling).
SPECULATING_RUNS = {"rejected_drafts_stay_computed": False, "records_first_sampled_token": False}
# (planted bug, claim) -> the connector protocol's scenario that shows it.
CONNECTOR_RUNS = {(bug, claim): scenario for _, claim, bug, scenario in CONNECTOR_CASES}
# Where another scenario shows the plant in fewer lines: told the whole count
# at a sync load, the file needs a second request (the local hit) and the
# mock's answer switched for it (88 lines, one group: past the aim); the
# re-admission after an async load tells the same count on one request.
CONNECTOR_RUNS["tells_connector_total", "told-external-accounted"] = "async-load-partial"
# Planted bug -> the hand-made run written for it where the self-tests'
# search meets it in a run no test can state (tests/invariants/planted_runs.py).
HAND_RUNS = {"lookup_rounds_limit_up": LOOKUP_AFTER_ANOTHER}
# The aim for a 4-step, 2-request case, and its bound for any finding.
AIM_LINES, MAX_LINES = 80, 150
# What a file may import: vLLM, vLLM's tests package, pytest, torch.
ALLOWED_ROOTS = {"vllm", "tests", "pytest", "torch"}


@functools.cache
def written(bug: str, claim: str) -> tuple[str, str, InvariantViolation]:
    """``bug``'s fixed run (or connector scenario, or searched failure),
    planted, in upstream form
    (:func:`fuzz.upstream.upstream_form`): (its path in vLLM's tests tree,
    its source, the violation whose facts it asserts)."""
    check = invariant(claim).check
    run = FIXED_RUNS.get(bug) or HAND_RUNS.get(bug)
    searched = run is None and (bug, claim) not in CONNECTOR_RUNS and bug not in SPECULATING_RUNS
    ownership = [strategy for _, name, planted, strategy in OWNERSHIP_CASES if (planted, name) == (bug, claim)]
    if searched and ownership:  # as the block-ownership self-tests search (their strategy, budget and seed)
        found, _ = planted_failure(bug, ownership[0](), settings=settings(SEARCH, max_examples=OWNERSHIP_BUDGET),
                                   checks=(check,), module_constants=False, seed=OWNERSHIP_SEED)
    elif searched:  # the self-tests' search, with the claim's check alone
        found, _ = planted_failure(bug, planted_search_strategy(), settings=SEARCH, checks=(check,),
                                   module_constants=False)
    with planted_scheduler_bug(bug):
        if searched:
            log = found.oplog  # type: ignore[assignment]
        elif bug in SPECULATING_RUNS:
            harness = speculating_harness(SPECULATING_RUNS[bug])
            assert any(step_violations(step, (check,)) for step in harness.drain(context="speculating")), (bug, claim)
            log = harness.oplog
        elif (bug, claim) in CONNECTOR_RUNS:
            harness, steps = _connector_run(CONNECTOR_RUNS[bug, claim])
            assert any(step_violations(step, (check,)) for step in steps), (bug, claim)
            log = harness.oplog
        else:
            with pytest.raises(InvariantViolation) as caught:
                run_fixed(run, (check,))  # type: ignore[arg-type]
            log = caught.value.oplog  # type: ignore[assignment]
        form = upstream_form(log, claim)  # type: ignore[arg-type]
    assert form is not None, f"{bug}: no upstream file for {claim}"
    rel, source, violation = form
    assert violation.facts and rel.endswith(f"/test_{claim.replace('-', '_')}.py"), (rel, violation.facts)
    return rel.replace("/test_", f"/test_{bug}_"), source, violation


def _connector_run(scenario: str) -> tuple[SchedulerHarness, list[StepObservation]]:
    """The connector protocol's ``scenario`` played to its end: the harness
    (its operation log) and every step."""
    if "-load-fails-" in scenario:
        kind, *_, policy = scenario.split("-")
        return failed_load_run(kind == "async", policy)
    harness, steps = SchedulerHarness(CONFIG), []
    for tokens, max_tokens, reply in SCENARIOS[scenario]:
        harness.add_request(tokens, max_tokens=max_tokens, reply=reply)
        steps += harness.drain(context=scenario)
    return harness, steps


@pytest.mark.parametrize(("bug", "claim"), CASES)
def test_a_planted_bug_is_written_short_in_vllm_s_idiom(bug: str, claim: str, tmp_path: Path) -> None:
    rel, source, violation = written(bug, claim)
    lines = source.count("\n")
    print(f"{rel}: {lines} lines")
    log = violation.oplog
    # The aim holds where vLLM's helpers build the whole layout; a second
    # group (an explicit KVCacheConfig and an HMA connector) costs about 20 lines.
    small = len(log.requests) <= 2 and len(log.steps) <= 4 and len(log.config.draw.layout.groups) == 1  # type: ignore[union-attr]
    assert lines <= (AIM_LINES if small else MAX_LINES), source
    tree = ast.parse(source)
    roots = {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    roots |= {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
              for alias in node.names}
    assert roots <= ALLOWED_ROOTS, roots
    # vLLM's helpers build the scheduler; a single test, no driver loop, no class but a connector's.
    assert "create_scheduler(" in source and "pytestmark = pytest.mark.cpu_test" in source
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions == [f"test_{claim.replace('-', '_')}"], functions
    assert not any(isinstance(n, (ast.For, ast.While)) for n in ast.walk(tree.body[-1])), source
    assert all(n.name in ("HandOffRecorder", "CallRecorder") for n in tree.body if isinstance(n, ast.ClassDef)), source
    # Each fact becomes an assertion whose message names the step.
    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert) and n.msg is not None]
    assert len(asserts) == min(len(violation.facts), 3), source
    if importlib.util.find_spec("ruff") is not None:  # in requirements/lean.txt: CI lints every file written
        path = tmp_path / Path(rel).name
        path.write_text(source)
        lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F,E9",
                               "--line-length", "120", str(path)], capture_output=True, text=True, check=False)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_run_without_facts_gets_no_upstream_file() -> None:
    _, _, violation = written(*CASES[1])
    bare = InvariantViolation(violation.invariant, str(violation))
    assert upstream_repro(violation.oplog, bare) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", ["prefix_caching", "chunked_prefill"])
def test_a_run_with_prefix_caching_or_chunked_prefill_off_gets_no_upstream_file(flag: str) -> None:
    """vLLM's test helpers build schedulers with both on: a file written for
    a run with either off would replay another engine, so none is written
    (the campaign's own sidecar replays it)."""
    _, _, violation = written(*CASES[1])
    log = violation.oplog
    assert upstream_repro(log, violation) is not None  # type: ignore[arg-type]
    draw = log.config.draw
    layout = dataclasses.replace(draw.layout, max_model_len=min(draw.layout.max_model_len, draw.max_num_batched_tokens))
    off = dataclasses.replace(draw, layout=layout, connector=True, **{flag: False})  # caching off needs a connector
    changed = dataclasses.replace(log, config=dataclasses.replace(log.config, draw=off))
    assert upstream_repro(changed, violation) is None  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def files() -> dict[str, tuple[str, str]]:
    """Path in the tree -> (source, planted bug), every case."""
    if tests_tree() is None:
        pytest.skip(SKIP_REASON)
    out = {}
    for bug, claim in CASES:
        rel, source, _ = written(bug, claim)
        out[rel] = (source, bug)
    return out


def test_every_file_passes_on_unmodified_vllm(files: dict[str, tuple[str, str]]) -> None:
    outcomes = run_in_tree({rel: source for rel, (source, _) in files.items()})
    assert len(outcomes) == len(files), outcomes
    failed = {node: o.message for node, o in outcomes.items() if o.outcome != "passed"}
    assert not failed, failed


def test_every_file_fails_on_its_assertion_under_its_plant(files: dict[str, tuple[str, str]]) -> None:
    outcomes = run_in_tree({rel: source for rel, (source, _) in files.items()},
                           plant={rel: bug for rel, (_, bug) in files.items()})
    assert len(outcomes) == len(files), outcomes
    for node, outcome in outcomes.items():
        bug = files[node.split("::")[0].removeprefix("tests/")][1]
        assert outcome.outcome == "failed" and outcome.message.startswith("AssertionError: "), (bug, node, outcome)
        assert "step " in outcome.message or "prefix" in outcome.message, (bug, node, outcome.message)


def test_the_campaign_writes_the_upstream_form_as_the_repro(tmp_path: Path) -> None:
    """A finding whose violation carries facts gets its upstream form as its
    one repro file in the repro directory, named in its sidecar with its
    place in vLLM's tree."""
    from fuzz.adapter import VLLM_VERSION
    from fuzz.campaign.findings import Findings

    bug, claim = CASES[1]
    with planted_scheduler_bug(bug):
        with pytest.raises(InvariantViolation) as caught:
            run_fixed(FIXED_RUNS[bug], (invariant(claim).check,))
        findings = Findings(repro_dir=tmp_path, start=0.0, campaign_seed=None, worker="w0", vllm_version=VLLM_VERSION)
        meta = findings.record("scheduler-machine", 0, caught.value)
    assert meta is not None and meta["repro"] == f"test_{meta['stem'].replace('-', '_')}.py", meta
    assert meta["upstream_path"] == "v1/core/test_cache_keeps_entries.py", meta
    assert sorted(p.name for p in tmp_path.glob("*.py")) == [meta["repro"]]
    assert (tmp_path / meta["repro"]).read_text() == written(bug, claim)[1]
