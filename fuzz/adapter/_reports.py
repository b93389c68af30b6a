"""What the scripted worker reports back, decided from its own record.

A real model runner does not read the scheduler's state: it knows the
requests the ``SchedulerOutput`` hands it, the tokens it sampled itself, and
the transfers its connector was told to do. It reports a load landed because
the load was started, a send done because the send was started, and samples
a token because the scheduled tokens reach the end of the tokens it knows.
Deciding any of this from ``scheduler.requests`` would hide the bugs where
vLLM lost track of a request or freed its blocks too early: a report for a
request vLLM forgot must reach vLLM, which then fails where a deployment
would.

:class:`WorkerRecord` keeps that knowledge for one harness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["WorkerRecord", "computed_before", "newly_scheduled", "take_handed_tables"]


def take_handed_tables(tables: dict[str, list[list[int]]], out: Any) -> set[str]:
    """Bring ``tables`` (request id -> per group, its block table) up to
    what ``out`` hands the runner: a new request's ``block_ids``, a resumed
    (or first seen) one's replacing its table, a cached one's
    ``new_block_ids`` appended. The requests whose table was replaced."""
    replaced = set()
    for new in out.scheduled_new_reqs:
        tables[new.req_id] = [list(g) for g in new.block_ids]
        replaced.add(new.req_id)
    cached = out.scheduled_cached_reqs
    resumed = set(getattr(cached, "resumed_req_ids", None) or ())
    for rid, ids in zip(cached.req_ids, cached.new_block_ids):
        if ids is None:
            continue
        if rid in resumed or rid not in tables:
            tables[rid] = [list(g) for g in ids]
            replaced.add(rid)
        else:
            for table, more in zip(tables[rid], ids):
                table.extend(more)
    return replaced


def computed_before(out: Any) -> dict[str, int]:
    """Per request of ``out``, the ``num_computed_tokens`` the scheduler
    output hands the runner (before this step's tokens): a new request's
    from ``scheduled_new_reqs``, every other one's (resumed ones included)
    from ``scheduled_cached_reqs``."""
    computed = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    for i, req_id in enumerate(cached.req_ids):
        computed.setdefault(req_id, cached.num_computed_tokens[i])
    return computed


def newly_scheduled(out: Any, requests: Mapping[str, Any]) -> tuple[tuple[str, int, int], ...]:
    """Each request ``out`` schedules for the first time, or again after an
    async load or a preemption (``resumed_req_ids``): (request id, the
    ``num_computed_tokens`` it starts from, its ``num_tokens`` as
    ``requests`` (id -> vLLM Request) hold it now)."""
    rows = [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs]
    cached = out.scheduled_cached_reqs
    rows += [(rid, cached.num_computed_tokens[i]) for i, rid in enumerate(cached.req_ids)
             if rid in cached.resumed_req_ids]
    return tuple((rid, computed, requests[rid].num_tokens) for rid, computed in rows)


class WorkerRecord:
    """The worker's own view of each request: the tokens it knows (prompt
    plus every token it sampled, fed back or not), the token it computed
    each position's KV from, and the transfers it owes a report for
    (:meth:`loads_landing`, :meth:`sends_done`)."""

    def __init__(self, async_scheduling: bool = False) -> None:
        self.async_scheduling = async_scheduling
        # Request id -> the token ids the worker knows for it, and its prompt's length.
        self.tokens: dict[str, list[int]] = {}
        self.prompt: dict[str, int] = {}
        # Request id -> position -> (the token its KV was computed from, the
        # step that computed it), for the positions the worker computed and
        # whose token vLLM has not yet been seen to agree on (see :meth:`unsettled`).
        self.written: dict[str, dict[int, tuple[int, int]]] = {}
        # Request id -> step -> the drafts the worker rejected in that step,
        # while its output has not been fed back: the scheduler counted them
        # computed when it scheduled the steps after it (see :meth:`start`).
        self.unfed_rejections: dict[str, dict[int, int]] = {}

    def add(self, request_id: str, prompt: Iterable[int]) -> None:
        self.tokens[request_id] = list(prompt)
        self.prompt[request_id] = len(self.tokens[request_id])

    def known(self, request_id: str) -> int:
        return len(self.tokens.get(request_id, ()))

    def resync(self, out: Any) -> None:
        """Take the token lists ``out`` resends: a new request's prompt (V1)
        or all its tokens (V2 runner, ``prefill_token_ids``, resumed requests
        included), and the V1 runner's ``all_token_ids`` for a cached request
        not scheduled in the step before (a resumed one among them). After a
        preemption this is where a worker learns which of its sampled tokens
        vLLM kept (a stale output may have been dropped). And, as the V1
        runner aligns its cached state (GPUModelRunner._update_states: "Some
        output tokens were discarded due to a sync-KV-load failure"), a
        cached request's ``num_output_tokens`` (vLLM sends its outputs plus
        its output placeholders) below the outputs the worker knows drops
        the excess. A request added anew forgets the rejections of its old
        steps still unfed."""
        for new in out.scheduled_new_reqs:
            if new.prompt_token_ids is not None:
                self.prompt.setdefault(new.req_id, len(new.prompt_token_ids))
            tokens = getattr(new, "prefill_token_ids", None) or new.prompt_token_ids
            if tokens is not None:
                self.tokens[new.req_id] = list(tokens)
        cached = out.scheduled_cached_reqs
        outputs_of = dict(zip(cached.req_ids, getattr(cached, "num_output_tokens", None) or ()))
        for rid, tokens in (getattr(cached, "all_token_ids", None) or {}).items():
            if self.async_scheduling and rid in self.prompt and rid in outputs_of:
                # The V1 runner re-adding a request to its batch under async
                # scheduling keeps its prompt and takes the last
                # num_output_tokens of all_token_ids as its outputs.
                n = outputs_of[rid]
                self.tokens[rid] = self.tokens.get(rid, [])[: self.prompt[rid]] + (list(tokens[-n:]) if n > 0 else [])
            else:
                self.tokens[rid] = list(tokens)
        for rid, outputs in zip(cached.req_ids, getattr(cached, "num_output_tokens", None) or ()):
            if rid in self.prompt and self.prompt[rid] + outputs < self.known(rid):
                del self.tokens[rid][self.prompt[rid] + outputs :]
        # A request the runner adds to its batch anew (new, or resumed after a
        # preemption: a prefix-cache reset's may resume while its old step is
        # in flight) starts where the output says; the rejected drafts of
        # that old, stale step do not move it. One the same output reports
        # preempted (a reset's preemption, reported by the schedule() that
        # admits it again) lost its KV with its blocks before this step.
        preempted = set(out.preempted_req_ids or ())
        for rid in [n.req_id for n in out.scheduled_new_reqs] + list(getattr(cached, "resumed_req_ids", None) or ()):
            self.unfed_rejections.pop(rid, None)
            if rid in preempted:
                self.written.pop(rid, None)

    def start(self, request_id: str, before: Mapping[str, int]) -> int:
        """Where ``request_id``'s scheduled tokens really start: the
        ``num_computed_tokens`` the output hands over, less the drafts the
        worker rejected in steps whose output vLLM has not been fed yet.
        Under async scheduling vLLM schedules a step before it learns how
        many of the previous step's drafts were accepted, counting them all;
        the V1 runner, which knows, moves the step back by the rejections
        (the scheduler rolls its count back when it is fed them)."""
        if self.unfed_rejections:  # only ever filled where the worker speculates
            return before[request_id] - sum(self.unfed_rejections.get(request_id, {}).values())
        return before[request_id]

    def rejected(self, request_id: str, step: int, count: int) -> None:
        """The worker rejected ``count`` of the drafts ``step`` scheduled for ``request_id``."""
        if count:
            self.unfed_rejections.setdefault(request_id, {})[step] = count

    def fed(self, step: int) -> None:
        """The output of ``step`` reached vLLM: its rejections are counted there."""
        for by_step in self.unfed_rejections.values():
            by_step.pop(step, None)

    def reaches_end(self, out: Any, request_id: str, before: Mapping[str, int]) -> bool:
        """Whether ``out``'s tokens for ``request_id`` reach the end of the
        tokens the worker knows (then it samples; a non-final prefill chunk
        samples nothing). With async scheduling the worker knows the tokens it
        sampled for steps not fed back yet too: they are the output
        placeholders vLLM counts for them (one per sampled token). A request
        the output schedules without handing it over (in neither
        ``scheduled_new_reqs`` nor ``scheduled_cached_reqs``) is none the
        worker can run: it samples nothing for it."""
        if request_id not in before:
            return False
        end = self.start(request_id, before) + out.num_scheduled_tokens[request_id]
        return end >= self.known(request_id)

    def compute(self, out: Any, request_id: str, before: Mapping[str, int], step: int) -> None:
        """The KV ``out`` has the worker compute for ``request_id``: each
        scheduled position below the speculative slots is computed from the
        token the worker has there (positions it has no token for, and
        draft slots, are forgotten: their contents are the drafter's or
        nobody's, and a later step rewrites them)."""
        if request_id not in before:
            return
        start = self.start(request_id, before)
        end = start + out.num_scheduled_tokens[request_id]
        drafts = len((getattr(out, "scheduled_spec_decode_tokens", None) or {}).get(request_id, ()))
        tokens = self.tokens.get(request_id, [])
        written = self.written.setdefault(request_id, {})
        for position in range(start, end):
            if position < end - drafts and position < len(tokens):
                written[position] = (tokens[position], step)
            else:
                written.pop(position, None)

    def unsettled(self, request_id: str, computed: int, recorded: list[int]) -> list[tuple[int, int, int, int]]:
        """Compare the positions the worker computed for ``request_id``
        below ``computed`` (vLLM's ``num_computed_tokens``) with the tokens
        vLLM ``recorded`` there: each position that agrees is settled and
        forgotten; those that do not are returned as (position, token the
        KV was computed from, token vLLM records, step that computed it).
        Positions vLLM has no token for yet (an output still in flight) wait."""
        written = self.written.get(request_id)
        if not written:
            return []
        wrong = []
        for position in [p for p in written if p < computed and p < len(recorded)]:
            token, step = written.pop(position)
            if token != recorded[position]:
                wrong.append((position, token, recorded[position], step))
        return sorted(wrong)

    def settle(self, requests: Mapping[str, Any], preempted: Iterable[str]) -> list[tuple[str, int, int, int, int]]:
        """After a step: for each request the worker computed KV for and vLLM
        still lists in ``requests`` (request id -> its ``Request``), the
        positions whose token vLLM records differently (:meth:`unsettled`),
        as (request id, position, token computed from, token recorded, step).
        The KV of a request ``preempted`` in the step is gone with its
        blocks, as is a departed one's: their record starts over (one the
        step admitted again was started over by :meth:`resync`: the caller
        leaves it out of ``preempted``)."""
        gone = set(preempted)
        wrong = []
        for rid in list(self.written):
            request = requests.get(rid)
            if request is None or rid in gone:
                self._forget(rid)
                continue
            wrong += [(rid, *w) for w in self.unsettled(rid, request.num_computed_tokens, request.all_token_ids)]
        return wrong

    def _forget(self, request_id: str) -> None:
        self.written.pop(request_id, None)
        self.unfed_rejections.pop(request_id, None)

    def sampled(self, request_id: str, tokens: list[int]) -> None:
        self.tokens.setdefault(request_id, []).extend(tokens)

    @staticmethod
    def loads_landing(in_flight: Iterable[str], started: Mapping[str, int], index: int) -> set[str]:
        """The async loads the output of step ``index`` reports landed: every
        load in flight started in that step or earlier, whether or not vLLM
        still knows its request."""
        return {r for r in in_flight if started.get(r, 0) <= index}

    @staticmethod
    def sends_done(started: Mapping[str, int], index: int) -> set[str]:
        """The producer's sends the output of step ``index`` reports done:
        every send started before that step (the worker learns a request
        finished from the next ``schedule()``), whether or not the request
        is still in the scheduler."""
        return {r for r, k in started.items() if k < index}
