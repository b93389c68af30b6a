"""The real vLLM ``Scheduler``, driven a step at a time.

:class:`SchedulerHarness` builds a real ``Scheduler`` for a
:class:`fuzz.model.SchedulerDraw` (:mod:`fuzz.adapter._config`), with the
scripted KV connector of :mod:`fuzz.adapter._connector` and the recording
wrappers of :mod:`fuzz.adapter._observe`, then drives it: ``schedule()``
plus a ``ModelRunnerOutput`` fed back through ``update_from_output``, and
reports each step as a :class:`fuzz.model.StepObservation`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Sequence
from typing import Any

from fuzz import outcomes
from fuzz.adapter import _compat, _connector, _oplog, _planted
from fuzz.adapter._contents import BlockContents, entries_of
from fuzz.adapter._reports import WorkerRecord, computed_before
from fuzz.adapter._config import build_scheduler
from fuzz.adapter._env import VLLM_VERSION, sha256
from fuzz.adapter._observe import Spies, raising_file, raising_statement, step_frames
from fuzz.adapter._ownership import OwnershipSpy, read_rules
from fuzz.adapter._specs import qualified_name

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from fuzz.model import ConnectorAlloc  # noqa: E402
from fuzz.model import Abort, AddRequest, ConnectorAnswer, Evict, FedOutput, OpLog, Step  # noqa: E402
from fuzz.model import (  # noqa: E402
    AdmissionObservation,
    DraftVerification,
    ExternalReply,
    GroupInfo,
    FailedLoad,
    HarnessError,
    PoolObservation,
    SchedulerDraw,
    SpecDraw,
    StaleOutput,
    StepObservation,
    StrandedRequest,
    KvFromOtherToken,
    UnbackedEntry,
    UnwrittenRead,
)
from fuzz.model import group_behaviour as _group_behaviour  # noqa: E402
from fuzz.model import group_kind as _group_kind  # noqa: E402
from fuzz.model import classification_of_kind  # noqa: E402

__all__ = ["SchedulerHarness"]


def _span(group: SpecDraw) -> tuple[str, int] | None:
    """The group's attention-span parameter and its value (None: it reads
    every earlier token), as the classification table names it."""
    row = classification_of_kind(group.kind)
    if row.span is None or group.inner:
        return None
    value = group.param(row.span[0])
    return None if value is None else (row.span[0], value)


@dataclasses.dataclass
class _Pending:
    """A scheduled step and what the model runner returns for it, decided
    when it was scheduled (what the GPU computes for that SchedulerOutput)."""

    index: int
    out: Any
    sampled: list[list[int]]
    invalid_block_ids: set[int]
    # The synchronous loads reported failed with it (see _invalid_blocks).
    sync_failures: dict[str, tuple[int, int, tuple[int, ...], int]]


def _raise_if_suite_code(exc: Exception, call: str) -> None:
    """A step's exception is an observation of vLLM only when vLLM raised it.
    One raised by the suite's own code that vLLM calls (the scripted
    connector, the recording wrappers) is the harness's misfit: it leaves as
    :class:`HarnessError`, never as a ``no-exception`` violation. Planted
    bugs stand in for vLLM's code: the scheduler edits are compiled under
    vLLM's file names, and the truncation variants (plain functions in
    ``_planted``) count as vLLM's too."""
    verdict = outcomes.classify(exc, VLLM_VERSION)
    if verdict.outcome is not outcomes.Outcome.HARNESS_ERROR:
        return
    if raising_file(exc) == os.path.abspath(_planted.__file__):
        return
    raise HarnessError(f"during {call}(): {verdict.reason}") from exc


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
        self._quiet_steps = 0
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
        self.spans = tuple(_span(g) for g in draw.layout.groups)
        self.step_index = 0
        self.vllm_seconds = 0.0  # inside schedule() and update_from_output()
        self.broken: str | None = None
        self.shortcut_evictions = 0
        self._requests: dict[str, Request] = {}
        # What the worker knows and owes: every report is decided from it,
        # never from scheduler.requests (see fuzz/adapter/_reports.py).
        self.worker = WorkerRecord(draw.async_scheduling)
        self._skips: set[str] = set()  # requests built with skip_reading_prefix_cache=True
        self._preempted: set[str] = set()  # every request preempted so far
        self._preempted_at: dict[str, int] = {}  # request id -> the step that last preempted it
        self._stale: list[StaleOutput] = []  # this step's stale outputs (see _feed_back)
        self._load_failures: set[str] = set()
        self._fail_sync_loads = False
        self._fail_async_next = False
        self.invalid_blocks_reported: list[tuple[str, tuple[int, ...]]] = []
        # Failed loads: each async load's start and blocks (from its
        # update_state_after_alloc), the sync loads reported failed this step
        # (first failed token, block ids), failed async loads not yet taken
        # out of WAITING_FOR_REMOTE_KVS, and this step's FailedLoad records.
        self._async_loads: dict[str, tuple[int, tuple[tuple[int, ...], ...]]] = {}
        self._sync_failures: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        self._failed_async: dict[str, FailedLoad] = {}
        self._step_failed_loads: list[FailedLoad] = []
        # Request id -> the token count a failed synchronous load had brought
        # it to before vLLM rolled it back (recompute policy).
        self._recomputing: dict[str, int] = {}
        self._recomputed_failed_load: set[str] = set()  # ever rolled back by a failed sync load
        self._whole_prompt_landed: set[str] = set()  # see StepObservation.whole_prompt_landed
        self._watch_failed_landing()
        # Connector calls already reported in a step observation; requests
        # already seen leaving the scheduler.
        self._finishes_seen = 0
        self._gone: set[str] = set()
        self.spies = Spies(self.scheduler, len(self.groups), self._new_admission)
        # Everything done to vLLM, in the suite's words (a repro's source of truth).
        self.oplog = OpLog(_oplog.run_config(draw, built, self.groups))
        _oplog.set_last_oplog(self.oplog)
        self._fed: FedOutput | None = None
        # Async scheduling: the engine's batch queue (EngineCore
        # step_with_batch_queue, size max_concurrent_batches = 2): at most one
        # scheduled step whose model output is not fed back yet.
        self._pending: _Pending | None = None
        # Request id -> the step whose schedule() started its async load: a
        # load lands in the output of that step or a later one, never earlier.
        self._load_started: dict[str, int] = {}
        # Aborts that arrive while the model runs the next step (abort()).
        self._aborts_during_step: list[str] = []
        # Request id -> the engine step whose update_from_output handed it to
        # a producer's send (request_finished held its blocks).
        self._send_started: dict[str, int] = {}
        self._status_before: dict[str, str] = {}  # per failed load reported, its request's status then
        self.ownership = OwnershipSpy(self.scheduler, self.groups, self.spans)
        self.read_rules = read_rules(
            built.kv_config, self.groups, self.spans, tuple(_group_behaviour(g).value for g in self.groups)
        )
        # What each block holds, as the runner and the connector's worker
        # wrote it (per-position KV groups: the must-cover ones).
        self.contents = BlockContents(
            tuple(g.block_size for g in self.groups),
            tuple(_group_behaviour(g).value == "must-cover" for g in self.groups),
            self.null_block_id,
        )
        self._unwritten_reads: list[UnwrittenRead] = []
        self._failing_now: frozenset[int] = frozenset()  # the blocks the worker fails in this step's sync loads

    def _new_admission(self, request: Request, **lookup: Any) -> AdmissionObservation:
        """A waiting request's observation as its local lookup returns."""
        return AdmissionObservation(
            request_id=request.request_id,
            step=self.step_index,
            num_tokens=request.num_tokens,
            groups=self.groups,
            spans=self.spans,
            scheduler_block_size=self.scheduler_block_size,
            hash_block_size=self.hash_block_size,
            null_block_id=self.null_block_id,
            divergent_capable=self.draw.divergent_hits,
            skips_prefix_cache=request.request_id in self._skips,
            **lookup,
        )

    def _watch_failed_landing(self) -> None:
        """Observe each failed async load the moment the scheduler takes its
        request out of WAITING_FOR_REMOTE_KVS (inside ``schedule()``, before
        anything else can reuse its freed blocks)."""
        original = getattr(self.scheduler, "_update_waiting_for_remote_kv", None)
        if original is None:  # a release without the method: no landing records
            return

        def update_waiting_for_remote_kv(request: Request) -> Any:
            result = original(request)
            failed = self._failed_async.pop(request.request_id, None)
            if failed is not None:
                self._step_failed_loads.append(self._failed_load_now(failed, request, "landed"))
            return result

        self.scheduler._update_waiting_for_remote_kv = update_waiting_for_remote_kv

    def _failed_load_now(self, load: FailedLoad, request: Request, stage: str) -> FailedLoad:
        blocks = self.pool.blocks
        return dataclasses.replace(
            load,
            stage=stage,
            status_after=request.status.name,
            computed_after=request.num_computed_tokens,
            cached_after=tuple(
                tuple(i for i in g if blocks[i].block_hash is not None) for g in load.failed_block_ids
            ),
        )

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

    # -- requests ------------------------------------------------------------
    def add_request(
        self,
        tokens: Sequence[int],
        *,
        max_tokens: int = 1,
        reply: ExternalReply | None = None,
        request_id: str | None = None,
        skip_reading_prefix_cache: bool = False,
    ) -> str:
        """Add a request; ``skip_reading_prefix_cache`` sets that
        ``SamplingParams`` field (a release without it gets a plain request,
        recorded as such)."""
        limit = self.max_model_len
        if not 0 < len(tokens) < limit:
            # EngineCore never sees such a prompt: vLLM's input processor
            # refuses an empty one and one of max_model_len tokens or more
            # (no room for an output token). A caller that adds one misfits.
            raise HarnessError(f"a prompt of {len(tokens)} tokens with max_model_len={limit}: the engine refuses it")
        rid = request_id or f"r{next(self._next_id)}"
        skip = skip_reading_prefix_cache and _compat.HAS_SKIP_READING_PREFIX_CACHE
        # The field only when set: None is vLLM's default (derived from
        # prompt logprobs, which these requests never ask for).
        extra = {"skip_reading_prefix_cache": True} if skip else {}
        req = Request(
            request_id=rid,
            prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **extra),
            pooling_params=None,
            block_hasher=get_request_block_hasher(self.hash_block_size, sha256),
        )
        if reply is not None:
            self.script.replies[rid] = reply
        self._requests[rid] = req
        self.worker.add(rid, tokens)
        if skip:
            self._skips.add(rid)
        self.oplog.ops.append(
            AddRequest(rid, tuple(tokens), max_tokens, reply, self.step_index, skip_reading_prefix_cache=skip)
        )
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
            self._aborts_during_step.append(request_id)
            return
        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)

    def _abort_during_step(self) -> None:
        ids, self._aborts_during_step = self._aborts_during_step, []
        if ids:
            self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)

    def fail_async_load(self, request_id: str) -> None:
        """Report the in-flight async load of ``request_id`` as failed (the
        connector's ``failed_recving`` path) at the next step."""
        self._load_failures.add(request_id)

    def fail_next_async_loads(self) -> None:
        """Report the async loads that land at the next step that has any as
        failed (``failed_recving``), whoever started them: the way to fail an
        async load here, since the harness lands one at the end of the step
        that starts it (as a connector whose transfer takes one step)."""
        self._fail_async_next = True

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
        self._fail_sync_loads = True

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
        self._step_failed_loads = []
        rolled_back = self._still_recomputing()
        self.ownership.new_step()
        asked_before = len(self.script.queries)
        allocs_before = len(self.script.allocs)
        metas_before = len(self.script.metas)
        in_flight = frozenset(self.script.loads_in_flight)
        error = error_type = where = None
        frames: tuple[str, ...] = ()
        statement = ""
        out = None
        # EngineCore.step_with_batch_queue schedules only `if
        # self.scheduler.has_requests()`; with nothing queued the harness
        # schedules anyway (as the synchronous drive does on an idle scheduler).
        schedules = not self.draw.async_scheduling or self._pending is None or self.scheduler.has_requests()
        prefill_held = schedules and self._prefill_held()
        t0 = time.perf_counter()
        try:
            if schedules:
                out = self.scheduler.schedule()
        except Exception as exc:  # noqa: BLE001 - every failure is an observation
            _raise_if_suite_code(exc, "schedule")
            error, error_type, where = f"{type(exc).__name__}: {exc}", type(exc).__name__, "schedule"
            frames, statement = step_frames(exc), raising_statement(exc)
        self.vllm_seconds += time.perf_counter() - t0
        ownership = self.ownership.observe(self.step_index, out, self.read_rules, self.script.send_blocks)
        queries = self.script.queries[asked_before:]
        allocs = self.script.allocs[allocs_before:]
        dishonest = tuple(
            q.request_id for q in queries if not self.script.reply_for(q.request_id).honest
        )
        admissions = self._admissions(out, queries, allocs)
        connector_allocs = self._connector_allocs(queries, allocs)
        for a in connector_allocs:
            if a.num_external_tokens and a.reply_async:
                self._async_loads[a.request_id] = (a.alloc_local_tokens or 0, a.block_ids)
                self._load_started[a.request_id] = self.step_index
        metas = tuple(self.script.metas[metas_before:])
        if out is not None:
            self._preempted.update(out.preempted_req_ids or ())
            self._preempted_at.update(dict.fromkeys(out.preempted_req_ids or (), self.step_index))
        newly = self._newly_scheduled(out)
        invalid = self._invalid_blocks(admissions) if self._fail_sync_loads else set()
        if invalid:  # armed until a step has a synchronous load to fail
            self._fail_sync_loads = False
        queued = None
        unbacked: tuple[UnbackedEntry, ...] = ()
        if out is not None:
            self._hand_over(out, connector_allocs, admissions, invalid)
            queued = _Pending(self.step_index, out, self._sampled(out), invalid, self._sync_failures)
            # The index as the step runs: what schedule() cached, against
            # what the step's forward pass and loads have written by then
            # (an async load's blocks only once it is reported landed).
            unbacked = self._unbacked_entries()
            self._sync_failures = {}
        finished: frozenset[str] = frozenset()
        fed = None if error else self._take_output(queued)
        if fed is not None:
            try:
                self._abort_during_step()
                finished = self._feed_back(fed)
            except Exception as exc:  # noqa: BLE001
                _raise_if_suite_code(exc, "update_from_output")
                error, error_type, where = (
                    f"{type(exc).__name__}: {exc}",
                    type(exc).__name__,
                    "update_from_output",
                )
                frames, statement = step_frames(exc), raising_statement(exc)
        if not error:  # nothing fed back: the input queue aborts them after the step
            self._abort_during_step()
        if not error and fed is not None:
            self._propose_drafts(fed)
        if error:
            self.broken = error
        finishes, left = self._finish_calls()
        fed_step = None if fed is None else fed.index
        stranded = self._stranded(out, fed, finished, error)
        kv_wrong = () if error else self._kv_from_other_tokens(out)
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
            copies=tuple((c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or ())
            if out is not None
            else (),
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
            failed_loads=tuple(self._step_failed_loads),
            rolled_back=rolled_back,
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
            unwritten_reads=tuple(self._unwritten_reads) if out is not None else (),
            unbacked_entries=unbacked,
        )

    # Quiet steps in a row after which a RUNNING request left alone is
    # stranded (one or two can be vLLM pacing a request: the V2 runner's
    # decode stagger waits a step).
    QUIET_STEPS = 3

    @property
    def stalled(self) -> bool:
        """The last :attr:`QUIET_STEPS` steps scheduled nothing with nothing
        in flight: no further step changes anything (requests left are
        stranded, or wait for blocks nobody will free)."""
        return self._quiet_steps >= self.QUIET_STEPS

    def _hand_over(self, out: Any, allocs: tuple[ConnectorAlloc, ...], admissions: Sequence[AdmissionObservation],
                   invalid: set[int]) -> None:
        """What the worker takes from ``out`` before the step runs: its block
        tables and copies, and the external loads the connector was told to
        do (a synchronous one lands now, but into the blocks the worker
        fails; an async one when it is reported landed). A load starts at
        the local hit in every group, but where a divergent hybrid hit left
        a group lagging: a connector that completes such hits fills that
        group from the blocks it adopted on (each group's own hit)."""
        self.contents.forget(out.finished_req_ids or ())
        self.contents.take_tables(out)
        self._unwritten_reads = []
        self._failing_now = frozenset(invalid)
        admitted = {a.request_id: a for a in admissions}
        for a in allocs:
            if not a.num_external_tokens:
                continue
            start = a.alloc_local_tokens or 0
            end = start + a.num_external_tokens
            starts = [start] * len(self.groups)
            adm = admitted.get(a.request_id)
            if adm is not None and adm.hit_diverged and adm.alloc_local_blocks is not None:
                starts = [min(start, len(blocks) * g.block_size) for blocks, g in zip(adm.alloc_local_blocks, self.groups)]
            tokens = self.worker.tokens.get(a.request_id, [])
            if a.reply_async:
                self.contents.start_async_load(a.request_id, a.block_ids, starts, end, tokens)
            else:
                self.contents.load(a.block_ids, starts, end, self.step_index, tokens, failed=invalid)

    def _unbacked_entries(self) -> tuple[UnbackedEntry, ...]:
        """After the step: each prefix-cache entry whose block does not hold
        what its key covers (see BlockContents.unbacked_entries)."""
        cached = _compat.prefix_cache_map(self.pool)
        if cached is None:
            return ()
        entries = entries_of(cached, _compat.group_of_key)
        return tuple(
            UnbackedEntry(group, block_id, n, tuple(missing))
            for group, block_id, n, missing in self.contents.unbacked_entries(entries)
        )

    def _kv_from_other_tokens(self, out: Any) -> tuple[KvFromOtherToken, ...]:
        """After the step's update_from_output(): each position the worker
        computed for a live request, below its num_computed_tokens, whose
        token vLLM now records differently (see WorkerRecord.settle)."""
        preempted = (out.preempted_req_ids or ()) if out is not None else ()
        return tuple(
            KvFromOtherToken(rid, position, token, recorded, step, rid in self._recomputed_failed_load)
            for rid, position, token, recorded, step in self.worker.settle(self.scheduler.requests, preempted)
        )

    def _stranded(self, out: Any, fed: _Pending | None, finished: frozenset[str], error: str | None) -> tuple[StrandedRequest, ...]:
        """Counts quiet steps (nothing scheduled, nothing fed that had work,
        no step output pending, no async load or producer hand-off in
        flight, no request finished) and, once there are
        :attr:`QUIET_STEPS` in a row, the RUNNING requests left alone."""
        quiet = (
            error is None
            and (out is None or not out.num_scheduled_tokens)
            and (fed is None or not fed.out.num_scheduled_tokens)
            and (self._pending is None or not self._pending.out.num_scheduled_tokens)
            and not finished
            and not self.script.loads_in_flight
            and not self.script.sends_in_flight
            and not self._step_failed_loads
        )
        self._quiet_steps = self._quiet_steps + 1 if quiet else 0
        if self._quiet_steps < self.QUIET_STEPS:
            return ()
        return tuple(
            StrandedRequest(
                r.request_id,
                r.num_computed_tokens,
                r.num_tokens,
                r.num_prompt_tokens,
                r.sampling_params.max_tokens if r.sampling_params is not None else 0,
                getattr(r, "num_output_placeholders", 0),
                self._quiet_steps,
                r.request_id in self._recomputed_failed_load,
            )
            for r in self.scheduler.running
        )

    def _prefill_held(self) -> bool:
        """Whether this schedule() holds prefills back (the local prefill
        cadence, ``prefill_schedule_interval``): with a prefill to do (a
        waiting request or a running chunk) and some request decoding, fewer executed steps than the interval have passed
        since the last prefill-carrying one (Scheduler.schedule's
        ``defer_prefills``, the local-cadence gate; the scheduler's own
        capacity escape, ``prefill_capacity_bound``, lifts it)."""
        sched = self.scheduler
        interval = getattr(sched, "local_prefill_interval", 1)
        if interval <= 1 or getattr(sched, "prefill_capacity_bound", False):
            return False
        prefilling = bool(sched.waiting) or any(r.is_prefill_chunk for r in sched.running)
        since = (sched.num_executed_steps + 1) - sched.last_prefill_step
        return prefilling and since < interval and any(not r.is_prefill_chunk for r in sched.running)

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
        """The drafter's proposals after a step, handed over as the engine
        core does: ``EngineCore.post_step`` (synchronous scheduling, when the
        model ran) ``take_draft_token_ids()`` then
        ``scheduler.update_draft_token_ids(DraftTokenIds)``; the scheduler
        itself drops those of prefill chunks and finished requests. With
        async scheduling the engine hands none over (the worker keeps its
        drafts; AsyncScheduler schedules -1 placeholders for them). A step
        the scheduler marked ``skip_drafts`` (V2 runner: no request can use
        them) proposes none. The drafter proposes k drafts for every
        request of the batch."""
        out = fed.out
        if (
            self.draw.speculative_method is None
            or self.draw.async_scheduling
            or out.total_num_scheduled_tokens == 0
            or getattr(out, "skip_drafts", False)
        ):
            return
        ids = list(out.num_scheduled_tokens)
        k = self.draw.num_speculative_tokens
        drafts = [[3000 + i for i in range(k)] for _ in ids]
        if self._fed is not None:
            self._fed = dataclasses.replace(self._fed, drafts=tuple((r, tuple(d)) for r, d in zip(ids, drafts)))
        self.scheduler.update_draft_token_ids(DraftTokenIds(ids, drafts))

    def _verifiable(self, out: Any, rid: str, newly: frozenset[str]) -> int:
        """How many of the drafts scheduled for ``rid`` the rejection sampler
        could accept: none of the -1 padding a request admitted in this step
        gets (``pad_spec_decode``: ``[-1] * num_spec_tokens``, placeholder
        rows); otherwise, synchronous, the drafts before the first -1
        (vLLM's ``strip_speculative_padding``), async, every placeholder (the
        worker fills them with its drafts)."""
        drafts = (out.scheduled_spec_decode_tokens or {}).get(rid) or []
        if not drafts or rid in newly:
            return 0
        if self.draw.async_scheduling:
            return len(drafts)
        return next((i for i, t in enumerate(drafts) if t < 0), len(drafts))

    def _sampled(self, out: Any) -> list[list[int]]:
        """What the model runner samples for ``out``, decided as it is
        scheduled (right after ``schedule()``): a token for each request whose
        scheduled tokens reach its end, none for a non-final prefill chunk
        (the runner discards those); with speculative decoding, before it,
        the drafts the rejection sampler accepts (:meth:`SchedulerDraw.accepted`)."""
        sampled = []
        newly = frozenset(r for r, *_ in self._newly_scheduled(out))
        position = 0
        # From the output and the worker's own record (prompt plus what it
        # sampled, fed back or still queued), never from vLLM's Request.
        self.worker.resync(out)
        before = computed_before(out)
        # Where each request's tokens start (before this step's rejections count).
        starts = {rid: self.worker.start(rid, before) for rid in out.num_scheduled_tokens if rid in before}
        for rid in out.num_scheduled_tokens:
            self.worker.write(out, rid, before, self.step_index)
            done_prefill = self.worker.reaches_end(out, rid, before)
            accepted = 0
            verifiable = self._verifiable(out, rid, newly) if done_prefill else 0
            if verifiable:
                accepted = self.draw.accepted(self.step_index, position, verifiable)
                position += 1
            if rid in starts:
                self._write_contents(out, rid, starts[rid], accepted)
            sampled.append([1000 + (self.step_index + i) % 24 for i in range(1 + accepted)] if done_prefill else [])
            self.worker.sampled(rid, sampled[-1])
            if done_prefill:  # vLLM rolls back the drafts of a request it gets tokens for
                drafts = (out.scheduled_spec_decode_tokens or {}).get(rid) or ()
                self.worker.rejected(rid, self.step_index, len(drafts) - accepted)
        self.contents.settle_copies(self.step_index)
        self._unwritten_reads = self._reads(starts)
        return sampled

    def _write_contents(self, out: Any, rid: str, start: int, accepted: int) -> None:
        """The KV the step writes for ``rid`` from ``start``: its scheduled
        positions but the drafts, and the drafts accepted."""
        drafts = len((out.scheduled_spec_decode_tokens or {}).get(rid) or ())
        end = start + out.num_scheduled_tokens[rid] - drafts
        self.contents.write(rid, start, end + accepted, self.step_index, self.worker.tokens.get(rid, []))

    def _reads(self, starts: dict[str, int]) -> list[UnwrittenRead]:
        """After the step's copies, loads and forward pass: what each of its
        requests reads below where it starts that its blocks do not hold (a
        forward pass writes a layer's KV before it attends, so what another
        request computes in the same pass is there; a block copy is made
        before the pass and its loads)."""
        reads = []
        for rid, start in starts.items():
            by_block: dict[tuple[int, int], list[tuple[int, tuple[int, int, int | None] | None]]] = {}
            for group, block_id, position, holds in self.contents.unread(
                rid, start, self.worker.prompt.get(rid, 0), self.read_rules, self.worker.tokens.get(rid, []),
                self._failing_now,
            ):
                by_block.setdefault((group, block_id), []).append((position, holds))
            replay = rid in self._whole_prompt_landed and start == self.worker.prompt.get(rid, 0) - 1
            reads += [
                UnwrittenRead(rid, g, _group_kind(self.groups[g]), b, start, replay, tuple(missing))
                for (g, b), missing in by_block.items()
            ]
        return reads

    def _connector_allocs(self, queries: list[Any], allocs: list[Any]) -> tuple[ConnectorAlloc, ...]:
        """Each update_state_after_alloc of the step, with the request's
        allocate_slots accounting and its question of the step."""
        last_query = {q.request_id: q for q in queries}
        rows = []
        for a in allocs:
            q = last_query.get(a.request_id)
            local, external = self.spies.step_allocs.get(a.request_id, (None, None))
            rows.append(
                ConnectorAlloc(
                    request_id=a.request_id,
                    num_tokens=self._requests[a.request_id].num_tokens,
                    block_ids=a.block_ids,
                    num_external_tokens=a.num_external_tokens,
                    alloc_local_tokens=local,
                    alloc_external_tokens=external,
                    asked_with=None if q is None else q.num_computed_tokens,
                    reply=None if q is None else q.reply,
                    reply_async=False if q is None else q.load_async,
                )
            )
        return tuple(rows)

    def _finish_calls(self) -> tuple[tuple[Any, ...], tuple[tuple[str, int], ...]]:
        """The connector's finish calls since the last observation, and the
        requests that left the scheduler since then (with how many times the
        connector had been told each finished)."""
        calls = tuple(self.script.finish_calls[self._finishes_seen :])
        self._finishes_seen = len(self.script.finish_calls)
        live = self.scheduler.requests
        left = sorted(r for r in self._requests if r not in live and r not in self._gone)
        self._gone.update(left)
        return calls, tuple((r, self.script.finished.count(r)) for r in left)

    def _admissions(self, out: Any, queries: list[Any], allocs: list[Any]) -> tuple[AdmissionObservation, ...]:
        new_computed = {}
        cow_dst: frozenset[int] = frozenset()
        if out is not None:
            # What the scheduler hands the model runner, before this step's
            # tokens are added. A request resumed after preemption is admitted
            # through the same waiting-queue branch but reported among the
            # cached requests; reading its live num_computed_tokens instead
            # would already include this step's scheduled tokens.
            new_computed = computed_before(out)
            cow_dst = frozenset(c.dst_block_id for c in out.kv_cache_block_copies or ())
        last_query = {q.request_id: q for q in queries}
        last_alloc = {a.request_id: a for a in allocs}
        result = []
        for rid, seen in self.spies.pending.items():
            query = last_query.get(rid)
            alloc = last_alloc.get(rid)
            req = self._requests[rid]
            reply_fields: dict[str, Any] = {}
            if query is not None:
                reply_fields = dict(
                    asked_with=query.num_computed_tokens,
                    reply=query.reply,
                    reply_async=query.load_async,
                    reply_honest=self.script.reply_for(rid).honest,
                )
            admitted = alloc is not None
            table: tuple[tuple[int, ...], ...] = ()
            if admitted and rid in self.scheduler.requests:
                table = tuple(tuple(g) for g in self.manager.get_block_ids(rid))
            result.append(
                dataclasses.replace(
                    seen,
                    **reply_fields,
                    admitted=admitted,
                    num_computed_tokens=new_computed.get(rid, req.num_computed_tokens) if admitted else None,
                    connector_external_tokens=None if alloc is None else alloc.num_external_tokens,
                    block_table=table,
                    connector_block_ids=None if alloc is None else alloc.block_ids,
                    cow_dst_ids=cow_dst,
                    resumed=admitted and rid in self._preempted,
                )
            )
        return tuple(result)

    def _newly_scheduled(self, out: Any) -> tuple[tuple[str, int, int], ...]:
        if out is None:
            return ()
        rows = [
            (n.req_id, n.num_computed_tokens, self._requests[n.req_id].num_tokens)
            for n in out.scheduled_new_reqs
        ]
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid in cached.resumed_req_ids:
                rows.append((rid, cached.num_computed_tokens[i], self._requests[rid].num_tokens))
        return tuple(rows)

    def _invalid_blocks(self, admissions: tuple[AdmissionObservation, ...]) -> set[int]:
        invalid: set[int] = set()
        for adm in admissions:
            # The blocks the connector was told at update_state_after_alloc
            # (the worker loads into those), not the live block table.
            if not adm.admitted or adm.reply_async or not adm.connector_external_tokens or not adm.connector_block_ids:
                continue
            local = (adm.num_computed_tokens or 0) - adm.connector_external_tokens
            (table,) = adm.connector_block_ids
            b = self.groups[0].block_size
            first, end = local // b, -(-(adm.num_computed_tokens or 0) // b)
            ids = tuple(i for i in table[first:end] if i != self.null_block_id)
            if ids:
                self.invalid_blocks_reported.append((adm.request_id, ids))
                # vLLM truncates at the first invalid block of the table; a
                # padded (null) position before it is not reported failed.
                at = next(k for k in range(first, end) if table[k] != self.null_block_id)
                self._sync_failures[adm.request_id] = (local, at * b, ids, adm.num_computed_tokens or 0)
                invalid.update(ids)
        return invalid

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
        failed = recving & (self._load_failures | (recving if self._fail_async_next else set()))
        for rid in recving:
            self.contents.land_async_load(rid, step.index, failed=rid in failed and _compat.HAS_FAILED_RECVING)
        if recving:  # armed until a step has an async load landing
            self._fail_async_next = False
        self.script.loads_in_flight.difference_update(recving)
        self._load_failures.difference_update(recving)
        # failed_recving exists from vLLM 0.30; older releases cannot be told
        # an async load failed, so there the load simply completes.
        failure_kw = {"failed_recving": failed} if _compat.HAS_FAILED_RECVING else {}
        connector_output = (
            KVConnectorOutput(
                finished_sending=sending,
                finished_recving=recving,
                invalid_block_ids=set(invalid_block_ids),
                **failure_kw,
            )
            if recving or invalid_block_ids or sending
            else None
        )
        output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=connector_output,
        )
        self._fed = FedOutput(
            req_ids=tuple(ids),
            sampled_token_ids=tuple(tuple(t) for t in sampled),
            finished_recving=tuple(sorted(recving)),
            failed_recving=tuple(sorted(failed)),
            invalid_block_ids=tuple(sorted(invalid_block_ids)),
            finished_sending=tuple(sorted(sending)),
        )
        self._sync_failures = step.sync_failures
        self._status_before = {
            r: self._requests[r].status.name for r in (*failed, *self._sync_failures) if r in self._requests
        }
        before = set(sched.requests)
        # Requests preempted by a schedule() made after this output's step
        # (async scheduling): their share of it is stale.
        stale = {
            r: (self._preempted_at[r], tuple(sampled[i]), sched.requests[r].num_tokens)
            for i, r in enumerate(ids)
            if self._preempted_at.get(r, 0) > step.index and r in sched.requests
        }
        # Requests sharing reported invalid blocks without a failed load of
        # their own (a local hit on blocks another request's sync load
        # filled): vLLM rolls back async loads still in flight and running
        # requests alike (_handle_invalid_blocks ->
        # _update_requests_with_invalid_blocks over kv_holding_waiting and
        # running).
        sharing = {
            rid: r.num_computed_tokens
            for rid, r in sched.requests.items()
            if invalid_block_ids
            and rid not in failed
            and rid not in self._sync_failures
            and r.status.name in ("WAITING_FOR_REMOTE_KVS", "RUNNING")
        }
        drafts = out.scheduled_spec_decode_tokens or {}
        verified = {
            rid: (len(drafts[rid]), len(sampled[i]) - 1, sched.requests[rid].num_computed_tokens)
            for i, rid in enumerate(ids)
            if drafts.get(rid) and sampled[i] and rid in sched.requests
        }
        t0 = time.perf_counter()
        try:
            sched.update_from_output(out, output)
        finally:
            self.vllm_seconds += time.perf_counter() - t0
            drops = getattr(sched, "requires_kv_delivery", None)
            for rid, (at, tokens, before_n) in stale.items():
                req = self._requests[rid]
                self._stale.append(
                    StaleOutput(rid, step.index, at, tokens, drops, before_n, req.num_tokens, req.status.name)
                )
        for rid in self.script.sends_in_flight - set(self._send_started):
            self._send_started[rid] = self.step_index
        self._verifications = tuple(
            DraftVerification(
                rid, n, accepted, computed, self._requests[rid].num_computed_tokens,
                sched.requests[rid].status.name if rid in sched.requests else "",
            )
            for rid, (n, accepted, computed) in verified.items()
        )
        self._record_failed_loads(failed if _compat.HAS_FAILED_RECVING else set())
        rejected = {rid: n - accepted for rid, (n, accepted, _) in verified.items()}
        for rid, computed in sharing.items():
            # Rolled back (by more than its rejected drafts): recomputing up
            # to where it was.
            if rid in sched.requests and sched.requests[rid].num_computed_tokens < computed - rejected.get(rid, 0):
                self._recomputing[rid] = computed
        for rid in recving - failed:
            self._async_loads.pop(rid, None)
            if rid in self.script.whole_prompt_sent:
                self._whole_prompt_landed.add(rid)
        return frozenset(before - set(sched.requests))

    def _record_failed_loads(self, failed_async: set[str]) -> None:
        """What the scheduler made of the loads reported failed in this
        ``update_from_output``."""
        policy = self.draw.kv_load_failure_policy
        reported = []
        for rid in sorted(failed_async):
            start, table = self._async_loads.pop(rid, (0, ()))
            failed = tuple(
                tuple(i for i in g[start // grp.block_size :] if i != self.null_block_id)
                for g, grp in zip(table, self.groups)
            )
            load = FailedLoad(rid, "failed_recving", policy, "reported", start, start, failed, "", 0, (), self.groups)
            reported.append(load)
            self._failed_async[rid] = load
        for rid, (start, first_failed, ids, _) in sorted(self._sync_failures.items()):
            reported.append(
                FailedLoad(
                    rid, "invalid_block_ids", policy, "reported", start, first_failed, (ids,), "", 0, (), self.groups
                )
            )
        if policy == "recompute":
            # Rolled back to the first invalid block: the request recomputes
            # from there up to where the failed load had brought it.
            for rid, (*_, load_end) in self._sync_failures.items():
                self._recomputing[rid] = load_end
                self._recomputed_failed_load.add(rid)
        self._sync_failures.clear()
        for load in reported:
            load = dataclasses.replace(load, status_before=self._status_before.get(load.request_id, ""))
            self._step_failed_loads.append(self._failed_load_now(load, self._requests[load.request_id], "reported"))

    def _still_recomputing(self) -> frozenset[str]:
        """Requests recomputing what a rolled-back synchronous load had
        covered (from the step after the rollback until they compute past the
        load's end, over as many steps as their chunks take)."""
        live = self.scheduler.requests
        for rid in [r for r, end in self._recomputing.items() if r not in live or live[r].num_computed_tokens >= end]:
            del self._recomputing[rid]
        return frozenset(self._recomputing)

    def drain(self, max_steps: int = 64, context: str = "") -> list[StepObservation]:
        """Step until no request is left and no report is due (or ``max_steps``)."""
        steps = []
        while (self.scheduler.requests or self._pending or self.reports_due) and len(steps) < max_steps and not self.broken:
            steps.append(self.step(context))
        return steps

    # -- pool ----------------------------------------------------------------
    def pool_observation(self, context: str = "") -> PoolObservation:
        referenced = tuple(
            (b.block_id, b.ref_cnt) for b in self.pool.blocks if b.ref_cnt != 0 and not b.is_null
        )
        return PoolObservation(
            num_blocks=self.num_blocks,
            num_free=self.pool.get_num_free_blocks(),
            referenced=referenced,
            live_requests=tuple(self.scheduler.requests),
            context=context,
        )

    def per_group_cached_block_ids(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Per group, the non-null blocks a per-group lookup of ``tokens`` finds."""
        req = Request(
            request_id="probe",
            prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            block_hasher=get_request_block_hasher(self.hash_block_size, sha256),
        )
        coord = self.manager.coordinator
        limit = req.num_tokens - 1
        if _compat.has_per_group_lookup(coord):
            raw, _ = coord.find_longest_cache_hit_per_group(req.block_hashes, limit)
        else:
            raw, *_ = coord.find_longest_cache_hit(req.block_hashes, limit)
        return tuple(tuple(b.block_id for b in g if not b.is_null) for g in raw)

    def evict_shortcut(self, block_ids: set[int]) -> None:
        """Drop hand-picked blocks from the prefix cache (a search shortcut:
        a failure reached this way must be re-derived through a real path)."""
        if block_ids:
            self.oplog.ops.append(Evict(tuple(sorted(block_ids)), self.step_index))
            self.shortcut_evictions += 1
            self.manager.evict_blocks(set(block_ids))
