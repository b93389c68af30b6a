"""The step loop of a standalone repro: schedule(), what the model runner
returns, update_from_output(), as the engine core takes a step.

Sync scheduling feeds each output back at once; async scheduling
(ASYNC_SCHEDULING) queues it as EngineCore.step_with_batch_queue does and
feeds it one step late. Each async load in flight is reported done, or
failed; a producer's sends are reported done one step after they begin.
"""

from __future__ import annotations

import dataclasses

from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus

from fuzz.adapter._reports import newly_scheduled
from fuzz.kit._build import _describe_groups
from fuzz.kit._contents import _contents_issue
from fuzz.kit._loads import _failed_loads
from fuzz.kit._outputs import model_runner_output
from fuzz.kit._ownership import _ownership
from fuzz.kit._params import (
    ASYNC_SCHEDULING,
    CONNECTOR,
    FAILING_LOADS,
    KV_ROLE,
    NUM_BLOCKS,
    NUM_SPECULATIVE_TOKENS,
    READ_RULES,
    SPECS,
    SPECULATIVE_METHOD,
    WATCH_ADMISSIONS,
    WATCH_ADMITTED,
    WATCH_CONTENTS,
    WATCH_EVENTS,
    WATCH_EVICTIONS,
    WATCH_HITS,
    WATCH_IN_FLIGHT,
    WATCH_LOOKAHEAD,
    WATCH_NAMESPACES,
    WATCH_ORPHANS,
    WATCH_POOL,
    WATCH_PREEMPTED,
    WATCH_RESETS,
    WATCH_TABLES,
    WATCH_TOKENS,
)
from fuzz.kit._preempt import _preempted_states
from fuzz.kit._watch import _event_gaps, _failed_facts
from fuzz.kit._worker import _propose_drafts, _sampled, _worker_done, _worker_sampled
from fuzz.model._outputs import draft_verifications_of, drafts_to_verify_of, stale_outputs_of, stale_shares_of
from fuzz.model._contents import KvFromOtherToken, event_orphans_of


def _begin_step(scheduler, watch):
    """A new engine step: forget the last step's connector calls and watch records."""
    watch.step += 1
    if WATCH_ADMISSIONS:
        watch.admitting.clear()
    if WATCH_ADMITTED:
        watch.admissions = []
    if CONNECTOR:
        connector = scheduler.connector  # its records of this step start empty
        connector.told.clear()
        connector.answers.clear()
        connector.asked_with.clear()
        connector.async_answers.clear()
        connector.told_blocks.clear()
        connector.events.clear()
        connector.metas.clear()
        watch.loads_in_flight = set(connector.loads_in_flight)
    watch.seen |= set(scheduler.requests)
    # What this step's fed output did, under the suite's names (fuzz.model's records).
    watch.stale_outputs = []  # StaleOutput: the shares of requests preempted since their step
    watch.draft_verifications = ()  # DraftVerification: the drafts it verified
    watch.failed_loads = []  # FailedLoad: the loads it reported failed
    if KV_ROLE == "kv_producer":
        for rid in connector.sends_in_flight:
            watch.send_started.setdefault(rid, watch.step)
    watch.landed.clear()
    if WATCH_POOL:
        for record in (watch.fresh, watch.allocations, watch.lookups, watch.local_hits):
            record.clear()
    if WATCH_RESETS:
        watch.hits_across_reset = []  # HitAcrossReset: what a request adopted that predates a reset
    if WATCH_NAMESPACES:
        watch.foreign_hits = []  # ForeignHit: blocks adopted this step, last written for another namespace
    if WATCH_LOOKAHEAD:
        watch.missing_lookahead = []  # MissingLookahead: tables handed to the runner short of the lookahead
    if WATCH_EVENTS:
        watch.event_gaps = []
        if WATCH_ORPHANS:
            watch.event_orphans = []  # EventOrphan: BlockStored events whose parent no event announced
    if WATCH_PREEMPTED:
        watch.preemptions = []  # PreemptedRequest: each this step's schedule() preempted, as it left it
    if WATCH_HITS:
        watch.lookups_served.clear()


def _scheduled(scheduler, watch):
    """schedule(), and what the watch takes from it right after."""
    out = scheduler.schedule()
    watch.last_output = out
    if WATCH_EVICTIONS:  # the cached blocks this schedule() evicted (Eviction)
        watch.evictions = watch.eviction_watch.take()
    watch.copies = [(c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or ()]
    if WATCH_IN_FLIGHT:
        # Async scheduling: the step queued last is still running; its
        # tables say what its forward pass reads while this one is planned.
        queued = any(s == watch.step - 1 for s, *_ in watch.queue)
        in_flight = dataclasses.replace(watch.ownership, in_flight=None) if queued and watch.ownership else None
    if WATCH_TABLES:
        watch.hold(scheduler, out)
    if WATCH_IN_FLIGHT:
        watch.ownership = _ownership(scheduler, watch, in_flight)
        watch.preempted = set(out.preempted_req_ids or ())
    watch.preempted_at.update(dict.fromkeys(out.preempted_req_ids or (), watch.step))
    if WATCH_PREEMPTED:
        ids = [r for r in sorted(out.preempted_req_ids or ()) if r not in out.num_scheduled_tokens]
        watch.preemptions = _preempted_states(scheduler, ids, watch.step)
        if watch.reset_preempted:  # a prefix-cache reset's come first, as the reset left them
            taken = {p.request_id for p in watch.reset_preempted}
            watch.preemptions = list(watch.reset_preempted) + [p for p in watch.preemptions if p.request_id not in taken]
            watch.reset_preempted = []
    if CONNECTOR:
        watch.async_answers_seen = dict(scheduler.connector.async_answers)
    watch.seen |= set(scheduler.requests)
    watch.newly_scheduled = newly_scheduled(out, scheduler.requests)  # (request id, computed, num_tokens)
    if WATCH_ADMISSIONS:
        watch.take_admissions(scheduler, out)
    return out


def _feed(scheduler, watch, fed, sampled, recving, failed_loads, invalid_block_ids, sending):
    """update_from_output() with the model runner's output for ``fed``.

    It carries what the runner sampled, and the loads and sends the
    connector's worker reports."""
    connector_output = None
    if CONNECTOR:
        if recving or invalid_block_ids or sending:
            connector_output = KVConnectorOutput(
                finished_sending=sending,
                finished_recving=recving,
                failed_recving=recving & set(failed_loads),
                invalid_block_ids=set(invalid_block_ids),
            )
    if NUM_SPECULATIVE_TOKENS:
        watch.verified = drafts_to_verify_of(fed, sampled, scheduler.requests)
        watch.verifying = {rid: scheduler.requests[rid] for rid in watch.verified}
    model_output = model_runner_output(list(fed.num_scheduled_tokens), sampled, connector_output)
    scheduler.update_from_output(fed, model_output)
    if NUM_SPECULATIVE_TOKENS:
        watch.draft_verifications = draft_verifications_of(watch.verified, watch.verifying, scheduler.requests)
    if WATCH_EVENTS:
        watch.event_gaps = _event_gaps(scheduler, watch)
        if WATCH_ORPHANS:
            watch.event_orphans = event_orphans_of(watch.events.take_orphans(), [s.block_size for s in SPECS], READ_RULES)


def _step(scheduler, watch, failed_loads=(), invalid_block_ids=(), failing_blocks=()):
    """One engine step: schedule(), then what a model runner returns (a
    sampled token for each request whose prefill completes, none for a
    partial chunk; each async load in flight reported done, or failed)."""
    if ASYNC_SCHEDULING:
        return _queued_step(scheduler, watch, failed_loads, invalid_block_ids, failing_blocks)
    else:
        _begin_step(scheduler, watch)
        out = _scheduled(scheduler, watch)
        sampled = _sampled(out, _worker_done(out, watch), watch.step)
        _worker_sampled(watch, out, sampled)
        if WATCH_CONTENTS:
            _contents_issue(scheduler, watch, out, sampled, invalid_block_ids)
        _abort_during_step(scheduler, watch)
        recving = set()
        if CONNECTOR:
            # Every load in flight, whether or not the scheduler still lists its request.
            recving = set(scheduler.connector.loads_in_flight)
            scheduler.connector.loads_in_flight -= recving
            if WATCH_CONTENTS:
                for rid in recving:
                    watch.contents.land_async_load(rid, watch.step, rid in set(failed_loads))
        sending = set()
        if KV_ROLE == "kv_producer":
            sending = _sends_done(scheduler, watch, watch.step)
        if FAILING_LOADS:
            watch.failed = _failed_facts(scheduler, watch, recving & set(failed_loads), set(invalid_block_ids))
            watch.failed_loads = _failed_loads(watch.failed)
            watch.failed_waiting.update({r: f for r, f in watch.failed.items() if f["how"] == "failed_recving"})
        if SPECULATIVE_METHOD is not None:  # the rejections it reports reach vLLM
            watch.worker.fed(watch.step)
        _feed(scheduler, watch, out, sampled, recving, failed_loads, invalid_block_ids, sending)
        if SPECULATIVE_METHOD is not None:
            _propose_drafts(scheduler, out)
        if WATCH_TOKENS:
            _settle_tokens(scheduler, out, watch)
        return out


def _queued_step(scheduler, watch, failed_loads=(), invalid_block_ids=(), failing_blocks=()):
    """One engine step as EngineCore.step_with_batch_queue takes it (a queue of
    max_concurrent_batches = 2): schedule() if the scheduler has requests (or
    nothing is queued); the output joins the queue with what the model runner
    samples for it (decided now: a token unless it is a partial prefill
    chunk); if the queue is not full and the step ran tokens or requests are
    left, nothing is fed back; otherwise the oldest output is, with each async
    load in flight that it may carry (started in that step or earlier)
    reported done, or failed. Returns this step's SchedulerOutput (None: no
    schedule())."""
    _begin_step(scheduler, watch)
    out = None
    if not watch.queue or scheduler.has_requests():
        out = _scheduled(scheduler, watch)
        if CONNECTOR:
            for rid in scheduler.connector.loads_in_flight:
                watch.load_started.setdefault(rid, watch.step)
        sampled = _sampled(out, _worker_done(out, watch), watch.step)
        _worker_sampled(watch, out, sampled)
        if WATCH_CONTENTS:  # failing_blocks: those this step's sync loads fail
            _contents_issue(scheduler, watch, out, sampled, failing_blocks)
        admitted = None
        if FAILING_LOADS:  # the admissions _failed_facts reads as this output is fed
            admitted = dict(watch.admitting)
        watch.queue.insert(0, (watch.step, out, sampled, admitted))
        if len(watch.queue) < 2 and (out.total_num_scheduled_tokens > 0 or scheduler.has_requests()):
            _abort_during_step(scheduler, watch)  # nothing fed back: they come after the step
            if WATCH_TOKENS:
                _settle_tokens(scheduler, out, watch)
            return out
    index, fed, sampled, admissions = watch.queue.pop()
    if SPECULATIVE_METHOD is not None:  # the rejections it reports reach vLLM
        watch.worker.fed(index)
    _abort_during_step(scheduler, watch)
    recving = set()
    if CONNECTOR:
        recving = {r for r in scheduler.connector.loads_in_flight if watch.load_started.get(r, 0) <= index}
        scheduler.connector.loads_in_flight -= recving
        if WATCH_CONTENTS:
            for rid in recving:
                watch.contents.land_async_load(rid, index, rid in set(failed_loads))
        for rid in recving:
            watch.load_started.pop(rid, None)
    sending = set()
    if KV_ROLE == "kv_producer":
        sending = _sends_done(scheduler, watch, index)
    if FAILING_LOADS:
        this_step, watch.admitting = watch.admitting, admissions  # the fed step's admissions
        watch.failed = _failed_facts(scheduler, watch, recving & set(failed_loads), set(invalid_block_ids))
        watch.admitting = this_step
        watch.failed_loads = _failed_loads(watch.failed)
        watch.failed_waiting.update({r: f for r, f in watch.failed.items() if f["how"] == "failed_recving"})
    # The shares of requests a schedule() since this step preempted: stale.
    watch.stale = stale_shares_of(list(fed.num_scheduled_tokens), sampled, index, watch.preempted_at,
                                  scheduler.requests)
    watch.stale_requests = {rid: scheduler.requests[rid] for rid in watch.stale}
    _feed(scheduler, watch, fed, sampled, recving, failed_loads, invalid_block_ids, sending)
    watch.stale_outputs = stale_outputs_of(watch.stale, index, getattr(scheduler, "requires_kv_delivery", None),
                                           watch.stale_requests)
    if WATCH_TOKENS:
        _settle_tokens(scheduler, out, watch)
    return out


def _abort_during_step(scheduler, watch):
    """Aborts that arrived while the model ran the step: the engine core
    applies them right before update_from_output (_process_aborts_queue)."""
    if watch.aborts:
        scheduler.finish_requests(list(watch.aborts), RequestStatus.FINISHED_ABORTED)
        watch.aborts.clear()


def _reset_prefix_cache(scheduler, watch, reset_running_requests):
    """The engine core's reset_prefix_cache utility call, between steps: with
    reset_running_requests vLLM first preempts every running request,
    dropping its output still in flight. The watch notes the step a reset
    that succeeded preceded: nothing computed before it may be hit after."""
    running = [r.request_id for r in scheduler.running]
    if scheduler.reset_prefix_cache(reset_running_requests=reset_running_requests):
        watch.reset_before = watch.step + 1
    if WATCH_PREEMPTED:  # as the reset left them
        still = {r.request_id for r in scheduler.running}
        watch.reset_preempted = _preempted_states(scheduler, [r for r in running if r not in still], watch.step)


def _sends_done(scheduler, watch, index):
    """A producer's sends reported done in the output of step ``index``: those
    begun before it (the worker learns a request finished from the next
    schedule() and reports the send in that step's output), whether or not
    the scheduler still lists the request."""
    connector = scheduler.connector
    sending = {r for r in connector.sends_in_flight if watch.send_started.get(r, index + 1) <= index}
    connector.sends_in_flight -= sending
    for rid in sending:
        watch.send_started.pop(rid, None)
    return sending


def _settle_tokens(scheduler, out, watch):
    """After the step: the positions the worker computed for a live request,
    below its num_computed_tokens, whose token vLLM records differently."""
    preempted = (out.preempted_req_ids or ()) if out is not None else ()
    watch.kv_from_other_tokens = [KvFromOtherToken(*wrong) for wrong in watch.worker.settle(scheduler.requests, preempted)]


def _busy(scheduler, watch):
    """Requests left, or reports the worker still owes (loads, sends in flight)."""
    if CONNECTOR:
        connector = scheduler.connector
        if connector.loads_in_flight or connector.sends_in_flight:
            return True
    if ASYNC_SCHEDULING:  # outputs still queued
        if watch.queue:
            return True
    return bool(scheduler.requests)


def _drain(scheduler, watch, max_steps=400):
    for _ in range(max_steps):
        if not _busy(scheduler, watch):
            return
        _step(scheduler, watch)
    for rid in list(scheduler.requests):  # stalled: end them
        scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
    while _busy(scheduler, watch):
        _step(scheduler, watch)


def _assert_no_leaked_blocks(scheduler):
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == NUM_BLOCKS - 1, (
        f"{pool.get_num_free_blocks()} free blocks after every request finished, "
        f"expected {NUM_BLOCKS - 1} (all but the null block); groups: {_describe_groups()}"
    )
    held = [(b.block_id, b.ref_cnt) for b in pool.blocks if b.ref_cnt and not b.is_null]
    assert not held, f"blocks still referenced (block_id, ref_cnt): {held}"
