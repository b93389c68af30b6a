"""Every request's fate, from the harness's own record: the harness side of
``invariants/fate.py``.

:class:`FateRecord` keeps, for one harness, the two fates only the harness
can vouch for:

* finished: an ``EngineCoreOutput`` with a finish reason in what
  ``update_from_output`` returned for an output the harness fed back
  (:meth:`FateRecord.reported`), counted per report;
* aborted: an ``Abort`` of the harness's operation log, issued while the
  request had no fate yet (an abort of a request already reported finished
  changes nothing).

After each step (:meth:`FateRecord.after_step`) it reads where vLLM keeps
each request (its ``running`` list and every ``RequestQueue`` the scheduler
holds, found by type, so a release that adds a waiting queue is read
without a change here), and returns one :class:`fuzz.model.RequestPlaces`
per request that is not settled (one fate, no queue), and the waiting
requests whose blockers the harness saw gone before a ``schedule()`` that
admitted nothing (:class:`fuzz.model.WaitingRequest`).

What "blockers gone" means, before a ``schedule()`` (all of it must hold;
vLLM 0.33.0's waiting loop in ``Scheduler.schedule`` gives the reasons):

* nothing RUNNING: no preemption stops the waiting loop, the token budget
  and ``max_num_seqs`` are whole, the prefill cadence and the watermark
  (both applied only beside running requests) are off;
* no step in flight with work (async scheduling), no async load and no
  producer hand-off in flight (the harness's connector script): no
  undrained stale output, no load landing, no blocks held by a send;
* the configuration leaves a request room in one step: the budget
  ``min(max_num_scheduled_tokens, max_num_batched_tokens - draft slots)``
  takes a padded speculative decode, and no multi-token prefill lookahead;
* the harness's own model of the free pool (:mod:`fuzz.adapter._evictions`)
  holds at least the sum, over every request the waiting loop reaches up to
  this one, of an upper bound on the blocks one admission can take (per
  group, the blocks for prompt plus ``max_tokens`` capped at
  ``max_model_len``, plus one token and, speculating, the drafts and the
  lookahead past the cap, plus two and the group's speculative state
  blocks; speculating, also a decode step's reservation for an async load):
  no request ahead can stop the loop on a failed allocation, and an async
  load's reservation fits;
* for the request itself: WAITING, PREEMPTED, or WAITING_FOR_REMOTE_KVS with
  its load reported; no multimodal item (the encoder budget may defer it);
  a request vLLM will ask the connector about has a decided scripted answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from vllm.v1.core.sched.request_queue import RequestQueue

from fuzz.model import Abort, AddRequest, OpLog, OpVisitor, RequestPlaces, Step, WaitingRequest, cdiv
from fuzz.model._fate import ABORTED, FINISHED

__all__ = ["FateRecord"]

_WAITING = ("WAITING", "PREEMPTED", "WAITING_FOR_REMOTE_KVS")


class FateRecord(OpVisitor[None]):
    """``requests``: the harness's registry of every request it added;
    ``oplog``: its operation log (the aborts it issued, the prompts and
    ``max_tokens`` it added); ``script``: its connector script; ``watch``:
    its :class:`~fuzz.adapter._evictions.EvictionWatch` (the free pool)."""

    def __init__(self, scheduler: Any, requests: Mapping[str, Any], oplog: OpLog, script: Any, watch: Any,
                 num_speculative_tokens: int) -> None:
        self.scheduler, self.requests, self.oplog, self.script = scheduler, requests, oplog, script
        self._free: Callable[[], int | None] = lambda: len(watch.free) if getattr(watch, "_on", False) else None
        self.finish_reports: Counter[str] = Counter()
        self.aborted: set[str] = set()
        # Requests an output reported an async load of failed, not scheduled since.
        self.failed_async: set[str] = set()
        self._ops_seen = 0
        self._attrs_seen, self._queue_names = -1, []  # see _queues
        self._longest: dict[str, int] = {}  # prompt + max_tokens, from each AddRequest
        self._allocs_seen = 0
        self._unblocked: dict[str, tuple[str, int, int]] = {}  # before the next schedule(): status, free, needed
        self._streak: dict[str, int] = {}
        spec = scheduler.vllm_config.speculative_config
        draft_slots = spec.max_num_new_slots_for_drafting if spec is not None else 0
        budget = min(scheduler.max_num_scheduled_tokens, scheduler.scheduler_config.max_num_batched_tokens - draft_slots)
        self._room = budget >= 1 + num_speculative_tokens and getattr(scheduler, "num_prefill_lookahead", 0) <= 1
        # Speculative decoding: a step's drafts and the drafter's lookahead,
        # added past max_model_len's cap as vLLM adds them (_request_remaining_blocks).
        self._extra = (1 + num_speculative_tokens + getattr(scheduler, "num_lookahead_tokens", 0)
                       if num_speculative_tokens else 1)
        groups = scheduler.kv_cache_manager.kv_cache_config.kv_cache_groups
        self._groups = tuple((g.kv_cache_spec.block_size, getattr(g.kv_cache_spec, "num_speculative_blocks", 0) or 0)
                             for g in groups)
        self._max_model_len = scheduler.vllm_config.model_config.max_model_len
        # What an async load's admission keeps free for a speculative decode
        # step (schedule()'s reserved_blocks, _spec_decode_step_blocks), whatever
        # the request's length.
        self._step_blocks = sum(cdiv(self._extra, size) for size, _ in self._groups) if num_speculative_tokens else 0

    def _take_ops(self) -> None:
        """The operations logged since the last look: prompts added, and
        aborts (each a fate only for a request that had none)."""
        ops = self.oplog.ops
        for op in ops[self._ops_seen:]:
            self.visit(op)
        self._ops_seen = len(ops)

    def on_add_request(self, op: AddRequest) -> None:
        self._longest[op.request_id] = len(op.token_ids) + op.max_tokens

    def on_step(self, op: Step) -> None:
        if op.fed is not None:
            self.failed_async.update(op.fed.failed_recving)

    def on_abort(self, op: Abort) -> None:
        if op.request_id in self.requests and not self.finish_reports[op.request_id] and op.request_id not in self.aborted:
            self.aborted.add(op.request_id)

    def other(self, op: Any) -> None:
        """Evictions and resets have no bearing on a request's fate."""

    def reported(self, outputs: Any) -> Any:
        """Record the finish reports among ``outputs`` (what
        ``update_from_output`` returned, handed back unchanged); the aborts
        issued before this step precede them."""
        self._take_ops()
        for eco in (outputs or {}).values():
            for out in eco.outputs:
                if out.finish_reason is not None:
                    self.finish_reports[out.request_id] += 1
        return outputs

    def _queues(self) -> list[tuple[str, Any]]:
        sched = self.scheduler
        attrs = vars(sched)
        if len(attrs) != self._attrs_seen:  # the queues' names, read again only when the attributes change
            self._attrs_seen = len(attrs)
            self._queue_names = [name for name, q in attrs.items() if isinstance(q, RequestQueue)]
        return [("running", sched.running)] + [
            (name, q) for name in self._queue_names if isinstance(q := attrs.get(name), RequestQueue)]

    def after_step(self, out: Any, pending: Any, error: str | None) -> dict[str, Any]:
        """The step's :class:`RequestPlaces` and :class:`WaitingRequest`
        rows (``out``: its ``SchedulerOutput``; ``pending``: the step left
        in flight, None when none; nothing after a step that raised)."""
        self._take_ops()
        if out is not None:
            self.failed_async.difference_update(out.num_scheduled_tokens)
        allocs, self._allocs_seen = self._allocs_seen, len(self.script.allocs)
        if error is not None:
            self._unblocked, self._streak = {}, {}
            return {}
        found: dict[str, list[str]] = {}
        waiting: dict[str, tuple[str, Any]] = {}
        for name, queue in self._queues():
            for request in queue:
                found.setdefault(request.request_id, []).append(name)
                if name != "running":
                    waiting[request.request_id] = (name, request)
        places = []
        for rid, request in self.requests.items():
            where = found.get(rid, []) + [FINISHED] * bool(self.finish_reports[rid]) + [ABORTED] * (rid in self.aborted)
            if where in ([FINISHED], [ABORTED]) and self.finish_reports[rid] <= 1:
                continue  # settled
            places.append(RequestPlaces(rid, tuple(where), self.finish_reports[rid], request.status.name))
        admitted_nothing = out is not None and not out.num_scheduled_tokens and allocs == len(self.script.allocs)
        streak = {}
        for rid, (status, free, needed) in self._unblocked.items():
            if admitted_nothing and rid in waiting and waiting[rid][1].status.name == status:
                streak[rid] = self._streak.get(rid, 0) + 1
        self._streak = streak
        stalls = tuple(WaitingRequest(rid, self._unblocked[rid][0], n, self._unblocked[rid][1],
                                      self._unblocked[rid][2], waiting[rid][0], rid in self.failed_async)
                       for rid, n in streak.items())
        self._unblocked = self._judge(waiting, getattr(pending, "out", None))
        return {"places": tuple(places), "waiting_unblocked": stalls}

    def _need(self, rid: str) -> int:
        """An upper bound on the blocks one admission of ``rid`` takes."""
        tokens = min(self._longest.get(rid, self._max_model_len), self._max_model_len) + self._extra
        return sum(cdiv(tokens, block_size) + 2 + spare for block_size, spare in self._groups) + self._step_blocks

    def _judge(self, waiting: dict[str, tuple[str, Any]], in_flight: Any) -> dict[str, tuple[str, int, int]]:
        """The waiting requests whose blockers are all gone before the next
        ``schedule()`` (the module docstring's list)."""
        free = self._free()
        if (free is None or not self._room or self.scheduler.running
                or (in_flight is not None and in_flight.total_num_scheduled_tokens)
                or self.script.loads_in_flight or self.script.sends_in_flight):
            return {}
        # The scan takes every other queue (those holding KV blocks, whose
        # loads the reservation counts) before ``waiting``, in queue order.
        held = sum(self._need(rid) for rid, (queue, _) in waiting.items() if queue != "waiting")
        unblocked = {}
        needed = held
        for rid, (queue, request) in sorted(waiting.items(), key=lambda item: item[1][0] == "waiting"):
            if queue == "waiting":
                needed += self._need(rid)
            reply = self.script.reply_for(rid)
            undecided = reply.kind == "undecided" and self.script.times_asked(rid) < reply.undecided
            if needed <= free and request.status.name in _WAITING and not request.mm_features and not (
                    request.num_computed_tokens == 0 and undecided):
                unblocked[rid] = (request.status.name, free, needed)
        return unblocked
