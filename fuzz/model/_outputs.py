"""What a fed-back output did to the requests it carried: a preempted
request's stale share of it, and the drafts it verified. Records of a
step (:class:`fuzz.model.StepObservation`), built from what the harness
watches."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DraftVerification", "StaleOutput", "draft_verifications_of", "drafts_to_verify_of", "stale_outputs_of",
    "stale_shares_of",
]


@dataclasses.dataclass(frozen=True)
class StaleOutput:
    """A request's share of a fed-back output after it was preempted (async
    scheduling: preempted by a schedule() made while that step ran)."""

    request_id: str
    fed_step: int  # whose output was fed
    preempted_at: int  # the step whose schedule() preempted it, after fed_step
    sampled: tuple[int, ...]  # what the model runner sampled for it in that output
    # Whether the release drops such output (Scheduler.requires_kv_delivery:
    # a connector that hands KV off; None: the release has no such rule).
    drops: bool | None
    num_tokens_before: int  # request.num_tokens before update_from_output
    num_tokens_after: int
    status_after: str

    def describe(self) -> str:
        return (
            f"request {self.request_id}, preempted at step {self.preempted_at}, got step {self.fed_step}'s "
            f"sampled tokens {list(self.sampled)} (stale; drop_stale_output={self.drops}): "
            f"num_tokens {self.num_tokens_before} -> {self.num_tokens_after}, status {self.status_after}"
        )


@dataclasses.dataclass(frozen=True)
class DraftVerification:
    """One request's drafts verified by an ``update_from_output``: the drafts
    its step scheduled (``scheduled_spec_decode_tokens``, -1 padding
    included), how many the rejection sampler accepted, and its
    ``num_computed_tokens`` right before and right after the call."""

    request_id: str
    num_drafts: int
    num_accepted: int
    computed_before: int
    computed_after: int
    status_after: str  # its RequestStatus name after the call ("" : it left the scheduler)

    @property
    def num_rejected(self) -> int:
        return self.num_drafts - self.num_accepted

    def describe(self) -> str:
        return (
            f"request {self.request_id}: {self.num_drafts} drafts verified, {self.num_accepted} accepted; "
            f"num_computed_tokens {self.computed_before} -> {self.computed_after} ({self.status_after or 'gone'})"
        )


def stale_shares_of(ids: Sequence[str], sampled: Sequence[Sequence[int]], index: int, preempted_at: Mapping[str, int],
                    requests: Mapping[str, Any]) -> dict[str, tuple[int, tuple[int, ...], int]]:
    """Before step ``index``'s output is fed (``ids``: its requests, ``sampled``:
    what the model runner sampled for each): each request a later schedule()
    preempted (``preempted_at``: request id -> the step that last preempted
    it; ``requests``: the scheduler's live requests), with what it was
    sampled and its ``num_tokens`` now: request id -> (preempted at,
    sampled, num_tokens)."""
    return {
        rid: (preempted_at[rid], tuple(sampled[i]), requests[rid].num_tokens)
        for i, rid in enumerate(ids)
        if preempted_at.get(rid, 0) > index and rid in requests
    }


def stale_outputs_of(stale: Mapping[str, tuple[int, tuple[int, ...], int]], index: int, drops: bool | None,
                     requests: Mapping[str, Any]) -> list[StaleOutput]:
    """After step ``index``'s output was fed: what became of each stale share
    (``stale``: :func:`stale_shares_of`'s; ``drops``: the scheduler's
    ``requires_kv_delivery``, None where the release has none; ``requests``:
    request id -> its vLLM Request)."""
    return [
        StaleOutput(rid, index, at, tokens, drops, before, requests[rid].num_tokens, requests[rid].status.name)
        for rid, (at, tokens, before) in stale.items()
    ]


def drafts_to_verify_of(out: Any, sampled: Sequence[Sequence[int]],
                        requests: Mapping[str, Any]) -> dict[str, tuple[int, int, int]]:
    """Before step output ``out`` is fed (``sampled``: what the model runner
    sampled for each of its requests, in ``num_scheduled_tokens`` order;
    ``requests``: the scheduler's live requests): per request with drafts
    and a sampled token, (its drafts, how many were accepted, its
    ``num_computed_tokens`` now)."""
    drafts = out.scheduled_spec_decode_tokens or {}
    return {
        rid: (len(drafts[rid]), len(tokens) - 1, requests[rid].num_computed_tokens)
        for rid, tokens in zip(out.num_scheduled_tokens, sampled)
        if drafts.get(rid) and tokens and rid in requests
    }


def draft_verifications_of(verified: Mapping[str, tuple[int, int, int]], requests: Mapping[str, Any],
                           live: Mapping[str, Any]) -> tuple[DraftVerification, ...]:
    """After an output was fed: what the scheduler made of the drafts it
    verified (``verified``: request id -> (drafts, accepted,
    num_computed_tokens before); ``requests``: request id -> its vLLM
    Request; ``live``: the scheduler's requests now)."""
    return tuple(
        DraftVerification(rid, n, accepted, computed, requests[rid].num_computed_tokens,
                          live[rid].status.name if rid in live else "")
        for rid, (n, accepted, computed) in verified.items()
    )
