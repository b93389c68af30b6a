"""The claim of :mod:`invariants.scheduler` a standalone repro still
restates: liveness (the kit's check steps on until it can tell a stranded
request). Its other claims a file states with the suite's checks
themselves, on the watch's records under the suite's names: the
admissions (:mod:`fuzz.kit._admissions`), what a request scheduled is left
to compute, stale output and rejected drafts (fuzz.model's records, and
:mod:`fuzz.kit._loads` for failed loads).

Each kit check restates one suite invariant on vLLM's own objects and the
watch (``fuzz.repro.scheduler._check_of`` pairs them); it is called as
``check(scheduler, out, watch, step)`` right after the step where the
invariant broke, and raises AssertionError naming the step, the request,
the group and the numbers that disagree. The other rooms of checks follow
the suite's: ``_checks_connector``, ``_checks_ownership``. A claim whose
records the watch keeps as the suite does needs no restating: the file
carries the suite's check (:data:`fuzz.kit.SUITE_CHECK_MODULES`).
"""

from __future__ import annotations

from fuzz.kit._driver import _step
from fuzz.kit._params import CONNECTOR


def _check_running_requests_progress(scheduler, out, watch, step):
    """Liveness: a RUNNING request is scheduled again or finishes. From this
    step on, three more steps that schedule nothing, with nothing in flight
    (no queued step output with tokens, no async load, no producer hand-off)
    and no request arriving or leaving, show that no later schedule() sees
    anything new: a request still RUNNING then is stranded."""
    for more in range(4):
        requests = set(scheduler.requests)
        transfers = False
        if CONNECTOR:
            transfers = bool(scheduler.connector.loads_in_flight or scheduler.connector.sends_in_flight)
        if (
            (out is not None and out.total_num_scheduled_tokens > 0)
            or any(queued[1].total_num_scheduled_tokens > 0 for queued in watch.queue)
            or transfers
            or not scheduler.running
        ):
            return
        if more == 3:
            break
        out = _step(scheduler, watch)
        if set(scheduler.requests) != requests:
            return
    stranded = [
        (r.request_id, r.num_computed_tokens, r.num_tokens, getattr(r, "num_output_placeholders", 0))
        for r in scheduler.running
    ]
    raise AssertionError(
        f"step {step}: it and the 3 steps after it scheduled nothing with nothing in flight, yet requests "
        f"(id, num_computed_tokens, num_tokens, num_output_placeholders) {stranded} are RUNNING: no later "
        f"schedule() picks them up"
    )
