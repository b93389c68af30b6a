"""Which planted scheduler bug each fixed run shows caught, and by which
check.

The runs are data beside the plants (:data:`fuzz.adapter.FIXED_RUNS`,
played by :func:`fuzz.runners.scheduler.run_fixed`); the check a run is
shown with is the one whose row in :data:`invariants.table.INVARIANTS`
names the plant. The self-tests (``tests/invariants/test_scheduler_planted.py``)
and repro tests (``tests/findings/test_scheduler_repro_runs.py``) derive
their cases from :func:`shown_on_runs`: a new plant shown on a fixed run
touches no file here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from fuzz.adapter import FIXED_RUNS, SPECULATING, SchedulerHarness
from fuzz.runners.scheduler import Stepper, run_fixed
from invariants.table import INVARIANTS, Invariant

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
