"""The real vLLM ``Scheduler``, driven a step at a time.

:class:`SchedulerHarness` drives a real ``Scheduler`` built for a
:class:`fuzz.model.SchedulerDraw` (:mod:`fuzz.adapter._build`): each step
``schedule()``, then, as the engine core orders it (batch queue included),
the model runner's output fed back through ``update_from_output``, and the
step reported as a :class:`fuzz.model.StepObservation`. The other jobs have
rooms of their own, which the harness composes:

* :mod:`fuzz.adapter._runner`: the model runner (samples, writes, reads, returns);
* :mod:`fuzz.adapter._faults`: failing loads and aborts during a step;
* :mod:`fuzz.adapter._observations`: the observations, assembled from the
  recording wrappers and the scripted connector's records;
* :mod:`fuzz.adapter._evictions`: how each free block came back to the
  pool, and which cached blocks allocations evict.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import Any

from fuzz.adapter import _compat, _connector, _fate, _oplog
from fuzz.adapter._build import build_scheduler
from fuzz.adapter._cache_model import CacheModel
from fuzz.adapter._contents import namespace_of
from fuzz.adapter._env import VLLM_VERSION
from fuzz.adapter._evictions import EvictionWatch
from fuzz.adapter._faults import Faults
from fuzz.adapter._observations import QUIET_STEPS, Observer
from fuzz.adapter._observe import step_failure
from fuzz.adapter._ownership import OwnershipSpy, read_rules
from fuzz.adapter._runner import ScriptedRunner, runner_output
from fuzz.adapter._specs import qualified_name

from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.outputs import DraftTokenIds  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from fuzz.model import Abort, AddRequest, ConnectorAnswer, Evict, FedOutput, OpLog, ResetPrefixCache, Step  # noqa: E402
from fuzz.model import (  # noqa: E402
    DraftVerification, EventGap, EventOrphan, ExternalReply, ForeignHit, GroupInfo, HarnessError, HitAcrossReset,
    MisnamedEntry, PoolObservation, PreemptedRequest, SchedulerDraw, StaleOutput, StepObservation, UnbackedEntry,
)
from fuzz.model import group_behaviour as _group_behaviour, span_of  # noqa: E402

__all__ = ["SchedulerHarness"]


@dataclasses.dataclass
class _Pending:
    """A scheduled step and what the model runner returns for it, decided
    when it was scheduled (what the GPU computes for that SchedulerOutput)."""

    index: int
    out: Any
    sampled: list[list[int]]
    invalid_block_ids: set[int]
    # The synchronous loads reported failed with it (see Faults.invalid_blocks).
    sync_failures: dict[str, tuple[int, int, tuple[int, ...], int]]


class SchedulerHarness:
    """A real ``Scheduler`` for one :class:`SchedulerDraw`, driven step by step.

    Raises :class:`InvalidLayout` when vLLM refuses the configuration (its
    config validation, block-size resolver or constructors).
    """

    def __init__(self, draw: SchedulerDraw) -> None:
        self._next_id = itertools.count()
        self.draw = draw
        built = build_scheduler(draw)
        self.scheduler = built.scheduler
        self.kv_cache_config = built.kv_config
        self.scheduler_block_size = built.scheduler_block_size
        self.hash_block_size = built.hash_block_size
        self.script = _connector.SCRIPT
        # The connector's own store saves in whole scheduler blocks (an
        # offloading connector's block is a multiple of the KV block).
        self.script.save_unit = max(1, self.scheduler_block_size)
        self.manager: KVCacheManager = self.scheduler.kv_cache_manager
        self.pool = self.manager.block_pool
        self.null_block_id = self.pool.null_block.block_id
        self.num_blocks = built.kv_config.num_blocks
        self.max_model_len: int = self.scheduler.vllm_config.model_config.max_model_len
        self.groups = tuple(
            GroupInfo(
                index=i,
                spec_class=qualified_name(type(g.kv_cache_spec)),
                inner_classes=(),
                block_size=mgr.block_size,
                prefix_cacheable=_compat.prefix_cacheable(g.kv_cache_spec),
            )
            for i, (g, mgr) in enumerate(
                zip(built.kv_config.kv_cache_groups, self.manager.coordinator.single_type_managers)
            )
        )
        # Per group, its attention-span parameter and value (fuzz.model.span_of).
        self.spans = tuple(None if span is None else span[:2] for span in map(span_of, draw.layout.groups))
        self.step_index = 0
        self.vllm_seconds = 0.0  # inside schedule() and update_from_output()
        self.broken: str | None = None
        self.shortcut_evictions = 0
        self._resets_due: list[ResetPrefixCache] = []  # asked for, done in order right before the next schedule()
        self.resets: list[tuple[int, bool]] = []  # (step it preceded, it succeeded) of each reset done
        self._requests: dict[str, Request] = {}
        self._stale: list[StaleOutput] = []  # this step's stale outputs (see _feed_back)
        self._whole_prompt_landed: set[str] = set()  # see StepObservation.whole_prompt_landed
        # Each of these wraps calls on the scheduler instance; they go on in
        # this order (failed landings, recording spies, then ownership below)
        # so that where two wrap the same call, the later one runs outermost.
        self.faults = Faults(self.scheduler, self.groups, self.null_block_id, draw.kv_load_failure_policy, self._requests)
        self.observer = Observer(
            self.scheduler,
            self.script,
            draw,
            self.groups,
            self.spans,
            (self.scheduler_block_size, self.hash_block_size, self.null_block_id),
            self._requests,
            lambda: self.step_index,
        )
        self.spies = self.observer.spies
        # Everything done to vLLM, in the suite's words (a repro's source of truth).
        self.oplog = OpLog(_oplog.run_config(draw, built, self.groups))
        self._fed: FedOutput | None = None
        # Async scheduling: the engine's batch queue (EngineCore
        # step_with_batch_queue, size max_concurrent_batches = 2): at most one
        # scheduled step whose model output is not fed back yet.
        self._pending: _Pending | None = None
        # Request id -> the step whose schedule() started its async load: a
        # load lands in the output of that step or a later one, never earlier.
        self._load_started: dict[str, int] = {}
        # Request id -> the engine step whose update_from_output handed it to
        # a producer's send (request_finished held its blocks).
        self._send_started: dict[str, int] = {}
        self.ownership = OwnershipSpy(self.scheduler, self.groups, self.spans)
        self.evictions = EvictionWatch(  # wraps the spy's wrappers
            self.scheduler, lambda: self.step_index, _compat.prefix_cache_map, _compat.group_of_key)
        self.cache_model = CacheModel(self.scheduler, self.evictions, lambda: self.step_index)
        self.fate = _fate.FateRecord(self.scheduler, self._requests, self.oplog, self.script, self.evictions, draw.num_speculative_tokens)
        self.read_rules = read_rules(
            built.kv_config, self.groups, self.spans, tuple(_group_behaviour(g).value for g in self.groups))
        specs = tuple(g.kv_cache_spec for g in built.kv_config.kv_cache_groups)
        self.runner = ScriptedRunner(draw, self.groups, self.read_rules, self.null_block_id, self.scheduler, specs)
        self.worker, self.contents = self.runner.worker, self.runner.contents
        self.observer.encoder = self.runner.encoder  # the worker's encoder cache (what a stranded request holds)
        self.script.watch(self.runner.hand_offs.hand_off, self.contents.namespaces)  # read at request_finished

    # -- properties ---------------------------------------------------------
    @property
    def partial_hits_enabled(self) -> bool:
        return _compat.partial_hits_enabled(self.manager.coordinator)

    @property
    def live_request_ids(self) -> tuple[str, ...]:
        return tuple(self.scheduler.requests)

    def status_of(self, request_id: str) -> str | None:
        req = self.scheduler.requests.get(request_id)
        return None if req is None else req.status.name

    def num_computed_tokens(self, request_id: str) -> int | None:
        """What the scheduler counts as computed for ``request_id`` (None once
        it has left); set when a step is scheduled, before its output."""
        req = self.scheduler.requests.get(request_id)
        return None if req is None else req.num_computed_tokens

    def is_idle(self) -> bool:
        return not self.scheduler.requests and self._pending is None and not self.reports_due

    @property
    def reports_due(self) -> bool:
        """The worker still owes vLLM a report (an async load or a
        producer's send in flight): the drive must keep stepping, even when
        vLLM no longer lists the request."""
        return bool(self.script.loads_in_flight or self.script.sends_in_flight)

    @property
    def has_pending_output(self) -> bool:
        """A scheduled step's output is not fed back yet (async scheduling)."""
        return self._pending is not None

    @property
    def invalid_blocks_reported(self) -> list[tuple[str, tuple[int, ...]]]:
        """Per synchronous load failed block by block, its request and blocks."""
        return self.faults.invalid_blocks_reported

    # -- requests ------------------------------------------------------------
    def add_request(
        self,
        tokens: Sequence[int],
        *,
        max_tokens: int = 1,
        reply: ExternalReply | None = None,
        request_id: str | None = None,
        skip_reading_prefix_cache: bool = False,
        cache_salt: str | None = None,
        lora: str | None = None,
        embeds: str | None = None,
        mm: Sequence[tuple[str, int, int]] = (),
    ) -> str:
        """Add a request; ``skip_reading_prefix_cache`` sets that
        ``SamplingParams`` field (a release without it gets a plain request,
        recorded as such); ``cache_salt`` is the request's (a tenant's);
        ``lora`` the LoRA adapter it runs under; ``embeds`` the tag of the
        prompt embeddings it sends instead of ``tokens`` (only their number
        counts: vLLM records zeros); ``mm`` its multimodal items (AddRequest.mm)."""
        limit = self.max_model_len
        if not 0 < len(tokens) < limit:
            # EngineCore never sees such a prompt: vLLM's input processor
            # refuses an empty one and one of max_model_len tokens or more
            # (no room for an output token). A caller that adds one misfits.
            raise HarnessError(f"a prompt of {len(tokens)} tokens with max_model_len={limit}: the engine refuses it")
        rid = request_id or f"r{next(self._next_id)}"
        if embeds is not None:
            tokens, skip_reading_prefix_cache = [0] * len(tokens), False
        skip = skip_reading_prefix_cache and _compat.HAS_SKIP_READING_PREFIX_CACHE
        op = AddRequest(rid, tuple(tokens), max_tokens, reply, self.step_index, skip_reading_prefix_cache=skip,
                        cache_salt=cache_salt or None, lora=lora, embeds=embeds, mm=tuple(mm))
        _oplog.grant_budget_for(self.scheduler, op)
        req = _oplog.request_of(op, self.hash_block_size)
        if reply is not None:
            self.script.replies[rid] = reply
        self._requests[rid] = req
        self.worker.add(rid, tokens)
        self.contents.namespaces[rid] = namespace_of(cache_salt, lora, embeds, [(i, at) for i, at, _ in mm])
        if skip:
            self.observer.skips.add(rid)
        self.oplog.ops.append(op)
        self.scheduler.add_request(req)
        return rid

    def abort(self, request_id: str, *, during_step: bool = False) -> None:
        """Abort ``request_id`` now (between steps), or with ``during_step``
        while the model runs the next step: ``EngineCore`` puts a client's
        abort on its ``aborts_queue`` too and, "Before processing the model
        output, process any aborts that happened during the model execution"
        (``self._process_aborts_queue()`` right before
        ``update_from_output``, in ``step`` and ``step_with_batch_queue``).
        A step that feeds nothing back leaves it to the input queue, after
        the step."""
        self.oplog.ops.append(Abort(request_id, self.step_index, during_step))
        if during_step:
            self.faults.abort_during_step(request_id)
            return
        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)

    def reset_prefix_cache(self, *, reset_running: bool = False) -> None:
        """Reset the prefix cache between steps (the engine core's utility
        call, :class:`ResetPrefixCache`): done right before the next
        ``schedule()``, so that what it raises is that step's error."""
        self._resets_due.append(ResetPrefixCache(self.step_index, reset_running))
        self.oplog.ops.append(self._resets_due[-1])

    def fail_async_load(self, request_id: str) -> None:
        """Report the in-flight async load of ``request_id`` as failed (the
        connector's ``failed_recving`` path) at the next step."""
        self.faults.fail_async_load(request_id)

    def fail_next_async_loads(self) -> None:
        """Report the async loads that land at the next step that has any as
        failed (``failed_recving``), whoever started them: the way to fail an
        async load here, since the harness lands one at the end of the step
        that starts it (as a connector whose transfer takes one step)."""
        self.faults.fail_next_async_loads()

    @property
    def can_report_invalid_blocks(self) -> bool:
        """vLLM maps block-level load failures back to requests only for one
        KV-cache group (block ids are unique per group); with several it
        raises, and connectors must use ``failed_recving`` instead."""
        return len(self.groups) == 1

    def fail_next_sync_loads(self) -> None:
        """At the next step that admits synchronous external loads, report
        them all as failed, block by block (``invalid_block_ids``): the scheduler
        then recomputes, or with ``kv_load_failure_policy="fail"`` evicts the
        invalid blocks and their dependents and fails the request."""
        if not self.can_report_invalid_blocks:
            raise ValueError("invalid_block_ids need a single KV-cache group (vLLM raises otherwise)")
        self.faults.fail_next_sync_loads()

    def loads_in_flight(self) -> tuple[str, ...]:
        return tuple(sorted(self.script.loads_in_flight))

    # -- one engine step -----------------------------------------------------
    def step(self, context: str = "") -> StepObservation:
        """One engine step: ``schedule()``, and feed back what a model runner
        would return: one sampled token for each request whose prefill
        completes (none for a non-final chunk), and the connector's
        finished/failed async loads.

        Synchronous scheduling feeds the step's own output at once (the
        engine core's ``step()``). Async scheduling follows the engine core's
        ``step_with_batch_queue`` (queue of 2), see :meth:`_take_output`: a
        step's output is usually fed after the next ``schedule()``;
        :attr:`StepObservation.fed_step` says whose output a step fed."""
        if self.broken:
            raise RuntimeError(f"the scheduler is unusable after an earlier failure: {self.broken}")
        self.step_index += 1
        self._fed = None
        self._stale = []
        self._verifications: tuple[DraftVerification, ...] = ()
        self.spies.new_step()
        rolled_back = self.faults.new_step()
        self.ownership.new_step()
        asked_before = len(self.script.queries)
        allocs_before = len(self.script.allocs)
        metas_before = len(self.script.metas)
        in_flight = frozenset(self.script.loads_in_flight)
        error = error_type = where = None
        frames: tuple[str, ...] = ()
        statement = ""
        out = None
        t0 = time.perf_counter()
        due, self._resets_due = self._resets_due, []
        reset_preempted: tuple[PreemptedRequest, ...] = ()
        if due:  # the utility calls, in order, right before this step's schedule()
            running = [r.request_id for r in self.scheduler.running]
            try:
                for reset in due:
                    self.resets.append((self.step_index, self.scheduler.reset_prefix_cache(reset.reset_running)))
            except Exception as exc:  # noqa: BLE001 - every failure is an observation
                error, error_type, where, frames, statement = step_failure(exc, "reset_prefix_cache")
            still = {r.request_id for r in self.scheduler.running}
            reset_preempted = self.observer.preempted_states([r for r in running if r not in still], self.step_index)
        # EngineCore.step_with_batch_queue schedules only `if
        # self.scheduler.has_requests()`; with nothing queued the harness
        # schedules anyway (as the synchronous drive does on an idle scheduler).
        schedules = error is None and (
            not self.draw.async_scheduling or self._pending is None or self.scheduler.has_requests())
        prefill_held = schedules and self.observer.prefill_held()
        try:
            if schedules:
                out = self.scheduler.schedule()
        except Exception as exc:  # noqa: BLE001 - every failure is an observation
            error, error_type, where, frames, statement = step_failure(exc, "schedule")
        self.vllm_seconds += time.perf_counter() - t0
        # Under async scheduling the step queued before this schedule() is
        # still in flight: its forward pass reads while this one is planned.
        running = self._pending.index if self.draw.async_scheduling and self._pending is not None else None
        ownership = self.ownership.observe(self.step_index, out, self.read_rules, self.script.send_blocks, running)
        queries = self.script.queries[asked_before:]
        allocs = self.script.allocs[allocs_before:]
        dishonest = tuple(
            q.request_id for q in queries if not self.script.reply_for(q.request_id).honest
        )
        admissions = self.observer.admissions(out, queries, allocs)
        connector_allocs = self.observer.connector_allocs(queries, allocs)
        for a in connector_allocs:
            if a.num_external_tokens and a.reply_async:
                self.faults.load_started(a)
                self._load_started[a.request_id] = self.step_index
        metas = tuple(self.script.metas[metas_before:])
        preemptions = self.observer.preemptions(out, self.step_index, reset_preempted)
        newly = self.observer.newly_scheduled(out)
        invalid = self.faults.invalid_blocks(admissions)
        queued = None
        unbacked: tuple[UnbackedEntry, ...] = ()
        misnamed: tuple[MisnamedEntry, ...] = ()
        foreign: tuple[ForeignHit, ...] = ()
        across: tuple[HitAcrossReset, ...] = ()
        if out is not None:
            self.runner.hand_over(out, connector_allocs, admissions, invalid, self.step_index)
            sampled = self.runner.sample(out, self.step_index, frozenset(r for r, *_ in newly),
                                         self._whole_prompt_landed, self.faults.recomputed_failed_load)
            queued = _Pending(self.step_index, out, sampled, invalid, self.faults.take_sync_failures())
            # The index as the step runs: what schedule() cached, against
            # what the step's forward pass and loads have written by then
            # (an async load's blocks only once it is reported landed).
            unbacked, misnamed = self.runner.index_entries(
                self.pool, self.scheduler.requests, self.faults.recomputed_failed_load)
            foreign = self.runner.foreign_hits(admissions)
            across = self.runner.hits_across_reset(admissions, max((s for s, ok in self.resets if ok), default=0))
        finished: frozenset[str] = frozenset()
        fed = None if error else self._take_output(queued)
        gaps: tuple[EventGap, ...] = ()
        orphans: tuple[EventOrphan, ...] = ()
        if fed is not None:
            try:
                self.faults.process_aborts()
                finished = self._feed_back(fed)
                gaps = self.observer.event_gaps()
                orphans = self.observer.event_orphans(self.read_rules)
            except Exception as exc:  # noqa: BLE001
                error, error_type, where, frames, statement = step_failure(exc, "update_from_output")
        if not error:  # nothing fed back: the input queue aborts them after the step
            self.faults.process_aborts()
        if not error and fed is not None:
            self._propose_drafts(fed)
        if error:
            self.broken = error
        finishes, left = self.observer.finish_calls()
        fed_step = None if fed is None else fed.index
        stranded = self.observer.stranded(
            out,
            None if fed is None else fed.out,
            None if self._pending is None else self._pending.out,
            finished,
            error,
            bool(self.faults.step_failed_loads),
            self.faults.recomputed_failed_load,
        )
        self.observer.progress(finished)
        kv_wrong = (
            () if error
            else self.runner.kv_from_other_tokens(out, self.scheduler.requests, self.faults.recomputed_failed_load)
        )
        self.oplog.ops.append(
            Step(
                index=self.step_index,
                output=None if out is None else _oplog.scheduled_output(out),
                answers=tuple(
                    ConnectorAnswer(q.request_id, q.num_computed_tokens, q.reply, q.load_async) for q in queries
                ),
                fed=self._fed,
                error=error,
                error_where=where,
                left=tuple(sorted(finished)),
                fed_step=None if fed_step == self.step_index else fed_step,
            )
        )
        return StepObservation(
            step=self.step_index,
            admissions=admissions,
            error=error,
            error_type=error_type,
            error_where=where,
            dishonest_replies=dishonest,
            num_scheduled=dict(out.num_scheduled_tokens) if out is not None else {},
            copies=tuple((c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or ()) if out is not None else (),
            newly_scheduled=newly,
            preempted=frozenset(out.preempted_req_ids or ()) if out is not None else frozenset(),
            finished=finished,
            context=context,
            error_frames=frames,
            error_statement=statement,
            vllm_version=VLLM_VERSION,
            connector_allocs=connector_allocs,
            connector_metas=metas,
            loads_in_flight=in_flight,
            connector_finishes=finishes,
            left_scheduler=left,
            failed_loads=tuple(self.faults.step_failed_loads),
            rolled_back=rolled_back,
            rolled_back_in_flight=frozenset(self.faults.past_load),
            whole_prompt_landed=frozenset(self._whole_prompt_landed),
            ownership=ownership,
            fed_step=fed_step,
            async_scheduling=self.draw.async_scheduling,
            schedule_called=schedules,
            prefill_held=prefill_held,
            stale_outputs=tuple(self._stale),
            draft_verifications=self._verifications,
            stranded=stranded,
            kv_from_other_tokens=kv_wrong,
            unwritten_reads=tuple(self.runner.unwritten_reads) if out is not None else (),
            unbacked_entries=unbacked,
            misnamed_entries=misnamed,
            key_collisions=self.runner.key_collisions(),
            missing_encoder_outputs=self.runner.missing_encoder_outputs if out is not None else (),
            event_gaps=gaps,
            event_orphans=orphans, event_payloads=self.observer.event_payloads(self.read_rules, self.runner.keys, self.oplog.ops),
            events_replayed=self.observer.events is not None and fed is not None and not error,
            foreign_hits=foreign,
            hits_across_reset=across,
            missing_lookahead=tuple(self.runner.missing_lookahead) if out is not None else (),
            preemptions=preemptions, **self.fate.after_step(out, self._pending, error),
            evictions=self.evictions.take(), **self.cache_model.take(admissions),
        )

    QUIET_STEPS = QUIET_STEPS

    @property
    def stalled(self) -> bool:
        """The last :attr:`QUIET_STEPS` steps scheduled nothing with nothing
        in flight: no further step changes anything (requests left are
        stranded, or wait for blocks nobody will free)."""
        return self.observer.quiet_steps >= self.QUIET_STEPS

    @property
    def going_nowhere(self) -> bool:
        """Steps keep scheduling work but no request gets further than it
        has been for longer than any recovery takes
        (:meth:`~fuzz.adapter._observations.Observer.going_nowhere`): later
        steps repeat the same loop."""
        return self.observer.going_nowhere()

    def _take_output(self, queued: _Pending | None) -> _Pending | None:
        """The scheduled step whose output this engine step feeds back (None:
        none), ``queued`` being the one just scheduled.

        Synchronous: ``queued`` itself. Async scheduling, as
        ``EngineCore.step_with_batch_queue`` (vllm/v1/engine/core.py) does it:
        the new output joins the queue (``batch_queue.appendleft``); ``if
        len(batch_queue) < self.batch_queue_size and (model_executed or
        self.scheduler.has_requests())`` it returns without feeding anything;
        otherwise ``batch_queue.pop()`` (the oldest) and
        ``update_from_output`` it. ``model_executed`` is
        ``scheduler_output.total_num_scheduled_tokens > 0``; the queue holds
        ``max_concurrent_batches`` = 2 (V1 runner, no PP; V2: pp_size + 1)."""
        if not self.draw.async_scheduling:
            return queued
        if queued is None:  # nothing scheduled (no requests): the oldest is fed
            oldest, self._pending = self._pending, None
            return oldest
        if self._pending is None:
            executed = queued.out.total_num_scheduled_tokens > 0
            if executed or self.scheduler.has_requests():
                self._pending = queued
                return None
            return queued
        oldest, self._pending = self._pending, queued
        return oldest

    def _propose_drafts(self, fed: _Pending) -> None:
        """Hand the drafter's proposals to the scheduler as the engine core
        does after a step (``scheduler.update_draft_token_ids``), see
        :meth:`ScriptedRunner.drafts`."""
        proposal = self.runner.drafts(fed.out)
        if proposal is None:
            return
        ids, drafts = proposal
        if self._fed is not None:
            self._fed = dataclasses.replace(self._fed, drafts=tuple((r, tuple(d)) for r, d in zip(ids, drafts)))
        self.scheduler.update_draft_token_ids(DraftTokenIds(ids, drafts))

    def _feed_back(self, step: _Pending) -> frozenset[str]:
        """``update_from_output`` of ``step``'s output, with the connector's
        async loads that have landed by then (those started in that step or
        earlier: a worker reports a load in the output of a step it ran)."""
        sched = self.scheduler
        out, invalid_block_ids = step.out, step.invalid_block_ids
        self.worker.fed(step.index)
        ids = list(out.num_scheduled_tokens)
        sampled = step.sampled
        # Decided from what the connector was told, never from which
        # requests vLLM still lists: a report for a request vLLM forgot
        # must reach it (a real worker reports what it was asked to do).
        recving = self.worker.loads_landing(self.script.loads_in_flight, self._load_started, step.index)
        # A producer's hand-offs: the worker learns a request finished from
        # the next schedule()'s finished_req_ids and reports the send done in
        # the output of a step scheduled after request_finished (one step).
        sending = self.worker.sends_done(self._send_started, step.index)
        for rid in sending:
            del self._send_started[rid]
            self.script.send_blocks.pop(rid, None)
        self.script.sends_in_flight.difference_update(sending)
        failed = self.faults.async_failures(recving)
        for rid in recving:
            self.contents.land_async_load(rid, step.index, failed=rid in failed and _compat.HAS_FAILED_RECVING)
        self.script.loads_in_flight.difference_update(recving)
        output, self._fed = runner_output(ids, sampled, recving, failed, invalid_block_ids, sending)
        sharing = self.faults.before_update(step.sync_failures, failed, invalid_block_ids, out.num_scheduled_tokens)
        before = set(sched.requests)
        stale = self.observer.stale_shares(ids, sampled, step.index)
        verified = self.observer.drafts_to_verify(out, sampled)
        t0 = time.perf_counter()
        try:
            self.fate.reported(sched.update_from_output(out, output))
        finally:
            self.vllm_seconds += time.perf_counter() - t0
            self._stale.extend(self.observer.stale_outputs(stale, step.index))
        for rid in self.script.sends_in_flight - set(self._send_started):
            self._send_started[rid] = self.step_index
        self._verifications = self.observer.verifications(verified)
        rejected = {rid: n - accepted for rid, (n, accepted, _) in verified.items()}
        self.faults.after_update(failed if _compat.HAS_FAILED_RECVING else set(), sharing, rejected, recving - failed)
        for rid in recving - failed:
            if rid in self.script.whole_prompt_sent:
                self._whole_prompt_landed.add(rid)
        return frozenset(before - set(sched.requests))

    def drain(self, max_steps: int = 64, context: str = "") -> list[StepObservation]:
        """Step until no request is left and no report is due (or ``max_steps``)."""
        steps = []
        while (self.scheduler.requests or self._pending or self.reports_due) and len(steps) < max_steps and not self.broken:
            steps.append(self.step(context))
        return steps

    # -- pool ----------------------------------------------------------------
    def pool_observation(self, context: str = "") -> PoolObservation:
        return self.observer.pool(self.num_blocks, context)

    def per_group_cached_block_ids(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Per group, the non-null blocks a per-group lookup of ``tokens`` finds."""
        return self.observer.cached_block_ids(tokens)

    def evict_shortcut(self, block_ids: set[int]) -> None:
        """Drop hand-picked blocks from the prefix cache (a search shortcut:
        a failure reached this way must be re-derived through a real path)."""
        if block_ids:
            self.oplog.ops.append(Evict(tuple(sorted(block_ids)), self.step_index))
            self.shortcut_evictions += 1
            self.manager.evict_blocks(set(block_ids))
