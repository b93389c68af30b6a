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

__all__ = ["WorkerRecord", "computed_before"]


def computed_before(out: Any) -> dict[str, int]:
    """Per request of ``out``, the ``num_computed_tokens`` the scheduler
    output hands the runner (before this step's tokens): a new request's
    from ``scheduled_new_reqs``, every other one's (resumed ones included)
    from ``scheduled_cached_reqs``."""
    computed = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    for i, rid in enumerate(cached.req_ids):
        computed.setdefault(rid, cached.num_computed_tokens[i])
    return computed


class WorkerRecord:
    """The worker's own view of each request: how many tokens it knows
    (prompt plus every token it sampled, fed back or not), and the transfers
    it owes a report for (:meth:`loads_landing`, :meth:`sends_done`)."""

    def __init__(self) -> None:
        # Request id -> tokens the worker knows for it, and its prompt's.
        self.known: dict[str, int] = {}
        self.prompt: dict[str, int] = {}

    def add(self, request_id: str, num_prompt_tokens: int) -> None:
        self.known[request_id] = self.prompt[request_id] = num_prompt_tokens

    def resync(self, out: Any) -> None:
        """Take the token lists ``out`` resends: a new request's prompt (V1)
        or all its tokens (V2 runner, ``prefill_token_ids``, resumed requests
        included), and the V1 runner's ``all_token_ids`` for a cached request
        not scheduled in the step before (a resumed one among them). After a
        preemption this is where a worker learns which of its sampled tokens
        vLLM kept (a stale output may have been dropped). And, as the V1
        runner aligns its cached state (GPUModelRunner._update_states: "Some
        output tokens were discarded due to a sync-KV-load failure"), a
        cached request's ``num_output_tokens`` below the outputs the worker
        knows drops the excess: vLLM discards the token sampled in a step
        whose load failed."""
        for new in out.scheduled_new_reqs:
            tokens = getattr(new, "prefill_token_ids", None) or new.prompt_token_ids
            if tokens is not None:
                self.known[new.req_id] = len(tokens)
        cached = out.scheduled_cached_reqs
        for rid, tokens in (getattr(cached, "all_token_ids", None) or {}).items():
            self.known[rid] = len(tokens)
        for rid, outputs in zip(cached.req_ids, getattr(cached, "num_output_tokens", None) or ()):
            if rid in self.prompt and self.prompt[rid] + outputs < self.known.get(rid, 0):
                self.known[rid] = self.prompt[rid] + outputs

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
        end = before[request_id] + out.num_scheduled_tokens[request_id]
        return end >= self.known.get(request_id, 0)

    def sampled(self, request_id: str, num_tokens: int) -> None:
        self.known[request_id] = self.known.get(request_id, 0) + num_tokens

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
