"""A scheduler harness's observations, assembled from what was recorded.

:class:`Observer` installs the recording wrappers of
:mod:`fuzz.adapter._observe` on the scheduler and reads them, the scripted
connector's records and the scheduler's own state into the
:mod:`fuzz.model` observations the invariants check: each waiting request's
admission, the connector's allocations and finish calls, requests left
stranded, outputs gone stale under async scheduling, verified drafts, the
block pool. It decides nothing about what the harness feeds vLLM.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fuzz.adapter import _compat
from fuzz.adapter._connector import ConnectorScript
from fuzz.adapter._events import EventLog, IndexTally
from fuzz.adapter._event_payloads import PayloadJudge, PayloadLog
from fuzz.adapter._observe import Spies
from fuzz.adapter._reports import computed_before, newly_scheduled

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from fuzz.model import (  # noqa: E402
    AdmissionObservation,
    ConnectorAlloc,
    DraftVerification,
    EventGap,
    EventOrphan,
    EventPayload,
    GroupInfo,
    PoolObservation,
    PreemptedRequest,
    SchedulerDraw,
    StaleOutput,
    StrandedRequest,
    draft_verifications_of,
    drafts_to_verify_of,
    event_orphans_of,
    group_behaviour,
    span_of,
    stale_outputs_of,
    stale_shares_of,
)

__all__ = ["QUIET_STEPS", "Observer"]

# Quiet steps in a row after which a RUNNING request left alone is
# stranded (one or two can be vLLM pacing a request: the V2 runner's
# decode stagger waits a step).
QUIET_STEPS = 3
# Steps without progress allowed, on top of the re-prefill bound below,
# before a busy run counts as going nowhere (Observer.progress).
IDLE_PROGRESS_MARGIN = 8


class Observer:
    """What one harness's scheduler shows, step by step.

    ``requests`` is the harness's registry of every request it added;
    ``clock`` says the harness's current step.
    """

    def __init__(self, scheduler: Any, script: ConnectorScript, draw: SchedulerDraw, groups: tuple[GroupInfo, ...],
                 spans: tuple[Any, ...], sizes: tuple[int, int, int], requests: Mapping[str, Request],
                 clock: Callable[[], int]) -> None:
        self.scheduler = scheduler
        self.manager = scheduler.kv_cache_manager
        self.encoder: Any = None  # the worker's encoder cache (fuzz.adapter._encoder.EncoderWatch), set by the harness
        self.script = script
        self.draw = draw
        self.groups = groups
        self.spans = spans
        # The spec-kind table's verdict on each group (fuzz.model.AdmissionObservation).
        self.behaviours = tuple(group_behaviour(g) for g in groups)
        self.span_rules = tuple(None if span is None else span[2] for span in map(span_of, draw.layout.groups))
        self.scheduler_block_size, self.hash_block_size, self.null_block_id = sizes
        self.requests = requests
        self.clock = clock
        self.skips: set[str] = set()  # requests built with skip_reading_prefix_cache=True
        self.preempted: set[str] = set()  # every request preempted so far
        self.preempted_at: dict[str, int] = {}  # request id -> the step that last preempted it
        self.quiet_steps = 0
        # Progress (Observer.progress): the most tokens each request has had
        # computed so far, and the engine steps since any request passed its
        # mark, arrived, left or had a transfer in flight.
        self.high_water: dict[str, int] = {}
        self.steps_without_progress = 0
        # Connector calls already reported in a step observation; requests
        # already seen leaving the scheduler.
        self._finishes_seen = 0
        self._gone: set[str] = set()
        self.spies = Spies(scheduler, len(groups), self._new_admission)
        # KV events on: the observer is the scheduler's event publisher,
        # replaying every batch as a KV-aware router would (_events.py).
        self.events: EventLog | None = None
        self._payload_judge: PayloadJudge | None = None
        if draw.kv_events:
            self.events = PayloadLog()
            self.tally = IndexTally(_compat.event_key)
            scheduler.kv_event_publisher = self.events
        self._resets_published = 0  # how many of the harness's resets came before the events last published
        # Event key -> (request, tokens) (_external_prefixes), of which KeyPrefixes, read how far.
        self._prefixes: dict[Any, tuple[str, int]] = {}
        self._prefixes_of: Any = None
        self._prefixes_read = 0

    def event_gaps(self, keys: Any = None, resets: Sequence[tuple[int, bool]] = ()) -> tuple[EventGap, ...]:
        """Right after update_from_output() published the step's events (the
        block pool's queue is empty then): each key where the replay of every
        batch so far disagrees with the prefix-cache index, with what it
        stands for (``keys``: KeyPrefixes) and whether one of ``resets``
        (every reset so far: (step, succeeded)) came since the last publish."""
        cached = _compat.prefix_cache_map(self.manager.block_pool) if self.events is not None else None
        if cached is None:
            return ()
        holder = getattr(self.manager.block_pool, "cached_block_hash_to_block", None)
        found = self.tally.gaps(self.events.counts, self.events.take_touched(), holder, cached)
        cleared = any(ok for _, ok in resets[self._resets_published:])
        self._resets_published = len(resets)
        prefixes = self._external_prefixes(keys) if found else {}
        return tuple(EventGap(*gap, prefixes.get(gap[1]), cleared) for gap in found)

    def event_payloads(self, read_rules: tuple[tuple[str, int], ...], keys: Any, ops: Sequence[Any]
                       ) -> tuple[EventPayload, ...]:
        """The blocks the BlockStored events replayed since the last call
        announce whose payload is not what the harness knows of them
        (_event_payloads.py); ``keys``: what each key stands for
        (KeyPrefixes, None before the index was first read), ``ops`` the
        harness's op log."""
        if self.events is None:
            return ()
        if self._payload_judge is None:
            self._payload_judge = PayloadJudge(
                [g.block_size for g in self.groups], [rule[0] != "full" for rule in read_rules], self.hash_block_size,
                _compat.hash_lookahead(self.scheduler), _compat.external_hash)
        return self._payload_judge.payloads(self.events.take_stored(), keys, ops)

    def event_orphans(self, read_rules: tuple[tuple[str, int], ...], keys: Any = None) -> tuple[EventOrphan, ...]:
        """The BlockStored events replayed since the last call whose parent no
        event before them announced in their group; ``read_rules``: per group,
        what a step reads (a group that reads all of its prefix caches every
        block, the others only some); ``keys`` (KeyPrefixes): what each
        event's first key stands for."""
        if self.events is None:
            return ()
        found = event_orphans_of(self.events.take_orphans(), [g.block_size for g in self.groups], read_rules)
        prefixes = self._external_prefixes(keys) if found else {}
        return tuple(dataclasses.replace(o, prefix=prefixes.get(o.first_key)) for o in found)

    def _external_prefixes(self, keys: Any) -> dict[Any, tuple[str, int]]:
        """What each key of ``keys`` (KeyPrefixes; None: none learnt yet)
        stands for, by the key as KV events spell it: (request, tokens
        covered). Kept up to date with the keys learnt since the last call
        (KeyPrefixes only adds)."""
        if keys is None:
            return self._prefixes
        if keys is not self._prefixes_of:
            self._prefixes, self._prefixes_of, self._prefixes_read = {}, keys, 0
        for key, (rid, tokens) in itertools.islice(keys.prefix.items(), self._prefixes_read, None):
            self._prefixes.setdefault(_compat.external_hash(key), (rid, len(tokens)))
        self._prefixes_read = len(keys.prefix)
        return self._prefixes

    def _new_admission(self, request: Request, **lookup: Any) -> AdmissionObservation:
        """A waiting request's observation as its local lookup returns."""
        return AdmissionObservation(
            request_id=request.request_id,
            step=self.clock(),
            num_tokens=request.num_tokens,
            groups=self.groups,
            spans=self.spans,
            behaviours=self.behaviours,
            span_rules=self.span_rules,
            scheduler_block_size=self.scheduler_block_size,
            hash_block_size=self.hash_block_size,
            null_block_id=self.null_block_id,
            divergent_capable=self.draw.divergent_hits,
            skips_prefix_cache=request.request_id in self.skips,
            **lookup,
        )

    def prefill_held(self) -> bool:
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

    def cached_block_ids(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Per group, the non-null blocks a per-group lookup of ``tokens`` finds."""
        req = Request(
            request_id="probe",
            prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            block_hasher=_compat.request_block_hasher(self.hash_block_size, _compat.hash_lookahead(self.scheduler)),
        )
        coord = self.manager.coordinator
        limit = req.num_tokens - 1
        if _compat.has_per_group_lookup(coord):
            raw, _ = coord.find_longest_cache_hit_per_group(req.block_hashes, limit)
        else:
            raw, *_ = coord.find_longest_cache_hit(req.block_hashes, limit)
        return tuple(tuple(b.block_id for b in g if not b.is_null) for g in raw)

    def admissions(self, out: Any, queries: list[Any], allocs: list[Any]) -> tuple[AdmissionObservation, ...]:
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
            req = self.requests[rid]
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
                    resumed=admitted and rid in self.preempted,
                )
            )
        return tuple(result)

    def connector_allocs(self, queries: list[Any], allocs: list[Any]) -> tuple[ConnectorAlloc, ...]:
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
                    num_tokens=self.requests[a.request_id].num_tokens,
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

    def preemptions(self, out: Any, step: int, before: tuple[PreemptedRequest, ...] = ()) -> tuple[PreemptedRequest, ...]:
        """Note the requests ``out`` preempted (after its admissions are read:
        a request resumed in a later step reads as resumed), and return each
        as schedule() left it (none when it raised: ``out`` is None).
        ``before``: those a prefix-cache reset preempted right before this
        schedule(), as the reset left them (the schedule() may admit them
        again at once, with an async load that schedules nothing)."""
        if out is None:
            return before
        ids = sorted(out.preempted_req_ids or ())
        self.preempted.update(ids)
        self.preempted_at.update(dict.fromkeys(ids, step))
        taken = {p.request_id for p in before}
        return before + self.preempted_states([rid for rid in ids if rid not in taken], step, out)

    def preempted_states(self, ids: list[str], step: int, out: Any = None) -> tuple[PreemptedRequest, ...]:
        """Each of ``ids`` as vLLM holds it now (``out``: the schedule() that
        preempted it, to tell whether it scheduled it again)."""
        live = self.scheduler.requests
        managers = self.manager.coordinator.single_type_managers
        return tuple(
            PreemptedRequest(
                rid,
                step,
                live[rid].status.name,
                live[rid].num_computed_tokens,
                getattr(live[rid], "num_output_placeholders", 0),
                len(live[rid].spec_token_ids or ()),
                tuple(len(m.req_to_blocks.get(rid, ())) for m in managers),
                out is not None and rid in out.num_scheduled_tokens,
            )
            for rid in ids
            if rid in live
        )

    def newly_scheduled(self, out: Any) -> tuple[tuple[str, int, int], ...]:
        return () if out is None else newly_scheduled(out, self.requests)

    def finish_calls(self) -> tuple[tuple[Any, ...], tuple[tuple[str, int], ...]]:
        """The connector's finish calls since the last observation, and the
        requests that left the scheduler since then (with how many times the
        connector had been told each finished)."""
        calls = tuple(self.script.finish_calls[self._finishes_seen :])
        self._finishes_seen = len(self.script.finish_calls)
        live = self.scheduler.requests
        left = sorted(r for r in self.requests if r not in live and r not in self._gone)
        self._gone.update(left)
        return calls, tuple((r, self.script.finished.count(r)) for r in left)

    def stranded(self, out: Any, fed_out: Any, pending_out: Any, finished: frozenset[str], error: str | None,
                 failed_loads: bool, recomputed: set[str]) -> tuple[StrandedRequest, ...]:
        """Counts quiet steps (nothing scheduled, nothing fed that had work
        (``fed_out``), no step output pending (``pending_out``), no async
        load or producer hand-off in flight, no request finished, no failed
        load) and, once there are :data:`QUIET_STEPS` in a row, the RUNNING
        requests left alone."""
        quiet = (
            error is None
            and (out is None or not out.num_scheduled_tokens)
            and (fed_out is None or not fed_out.num_scheduled_tokens)
            and (pending_out is None or not pending_out.num_scheduled_tokens)
            and not finished
            and not self.script.loads_in_flight
            and not self.script.sends_in_flight
            and not failed_loads
        )
        self.quiet_steps = self.quiet_steps + 1 if quiet else 0
        if self.quiet_steps < QUIET_STEPS:
            return ()
        return tuple(
            StrandedRequest(
                r.request_id,
                r.num_computed_tokens,
                r.num_tokens,
                r.num_prompt_tokens,
                r.sampling_params.max_tokens if r.sampling_params is not None else 0,
                getattr(r, "num_output_placeholders", 0),
                self.quiet_steps,
                r.request_id in recomputed,
                self.encoder is not None and self.encoder.holds_past(r.request_id, r.num_computed_tokens),
                self.encoder is not None and self.encoder.needs_uncached(r.request_id, r.num_computed_tokens),
            )
            for r in self.scheduler.running
        )

    def progress(self, finished: frozenset[str]) -> None:
        """After each engine step: did any request get further than it ever
        had (its computed tokens past their mark), arrive, leave or have an
        async load or producer hand-off in flight? If not, one more step
        without progress."""
        live = self.scheduler.requests
        # With no request there is nothing to get further: an idle step is no loop.
        moved = (not live or bool(finished) or bool(self.script.loads_in_flight)
                 or bool(self.script.sends_in_flight))
        for rid, request in live.items():
            mark = self.high_water.get(rid)
            if mark is None or request.num_computed_tokens > mark:
                self.high_water[rid] = request.num_computed_tokens
                moved = True
        for rid in [r for r in self.high_water if r not in live]:
            del self.high_water[rid]
            moved = True
        self.steps_without_progress = 0 if moved else self.steps_without_progress + 1

    def going_nowhere(self) -> bool:
        """Steps are being scheduled but no request gets further than it has
        been: preemption and re-admission in a loop (a request admitted,
        preempted for room it then needs itself, admitted again), which no
        quiet-step count sees. The bound is what an honest recovery can
        take: every live request recomputing what it had, at worst one
        token a step and one step in ``prefill_schedule_interval``, plus a
        margin."""
        if any(rid not in self.high_water for rid in self.scheduler.requests):
            return False  # a request added since the last step: it has had no chance yet
        interval = max(1, self.draw.prefill_schedule_interval or 1)
        bound = interval * sum(self.high_water.values()) + IDLE_PROGRESS_MARGIN
        return self.steps_without_progress > bound

    def stale_shares(self, ids: list[str], sampled: list[list[int]], index: int) -> dict[str, tuple[int, tuple[int, ...], int]]:
        """Before feeding step ``index``'s output: its requests preempted by
        a schedule() made after that step (async scheduling), whose share of
        it is stale."""
        return stale_shares_of(ids, sampled, index, self.preempted_at, self.scheduler.requests)

    def stale_outputs(self, stale: Mapping[str, tuple[int, tuple[int, ...], int]], index: int) -> list[StaleOutput]:
        """After feeding it: what became of each stale share."""
        return stale_outputs_of(stale, index, getattr(self.scheduler, "requires_kv_delivery", None), self.requests)

    def drafts_to_verify(self, out: Any, sampled: list[list[int]]) -> dict[str, tuple[int, int, int]]:
        """Before feeding ``out``'s output: per request with drafts and a
        sampled token, its drafts, how many were accepted and its computed
        tokens then."""
        return drafts_to_verify_of(out, sampled, self.scheduler.requests)

    def verifications(self, verified: Mapping[str, tuple[int, int, int]]) -> tuple[DraftVerification, ...]:
        """After feeding it: what the scheduler made of the verified drafts."""
        return draft_verifications_of(verified, self.requests, self.scheduler.requests)

    def pool(self, num_blocks: int, context: str = "") -> PoolObservation:
        pool = self.manager.block_pool
        referenced = tuple(
            (b.block_id, b.ref_cnt) for b in pool.blocks if b.ref_cnt != 0 and not b.is_null
        )
        return PoolObservation(
            num_blocks=num_blocks,
            num_free=pool.get_num_free_blocks(),
            referenced=referenced,
            live_requests=tuple(self.scheduler.requests),
            context=context,
        )
