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
  pool, and which cached blocks allocations evict;
* :mod:`fuzz.adapter._step_parts`: what a step's parts hand on (each step is
  built of parts, one concern each, in the engine core's order), and the
  engine core's batch queue.
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
from fuzz.adapter._step_parts import BatchQueue, Failure, Marks, Pending, Scheduled

from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.outputs import DraftTokenIds  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from fuzz.model import Abort, AddRequest, ConnectorAnswer, Evict, FedOutput, OpLog, ResetPrefixCache, Step  # noqa: E402
from fuzz.model import (  # noqa: E402
    DraftVerification, ExternalReply, GroupInfo, HarnessError, PoolObservation, PreemptedRequest, SchedulerDraw,
    StaleOutput, StepObservation,
)
from fuzz.model import group_behaviour as _group_behaviour, span_of  # noqa: E402

__all__ = ["SchedulerHarness"]


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
        self._verifications: tuple[DraftVerification, ...] = ()  # the step's (see _feed_back)
        self._queue = BatchQueue(self.scheduler, draw.async_scheduling)
        # Request id -> the step whose schedule() started its async load: a
        # load lands in the output of that step or a later one, never earlier.
        self._load_started: dict[str, int] = {}
        # Request id -> the engine step whose update_from_output handed it to
        # a producer's send (request_finished held its blocks).
        self._send_started: dict[str, int] = {}
        self.ownership = OwnershipSpy(self.scheduler, self.groups, self.spans)
        self.evictions = EvictionWatch(  # wraps the spy's wrappers
            self.scheduler, lambda: self.step_index, _compat.prefix_cache_map, _compat.group_of_key)
        self.cache_model = CacheModel(self.scheduler, self.evictions, lambda: self.step_index,
                                      prefix_caching=draw.prefix_caching)
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
    def _pending(self) -> Pending | None:
        return self._queue.pending

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
        req = _oplog.request_of(op, self.hash_block_size, _compat.hash_lookahead(self.scheduler))
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
        ``step_with_batch_queue`` (queue of 2), see :class:`BatchQueue`: a
        step's output is usually fed after the next ``schedule()``;
        :attr:`StepObservation.fed_step` says whose output a step fed. The
        step's operation-log entry is the one the observation carries."""
        if self.broken:
            raise RuntimeError(f"the scheduler is unusable after an earlier failure: {self.broken}")
        marks = self._new_step()
        t0 = time.perf_counter()
        failure, reset_preempted = self._apply_resets()
        # EngineCore.step_with_batch_queue schedules only `if
        # self.scheduler.has_requests()`; with nothing queued the harness
        # schedules anyway (as the synchronous drive does on an idle scheduler).
        schedules = failure is None and (
            not self.draw.async_scheduling or self._pending is None or self.scheduler.has_requests())
        prefill_held = schedules and self.observer.prefill_held()
        out, failure = self._schedule() if schedules else (None, failure)
        self.vllm_seconds += time.perf_counter() - t0
        seen = self._what_schedule_did(out, marks, reset_preempted)
        queued, model_fields = self._run_model(out, seen)
        fed = None if failure else self._queue.take(queued)
        finished, failure, event_fields = self._feed(fed, failure)
        if failure:
            self.broken = failure.error
        after_fields = self._after_feed(out, fed, finished, failure)
        op = self._log_step(out, seen.queries, failure, finished, fed)
        return StepObservation.recorded(
            op,
            context=context,
            vllm_version=VLLM_VERSION,
            async_scheduling=self.draw.async_scheduling,
            schedule_called=schedules,
            prefill_held=prefill_held,
            loads_in_flight=marks.in_flight,
            rolled_back=marks.rolled_back,
            fed_step=None if fed is None else fed.index,
            **Failure.fields_of(failure), **seen.fields(), **model_fields, **event_fields, **after_fields,
            **self._end_of_step(out, fed, failure, seen.admissions),
        )

    def _new_step(self) -> Marks:
        """Count the step and start every recorder's records of it."""
        self.step_index += 1
        self._fed = None
        self._stale = []
        self._verifications = ()
        self.spies.new_step()
        rolled_back = self.faults.new_step()
        self.ownership.new_step()
        script = self.script
        return Marks(len(script.queries), len(script.allocs), len(script.metas), frozenset(script.loads_in_flight),
                      rolled_back)

    def _apply_resets(self) -> tuple[Failure | None, tuple[PreemptedRequest, ...]]:
        """The prefix-cache resets asked for since the last step, in order,
        right before its ``schedule()`` (the engine core's utility calls):
        the failure of one, and the running requests they preempted."""
        due, self._resets_due = self._resets_due, []
        if not due:
            return None, ()
        failure = None
        running = [r.request_id for r in self.scheduler.running]
        try:
            for reset in due:
                self.resets.append((self.step_index, self.scheduler.reset_prefix_cache(reset.reset_running)))
        except Exception as exc:  # noqa: BLE001 - every failure is an observation
            failure = Failure(*step_failure(exc, "reset_prefix_cache"))
        still = {r.request_id for r in self.scheduler.running}
        return failure, self.observer.preempted_states([r for r in running if r not in still], self.step_index)

    def _schedule(self) -> tuple[Any, Failure | None]:
        """``schedule()``: its ``SchedulerOutput``, or what it raised."""
        try:
            return self.scheduler.schedule(), None
        except Exception as exc:  # noqa: BLE001 - every failure is an observation
            return None, Failure(*step_failure(exc, "schedule"))

    def _what_schedule_did(self, out: Any, marks: Marks, reset_preempted: tuple[PreemptedRequest, ...]) -> Scheduled:
        """Block ownership right after ``schedule()``, what it asked the
        connector and admitted, the async loads it started, whom it
        preempted or scheduled anew, and the synchronous loads to fail."""
        # Under async scheduling the step queued before this schedule() is
        # still in flight: its forward pass reads while this one is planned.
        running = self._pending.index if self.draw.async_scheduling and self._pending is not None else None
        ownership = self.ownership.observe(self.step_index, out, self.read_rules, self.script.send_blocks, running)
        queries = self.script.queries[marks.queries:]
        allocs = self.script.allocs[marks.allocs:]
        dishonest = tuple(q.request_id for q in queries if not self.script.reply_for(q.request_id).honest)
        admissions = self.observer.admissions(out, queries, allocs)
        connector_allocs = self.observer.connector_allocs(queries, allocs)
        for a in connector_allocs:
            if a.num_external_tokens and a.reply_async:
                self.faults.load_started(a)
                self._load_started[a.request_id] = self.step_index
        metas = tuple(self.script.metas[marks.metas:])
        preemptions = self.observer.preemptions(out, self.step_index, reset_preempted)
        newly = self.observer.newly_scheduled(out)
        return Scheduled(queries, admissions, connector_allocs, newly, self.faults.invalid_blocks(admissions),
                          dishonest, metas, ownership, preemptions)

    def _run_model(self, out: Any, seen: Scheduled) -> tuple[Pending | None, dict[str, Any]]:
        """The model runner's work on a scheduled step (none when nothing
        was): the step queued with what it returns, and the prefix-cache
        index as the step runs."""
        if out is None:
            return None, {}
        step, runner = self.step_index, self.runner
        runner.hand_over(out, seen.connector_allocs, seen.admissions, seen.invalid, step)
        sampled = runner.sample(out, step, frozenset(r for r, *_ in seen.newly), self._whole_prompt_landed,
                                self.faults.recomputed_failed_load)
        queued = Pending(step, out, sampled, seen.invalid, self.faults.take_sync_failures())
        # The index as the step runs: what schedule() cached, against
        # what the step's forward pass and loads have written by then
        # (an async load's blocks only once it is reported landed).
        unbacked, misnamed = runner.index_entries(self.pool, self.scheduler.requests, self.faults.recomputed_failed_load)
        last_reset = max((s for s, ok in self.resets if ok), default=0)
        return queued, dict(unbacked_entries=unbacked, misnamed_entries=misnamed,
                            foreign_hits=runner.foreign_hits(seen.admissions),
                            hits_across_reset=runner.hits_across_reset(seen.admissions, last_reset))

    def _feed(self, fed: Pending | None, failure: Failure | None
              ) -> tuple[frozenset[str], Failure | None, dict[str, Any]]:
        """Feed ``fed`` back (None: nothing this step) with the aborts that
        came while the model ran, then hand over the drafts: the requests
        that left, the step's failure, and the KV events replayed."""
        finished: frozenset[str] = frozenset()
        events: dict[str, Any] = {}
        if fed is not None:
            try:
                self.faults.process_aborts()
                finished = self._feed_back(fed)
                events["event_gaps"] = self.observer.event_gaps(self.runner.keys, self.resets)
                events["event_orphans"] = self.observer.event_orphans(self.read_rules, self.runner.keys)
            except Exception as exc:  # noqa: BLE001
                failure = Failure(*step_failure(exc, "update_from_output"))
        if failure is None:  # nothing fed back: the input queue aborts them after the step
            self.faults.process_aborts()
        if failure is None and fed is not None:
            self._propose_drafts(fed)
        return finished, failure, events

    def _after_feed(self, out: Any, fed: Pending | None, finished: frozenset[str],
                    failure: Failure | None) -> dict[str, Any]:
        """What the connector was told of finished requests, the requests
        stranded, and KV computed from other tokens, once the step is fed."""
        error = None if failure is None else failure.error
        finishes, left = self.observer.finish_calls()
        stranded = self.observer.stranded(
            out, None if fed is None else fed.out, None if self._pending is None else self._pending.out, finished,
            error, bool(self.faults.step_failed_loads), self.faults.recomputed_failed_load)
        self.observer.progress(finished)
        kv_wrong = (
            () if error
            else self.runner.kv_from_other_tokens(out, self.scheduler.requests, self.faults.recomputed_failed_load)
        )
        return dict(connector_finishes=finishes, left_scheduler=left, stranded=stranded, kv_from_other_tokens=kv_wrong)

    def _log_step(self, out: Any, queries: Sequence[Any], failure: Failure | None, finished: frozenset[str],
                  fed: Pending | None) -> Step:
        """The step's one record, appended to the operation log."""
        op = Step(
            index=self.step_index,
            output=None if out is None else _oplog.scheduled_output(out),
            answers=tuple(ConnectorAnswer(q.request_id, q.num_computed_tokens, q.reply, q.load_async) for q in queries),
            fed=self._fed,
            error=None if failure is None else failure.error,
            error_where=None if failure is None else failure.where,
            left=tuple(sorted(finished)),
            fed_step=None if fed is None or fed.index == self.step_index else fed.index,
        )
        self.oplog.ops.append(op)
        return op

    def _end_of_step(self, out: Any, fed: Pending | None, failure: Failure | None,
                     admissions: tuple[Any, ...]) -> dict[str, Any]:
        """The observation's fields read once the step is recorded, in this
        order (the fate and the cache model read the log and the pool)."""
        error = None if failure is None else failure.error
        ran, runner = out is not None, self.runner
        return dict(
            num_scheduled=dict(out.num_scheduled_tokens) if ran else {},
            copies=tuple((c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or ()) if ran else (),
            preempted=frozenset(out.preempted_req_ids or ()) if ran else frozenset(),
            failed_loads=tuple(self.faults.step_failed_loads),
            rolled_back_in_flight=frozenset(self.faults.past_load),
            whole_prompt_landed=frozenset(self._whole_prompt_landed),
            stale_outputs=tuple(self._stale),
            draft_verifications=self._verifications,
            unwritten_reads=tuple(runner.unwritten_reads) if ran else (),
            key_collisions=runner.key_collisions(),
            missing_encoder_outputs=runner.missing_encoder_outputs if ran else (),
            event_payloads=self.observer.event_payloads(self.read_rules, runner.keys, self.oplog.ops),
            events_replayed=self.observer.events is not None and fed is not None and not error,
            missing_lookahead=tuple(runner.missing_lookahead) if ran else (),
            **self.fate.after_step(out, self._pending, error),
            evictions=self.evictions.take(),
            **self.cache_model.take(admissions),
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

    def _propose_drafts(self, fed: Pending) -> None:
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

    def _feed_back(self, step: Pending) -> frozenset[str]:
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
