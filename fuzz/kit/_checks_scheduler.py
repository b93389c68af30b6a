"""The claims of the step loop a standalone repro states
(:mod:`invariants.scheduler`'s): what a request scheduled is left to
compute, stale output, rejected drafts and liveness. (Its admission claims,
of the local part a request resumes from and its truncation, a file states
with the suite's checks themselves, on :mod:`fuzz.kit._admissions`'s records.)

Each kit check restates one suite invariant on vLLM's own objects and the
watch (``fuzz.repro_scheduler._check_of`` pairs them); it is called as
``check(scheduler, out, watch, step)`` right after the step where the
invariant broke, and raises AssertionError naming the step, the request,
the group and the numbers that disagree. The other rooms of checks follow
the suite's: ``_checks_connector``, ``_checks_ownership``. A claim whose
records the watch keeps as the suite does needs no restating: the file
carries the suite's check (:data:`fuzz.kit.SUITE_CHECK_MODULES`).
"""

from __future__ import annotations

from vllm.v1.request import RequestStatus

from fuzz.kit._build import _describe_groups
from fuzz.kit._driver import _step
from fuzz.kit._params import CONNECTOR


def _check_computed_below_num_tokens(scheduler, out, watch, step):
    """A request scheduled for the first time (or resumed) leaves at least
    one token to compute: num_computed_tokens < num_tokens."""
    cached = out.scheduled_cached_reqs
    rows = [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs]
    rows += [(r, cached.num_computed_tokens[i]) for i, r in enumerate(cached.req_ids) if r in cached.resumed_req_ids]
    for rid, computed in rows:
        num_tokens = watch.scheduled_num_tokens[rid]
        assert computed < num_tokens, (
            f"step {step}: request {rid} scheduled with num_computed_tokens={computed} >= "
            f"num_tokens={num_tokens}: nothing left to compute; groups: {_describe_groups()}"
        )


def _check_stale_output_dropped(scheduler, out, watch, step):
    """A request preempted while a step that scheduled it was still running
    (async scheduling) gets none of that step's sampled tokens when the
    scheduler drops stale output (its connector hands KV off:
    requires_kv_delivery): the preemption freed the blocks that output's KV
    was in, and the resumed request samples those positions again."""
    if not scheduler.requires_kv_delivery:
        return
    for rid, (request, before) in watch.stale.items():
        assert request.num_tokens == before, (
            f"step {step}: request {rid}, preempted after the step whose output was fed, "
            f"went from {before} to {request.num_tokens} tokens: its stale output was appended"
        )


def _check_rejected_drafts_rolled_back(scheduler, out, watch, step):
    """A running request whose k drafts the fed output verified with a
    accepted loses exactly k - a from num_computed_tokens in
    update_from_output (the rejected positions are not computed). A share
    of the output made stale by a preemption since makes no claim."""
    for rid, (num_drafts, accepted, before) in watch.verified.items():
        req = scheduler.requests.get(rid)
        if req is None or req.status != RequestStatus.RUNNING or rid in watch.failed or rid in watch.stale:
            continue
        assert before - req.num_computed_tokens == num_drafts - accepted, (
            f"step {step}: update_from_output() verified {num_drafts} drafts of request {rid} and accepted "
            f"{accepted}, so {num_drafts - accepted} positions must leave num_computed_tokens; it went "
            f"{before} -> {req.num_computed_tokens}; groups: {_describe_groups()}"
        )


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
