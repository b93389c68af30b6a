"""Which planted scheduler bug each fixed run shows caught, and by which
check.

The runs are data beside the plants (:data:`fuzz.adapter.FIXED_RUNS`,
played by :func:`fuzz.runners.scheduler.run_fixed`); the check a run is
shown with is the one whose row in :data:`invariants.table.INVARIANTS`
names the plant. The self-tests (``tests/invariants/test_scheduler_planted.py``)
and the upstream-form repro tests (``tests/findings/test_upstream_repro.py``) derive
their cases from :func:`shown_on_runs` (through
``tests/invariants/planted_cases.py``): a new plant shown on a fixed run
touches no file here. Beside them, the hand-made runs the self-tests and
the repro tests both play: the speculating run and the failed loads of the
connector protocol; and a run only the upstream-form repro plays, where the
search's run of its plant cannot be stated as a test (a lookup past its limit).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from fuzz.adapter import FIXED_RUNS, SPECULATING, SchedulerHarness
from fuzz.model import ExternalReply, FixedPrompt, FixedRun, LayoutDraw, SchedulerDraw, SpecDraw, StepObservation
from fuzz.runners.scheduler import Stepper, run_fixed
from invariants.table import INVARIANTS, Invariant
from tests.support.harnesses import harness_of

# A plant more than one row names: the row its run shows (the other row's
# case is elsewhere: same-step-hazard's in tests/invariants/test_ownership_planted.py).
SHOWN_AS = {"mamba_adopts_same_step_state": "reads-written", "hash_ignores_parent": "reads-written", "free_forgets_keys": "cache-keeps-entries"}


def shown_on_runs() -> dict[str, tuple[Callable[..., Stepper], str | None, Invariant]]:
    """Planted bug -> (its fixed run, called with the checks; the label the
    unmodified run carries, None: any run meets the case; the scheduler row
    it is shown failing)."""
    out = {}
    for bug, run in FIXED_RUNS.items():
        rows = [row for row in INVARIANTS if row.tier == "scheduler" and bug in row.planted
                and SHOWN_AS.get(bug, row.name) == row.name]
        assert len(rows) == 1, f"{bug}: named by the rows {[r.name for r in rows]}; say which in SHOWN_AS"
        out[bug] = (functools.partial(run_fixed, run), run.label, rows[0])
    return out


def speculating_harness(async_scheduling: bool) -> SchedulerHarness:
    """:data:`fuzz.adapter.SPECULATING`'s run (ngram sync, EAGLE async), its
    requests added, not stepped."""
    run = SPECULATING[async_scheduling]
    harness = SchedulerHarness(run.config)
    for prompt in run.prompts:
        harness.add_request(prompt.tokens, max_tokens=prompt.max_tokens)
    return harness


# Failed loads. A 16-token request on one full-attention group (block 4)
# whose connector answers 12 loads [0, 12) synchronously into blocks 0-2
# (cached at allocation); the harness reports all three invalid
# (invalid_block_ids), so the request resumes at 0 ("recompute") or fails
# ("fail", its blocks evicted). A 20-token request on the same group whose
# async load of [0, 15) is reported failed (failed_recving) in the step
# it starts: "recompute" resets it to 0 and frees the blocks when it leaves
# WAITING_FOR_REMOTE_KVS (it then loads again, and that load lands); "fail"
# ends it.
ONE_GROUP = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=32)


def failed_load_run(async_load: bool, policy: str) -> tuple[SchedulerHarness, list[StepObservation]]:
    """One request whose sync or async load fails under ``policy``, run to
    its end: the harness (its operation log) and every step (the connector
    protocol's failed-load scenarios, tests/invariants/test_connector_protocol.py)."""
    harness = harness_of(ONE_GROUP, batch=32, kv_load_failure_policy=policy)
    if async_load:
        rid = harness.add_request(tuple(range(100, 120)), max_tokens=2, reply=ExternalReply("store", store_len=15, load_async=True))
        harness.fail_async_load(rid)
    else:
        harness.add_request(tuple(range(100, 116)), max_tokens=1, reply=ExternalReply("store", store_len=12))
        harness.fail_next_sync_loads()
    return harness, harness.drain(context=f"{'async' if async_load else 'sync'} load fails, policy {policy}")


# The connector protocol's scenarios (tests/invariants/test_connector_protocol.py;
# the upstream-form repros of its claims run them too).
CONFIG = SchedulerDraw(
    layout=LayoutDraw(
        (SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=1, num_blocks=32
    ),
    max_num_batched_tokens=32,
)
TOKENS = tuple(range(100, 130))
NONE = ExternalReply("zero")

# name: requests run one after another (tokens, max_tokens, reply).
SCENARIOS: dict[str, tuple[tuple[tuple[int, ...], int, ExternalReply], ...]] = {
    "sync-load-truncates-tail": (
        (TOKENS[:10], 1, NONE),
        (TOKENS[:16], 1, ExternalReply("store", store_len=16)),
    ),
    "tail-kept-answer-dropped": (
        (TOKENS[:10], 1, NONE),
        (TOKENS[:16], 1, ExternalReply("store", store_len=9)),
    ),
    "async-load-partial": ((TOKENS[:20], 2, ExternalReply("store", store_len=15, load_async=True)),),
}


# A lookup past its limit, where a test can see it: one 16-token prompt (four
# full 4-token blocks) sent twice, one after the other. The resend's limit is
# 15 (num_tokens - 1), so its hit is 12; a lookup that rounds the limit up to
# a whole block hits all 16, and the schedule() that admits it raises. (The
# ownership search meets the plant where both requests arrive together, and
# the hit is on blocks cached inside that same raising schedule().)
LOOKUP_AFTER_ANOTHER = FixedRun(
    SchedulerDraw(LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17),
                  max_num_batched_tokens=32, max_num_seqs=2, connector=False, divergent_hits=False),
    (FixedPrompt(tuple(range(16)), 2),) * 2, one_after_another=True, hits=(0, 12))
