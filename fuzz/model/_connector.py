"""What the KV connector was asked and told in one step, as the scripted
connector recorded it: each allocation's external load, the metadata each
``schedule()`` built, the finish calls, and the loads reported failed."""

from __future__ import annotations

import dataclasses

from fuzz.model._kv import GroupInfo

__all__ = ["ConnectorAlloc", "ConnectorFinish", "ConnectorMeta", "FailedLoad", "HandOff"]


@dataclasses.dataclass(frozen=True)
class ConnectorAlloc:
    """One ``update_state_after_alloc(request, blocks, num_external_tokens)``
    the scheduler made in a step, beside the scheduler's own accounting for
    that request in the same step."""

    request_id: str
    num_tokens: int
    block_ids: tuple[tuple[int, ...], ...]  # per group, what ``blocks`` held
    num_external_tokens: int
    # The request's last allocate_slots call of the step (None: there was none):
    # its num_new_computed_tokens and num_external_computed_tokens.
    alloc_local_tokens: int | None
    alloc_external_tokens: int | None
    # The request's get_num_new_matched_tokens call of the step (None: not
    # asked this step, as when an async load lands).
    asked_with: int | None
    reply: int | None
    reply_async: bool

    def describe(self) -> str:
        asked = (
            "not asked this step"
            if self.asked_with is None
            else f"get_num_new_matched_tokens(req, {self.asked_with}) -> ({self.reply}, async={self.reply_async})"
        )
        return (
            f"request {self.request_id} (num_tokens={self.num_tokens}): {asked}; "
            f"allocate_slots(num_new_computed_tokens={self.alloc_local_tokens}, "
            f"num_external_computed_tokens={self.alloc_external_tokens}); "
            f"update_state_after_alloc(req, blocks={[list(g) for g in self.block_ids]}, "
            f"num_external_tokens={self.num_external_tokens})"
        )


@dataclasses.dataclass(frozen=True)
class ConnectorMeta:
    """One ``build_connector_meta(scheduler_output)``: the requests the output
    it was handed names."""

    # (request id, num_computed_tokens) of scheduled_new_reqs and of
    # scheduled_cached_reqs (running and resumed).
    new_requests: tuple[tuple[str, int], ...]
    cached_requests: tuple[tuple[str, int], ...]
    num_scheduled: tuple[tuple[str, int], ...]  # num_scheduled_tokens
    has_sync_kv_loads: bool | None  # None: the release's output has no such field
    # Named requests (new or cached) the connector had already been told had
    # finished (request_finished / request_finished_all_groups).
    already_finished: tuple[str, ...] = ()

    @property
    def named(self) -> frozenset[str]:
        return frozenset(r for r, _ in self.new_requests + self.cached_requests)

    def describe(self) -> str:
        return (
            f"build_connector_meta(scheduler_output: new={list(self.new_requests)}, "
            f"cached={list(self.cached_requests)}, num_scheduled_tokens={dict(self.num_scheduled)}, "
            f"has_sync_kv_loads={self.has_sync_kv_loads})"
        )


@dataclasses.dataclass(frozen=True)
class HandOff:
    """What one ``request_finished(_all_groups)`` handed the connector, beside
    the harness's own record of the request at that moment.

    ``recorded`` is, per group, the block table the harness last saw the
    request hold: the one the runner was handed (a ``SchedulerOutput``'s
    ``block_ids``, ``new_block_ids`` appended, a resumed request's
    replacing it), or, while an async load keeps the request from the
    runner, the blocks ``update_state_after_alloc`` handed the connector;
    empty once a preemption took its blocks. ``unheld``: per handed block of
    a group the contents model records, each position it covers below
    ``num_processed_tokens`` (a whole-state group: the state block at that
    count) whose KV the block does not hold, as (group, block id, position,
    what it holds: (position, step, token) or None); positions a load
    still in flight or a failed load fills are left out, as is a request
    that finished with an error."""

    request_id: str
    status: str  # the request's RequestStatus name at the call
    num_computed_tokens: int
    num_processed_tokens: int  # num_computed_tokens less the tokens of a step still in flight
    num_prompt_tokens: int
    handed: tuple[tuple[int, ...], ...]  # per group, the block ids request_finished was handed
    recorded: tuple[tuple[int, ...], ...]
    # Per group: vLLM hands the blocks covering the computed tokens (an
    # attention group) rather than its whole table; the group's read rule
    # (fuzz.adapter._ownership.read_rules); the contents model records it.
    clipped: tuple[bool, ...]
    rules: tuple[tuple[str, int], ...]
    judged: tuple[bool, ...]
    unheld: tuple[tuple[int, int, int, tuple[int, int, int | None] | None], ...]
    groups: tuple[GroupInfo, ...]
    null_block_id: int
    rolled_back: bool = False  # a failed synchronous load rolled the request back (recompute policy)

    def describe(self) -> str:
        return (
            f"request_finished_all_groups({self.request_id}, block_ids={[list(g) for g in self.handed]}) with the "
            f"request {self.status}, num_computed_tokens={self.num_computed_tokens} "
            f"({self.num_processed_tokens} processed), {self.num_prompt_tokens} prompt tokens; the harness's record "
            f"of its blocks: {[list(g) for g in self.recorded]}"
        )


@dataclasses.dataclass(frozen=True)
class ConnectorFinish:
    """One ``request_finished`` / ``request_finished_all_groups`` call."""

    request_id: str
    method: str
    status: str  # the request's RequestStatus name at the call
    nth: int  # how many times the connector has been told so far, this call included
    hand_off: HandOff | None = None  # None: the harness kept no record (a scheduler built without one)


@dataclasses.dataclass(frozen=True)
class FailedLoad:
    """A KV load the harness reported as failed, and what the scheduler had
    made of it at one moment: the end of the step that reported it
    (``stage="reported"``), or, for an async load, just after the scheduler
    took the request out of ``WAITING_FOR_REMOTE_KVS`` (``stage="landed"``).

    ``how`` is the model runner's report: ``"failed_recving"`` (a whole
    async load) or ``"invalid_block_ids"`` (a synchronous load, block by
    block; single-group layouts only).
    """

    request_id: str
    how: str
    policy: str  # kv_load_failure_policy: "fail" or "recompute"
    stage: str  # "reported" or "landed"
    load_start: int  # first token the load was to bring (the local part ends here)
    first_failed_token: int  # first token of the first failed block
    # Per group, the blocks the failed part of the load was written into.
    failed_block_ids: tuple[tuple[int, ...], ...]
    status_after: str  # the request's RequestStatus name at that moment
    computed_after: int  # its num_computed_tokens at that moment
    # Per group, those of ``failed_block_ids`` that carry a prefix-cache hash.
    cached_after: tuple[tuple[int, ...], ...]
    groups: tuple[GroupInfo, ...] = ()
    # The request's RequestStatus name when the failure was reported (right
    # before that update_from_output): FINISHED_ABORTED when an abort came
    # while the model ran the step ("" where not recorded).
    status_before: str = ""

    def describe(self) -> str:
        return (
            f"request {self.request_id}: load from token {self.load_start} reported failed via "
            f"{self.how} (kv_load_failure_policy={self.policy!r}), first failed token "
            f"{self.first_failed_token}, failed blocks {[list(g) for g in self.failed_block_ids]}; "
            f"{'after the report' if self.stage == 'reported' else 'after it left WAITING_FOR_REMOTE_KVS'}: "
            f"status {self.status_after}, num_computed_tokens={self.computed_after}, "
            f"still cached {[list(g) for g in self.cached_after]}"
        )
