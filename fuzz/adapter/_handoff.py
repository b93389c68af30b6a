"""What the connector is handed when a request finishes, beside the
harness's own record of that request's blocks.

:class:`HandOffWatch` keeps, per request, the block table the harness last
saw it hold: the runner's (from each ``SchedulerOutput``, as
:class:`fuzz.adapter._contents.BlockContents` keeps it), or, while an async
load keeps the request from the runner, the blocks
``update_state_after_alloc`` handed the connector; a preemption empties it,
and so does vLLM's release of a failed async load that left no valid token
(``Scheduler._update_waiting_for_remote_kv``: the request waits again with
no blocks, and is handed none if aborted before it is admitted again).
The scripted connector calls :meth:`HandOffWatch.hand_off` inside
``request_finished_all_groups``, so the record and the contents are read at
the moment of the call, before vLLM frees or the pool reuses anything. What
it returns (:class:`fuzz.model.HandOff`) is judged by
:func:`invariants.handoff.check_hand_off_names_computed_blocks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fuzz.adapter._contents import FAILED_LOAD, BlockContents
from fuzz.model import ConnectorAlloc, GroupInfo, HandOff

__all__ = ["HandOffWatch"]


class HandOffWatch:
    """The harness's record of each request's blocks, and the hand-off
    record built from it at each ``request_finished`` call."""

    def __init__(self, contents: BlockContents, tokens: Any, groups: tuple[GroupInfo, ...],
                 rules: tuple[tuple[str, int], ...], clipped: Sequence[bool | None]) -> None:
        self.contents = contents
        self.tokens = tokens  # request id -> the tokens the worker knows (prompt and sampled)
        self.groups = groups
        self.rules = rules
        # None where the release states no hand-off contract: nothing is recorded.
        self.clipped = None if None in clipped or len(clipped) != len(groups) else tuple(bool(c) for c in clipped)
        self.judged = tuple(p or s for p, s in zip(contents.per_position, contents.whole_state))
        self.with_runner: set[str] = set()  # requests whose record is the runner's table
        self.allocated: dict[str, tuple[tuple[int, ...], ...]] = {}  # the blocks of their last allocation
        self.rolled_back: set[str] = set()  # requests a failed synchronous load ever rolled back (the harness's)
        self.requests: Any = None  # vLLM's request map, to observe a failed async load's release (see take)

    def take(self, out: Any, allocs: Sequence[ConnectorAlloc]) -> None:
        """After the runner took ``out``'s tables: the allocations of the step
        (an async load's request stays away from the runner until it lands),
        its preemptions (vLLM frees the request's blocks), and the requests
        it hands the runner."""
        # schedule() preempts in its running loop before its waiting loop
        # admits, and may admit a request it preempted in the same call.
        for rid in getattr(out, "preempted_req_ids", None) or ():
            self.with_runner.discard(rid)
            self.allocated.pop(rid, None)
        for a in allocs:
            self.allocated[a.request_id] = a.block_ids
            self.with_runner.discard(a.request_id)
        # An async load's request that schedule() moved back to WAITING with
        # no computed token: its load failed from no local hit, and vLLM
        # released every block it had allocated.
        fresh = {a.request_id for a in allocs}
        for rid in [r for r in self.allocated if r not in fresh and r not in self.with_runner]:
            request = None if self.requests is None else self.requests.get(rid)
            if request is not None and request.status.name == "WAITING" and request.num_computed_tokens == 0:
                del self.allocated[rid]
        cached = out.scheduled_cached_reqs
        for rid in [n.req_id for n in out.scheduled_new_reqs] + list(cached.req_ids):
            if rid in self.contents.tables:
                self.with_runner.add(rid)
        for rid in out.finished_req_ids or ():
            self.with_runner.discard(rid)
            self.allocated.pop(rid, None)

    def recorded(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        """Per group, the table the harness last saw ``request_id`` hold."""
        if request_id in self.with_runner:
            return tuple(tuple(t) for t in self.contents.tables.get(request_id, ()))
        return self.allocated.get(request_id, ((),) * len(self.groups))

    def hand_off(self, request: Any, block_ids: Sequence[Sequence[int]]) -> HandOff | None:
        """The record of one ``request_finished_all_groups(request, block_ids)``."""
        if self.clipped is None:
            return None
        rid = request.request_id
        computed = request.num_computed_tokens
        processed = max(0, computed - getattr(request, "num_in_flight_tokens", 0))
        status = request.status.name
        handed = tuple(tuple(g) for g in block_ids)
        unheld = () if status == "FINISHED_ERROR" else self._unheld(rid, handed, processed, computed)
        return HandOff(rid, status, computed, processed, request.num_prompt_tokens, handed, self.recorded(rid),
                       self.clipped, self.rules, self.judged, unheld, self.groups, self.contents.null_block_id,
                       rid in self.rolled_back)

    def _unheld(self, rid: str, handed: tuple[tuple[int, ...], ...], processed: int, computed: int
                ) -> tuple[tuple[int, int, int, Any], ...]:
        """Per handed block of a recorded group, the positions below
        ``processed`` it covers whose KV it does not hold (a whole-state
        group: its state at ``processed``, judged with no step in flight)."""
        tokens = self.tokens.get(rid, [])
        loading = self.contents.loading.get(rid)
        found: list[tuple[int, int, int, Any]] = []
        for g, ids in enumerate(handed):
            if g >= len(self.groups):
                break
            size = self.contents.block_sizes[g]
            # Positions an async load still in flight is to fill hold nothing yet.
            first_loading = loading[1][g] if loading is not None else processed
            end = min(processed, first_loading)
            if self.contents.per_position[g]:
                for i, block in enumerate(ids):
                    if block == self.contents.null_block_id or i * size >= end:
                        continue
                    positions = range(i * size, min((i + 1) * size, end))
                    # What a failed load or a same-step copy lost (a negative
                    # position) is the failed-load and copy claims' to report.
                    found += [(g, block, p, h) for p, h in self.contents.unwritten(block, g, positions, tokens)
                              if h is None or h[0] >= 0]
            elif self.contents.whole_state[g] and 0 < end == computed:
                index = (end - 1) // size
                block = ids[index] if index < len(ids) else self.contents.null_block_id
                held = self.contents.states.get(block) if block != self.contents.null_block_id else None
                if held is not None and held[0] == FAILED_LOAD:
                    continue
                mine = tuple(tokens[:end]) if len(tokens) >= end else None
                if held is None or held[0] != end or (mine is not None and held[2] is not None and held[2] != mine):
                    found.append((g, block, end, None if held is None else (held[0], held[1], None)))
        return tuple(found)
