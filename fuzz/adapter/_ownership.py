"""Watching block ownership on one real ``Scheduler`` (the shadow model's input).

:class:`OwnershipSpy` wraps, on the *instances* of one scheduler's block
pool, coordinator and single-type managers (classes untouched, so planted
bugs still apply):

* ``BlockPool.get_new_blocks`` and ``BlockPool.touch``: which blocks leave
  the free pool in this step, for which request and group;
* each manager's ``get_num_blocks_to_allocate`` and its three allocation
  calls: what an ``allocate_slots`` counted per group against what it took;
* the coordinator's ``find_longest_cache_hit`` (and the per-group variant):
  each lookup's limit and hit.

After ``schedule()`` :meth:`OwnershipSpy.observe` reads every request's
block tables and the pool state of the blocks in them into a
:class:`fuzz.model.OwnershipObservation`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from fuzz.model import AllocationRecord, GroupInfo, HeldTable, LookupRecord, OwnershipObservation

__all__ = ["OwnershipSpy", "read_rules"]


def _unpatched(obj: Any, name: str) -> Callable[..., Any]:
    """``obj.name`` as its class defines it when the harness is built
    (skipping any instance wrapper; planted bugs are swapped in on the class
    before that)."""
    cls = type(obj)
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name].__get__(obj, cls)
    raise AttributeError(name)


def read_rules(kv_cache_config: Any, groups: tuple[GroupInfo, ...], spans: tuple[Any, ...], behaviours: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """Per group, which of a running request's blocks the step reads:
    ``("full", 0)``, ``("window", W)``, ``("chunk", C)``, ``("rswa", W)``
    (the prompt plus the last W tokens: R-SWA frees the gap between),
    ``("state", k)`` (a recurrent state; k: its speculative state blocks) or
    ``("none", 0)`` (scratch)."""
    rules = []
    for g, spec_group, span, behaviour in zip(groups, kv_cache_config.kv_cache_groups, spans, behaviours):
        spec = spec_group.kv_cache_spec
        if behaviour == "scratch":
            rules.append(("none", 0))
        elif behaviour == "may-be-short":
            # The value: its speculative state blocks (see read_indices).
            rules.append(("state", int(getattr(spec, "num_speculative_blocks", 0) or 0)))
        elif getattr(spec, "rswa_window", None) is not None:
            rules.append(("rswa", int(spec.rswa_window)))
        elif span is not None:
            rules.append(("window" if span[0] == "sliding_window" else "chunk", span[1]))
        else:
            rules.append(("full", 0))
    return tuple(rules)


class OwnershipSpy:
    """Recording wrappers for one scheduler; :meth:`new_step` before each
    ``schedule()``, :meth:`observe` right after it."""

    def __init__(self, scheduler: Any, groups: tuple[GroupInfo, ...], spans: tuple[Any, ...]) -> None:
        self.scheduler = scheduler
        self.manager = scheduler.kv_cache_manager
        self.pool = self.manager.block_pool
        self.coordinator = self.manager.coordinator
        self.groups = groups
        self.spans = spans
        self.null_block_id = self.pool.null_block.block_id
        # vLLM defers a freed request's blocks while a step that scheduled it
        # may still run when batches overlap and a connector may load into a
        # reused block unordered with that step (the condition of
        # Scheduler.defer_block_free, read from the configuration).
        config = scheduler.vllm_config
        transfer = config.kv_transfer_config
        self.defers_frees = bool(config.max_concurrent_batches > 1 and transfer is not None and transfer.is_kv_consumer)
        # The last observation (its own in_flight dropped): the step in flight
        # when the next one is scheduled under async scheduling.
        self._last: OwnershipObservation | None = None
        self._fresh: list[tuple[int, str, int]] = []
        self._allocations: list[AllocationRecord] = []
        self._lookups: list[LookupRecord] = []
        # The allocate_slots call in progress: request id, per-group counts,
        # per-group takes, and the group whose allocation call is running.
        self._rid: str | None = None
        self._counted: list[int | None] = []
        self._taken: list[int] = []
        self._takers: list[set[str]] = []
        self._group: int | None = None
        self._caller = ""  # "Class.method" of the allocation call running
        self._install()

    def new_step(self) -> None:
        self._fresh = []
        self._allocations = []
        self._lookups = []

    # -- wrappers ------------------------------------------------------------
    def _install(self) -> None:
        pool, mgr, coord = self.pool, self.manager, self.coordinator
        spy = self

        real_get_new_blocks, real_touch = _unpatched(pool, "get_new_blocks"), _unpatched(pool, "touch")

        def get_new_blocks(num_blocks: int) -> Any:
            blocks = real_get_new_blocks(num_blocks)
            if spy._group is not None and blocks:
                spy._taken[spy._group] += len(blocks)
                spy._takers[spy._group].add(spy._caller)
            rid = spy._rid or "?"
            group = -1 if spy._group is None else spy._group
            spy._fresh.extend((b.block_id, rid, group) for b in blocks)
            return blocks

        def touch(blocks: Any) -> Any:
            if spy._group is not None:
                # A cached block with no reference sits in the free queue;
                # touching it takes it out of the pool.
                n = sum(1 for b in blocks if b.ref_cnt == 0 and not b.is_null)
                if n:
                    spy._taken[spy._group] += n
                    spy._takers[spy._group].add(spy._caller)
            return real_touch(blocks)

        pool.get_new_blocks = get_new_blocks
        pool.touch = touch

        for index, stm in enumerate(coord.single_type_managers):
            self._wrap_manager(index, stm)

        def allocate_slots(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
            outer = (spy._rid, spy._counted, spy._taken, spy._takers, spy._group)
            spy._rid = request.request_id
            spy._counted = [None] * len(spy.groups)
            spy._taken = [0] * len(spy.groups)
            spy._takers = [set() for _ in spy.groups]
            spy._group = None
            raised = True
            result = None
            try:
                result = inner_allocate(request, num_new_tokens, *args, **kwargs)
                raised = False
                return result
            finally:
                if raised or result is not None:
                    spy._allocations.append(
                        AllocationRecord(
                            request_id=request.request_id,
                            num_new_tokens=num_new_tokens,
                            num_new_computed_tokens=kwargs.get("num_new_computed_tokens", 0),
                            num_external_computed_tokens=kwargs.get("num_external_computed_tokens", 0),
                            counted=tuple(spy._counted),
                            taken=tuple(spy._taken),
                            takers=tuple(tuple(sorted(t)) for t in spy._takers),
                            raised=raised,
                        )
                    )
                spy._rid, spy._counted, spy._taken, spy._takers, spy._group = outer

        # The harness's admission spies may already wrap allocate_slots on the
        # instance: wrap theirs.
        inner_allocate = mgr.__dict__.get("allocate_slots") or _unpatched(mgr, "allocate_slots")
        mgr.allocate_slots = allocate_slots

        real_lookup = _unpatched(coord, "find_longest_cache_hit")

        def find_longest_cache_hit(block_hashes: Any, max_cache_hit_length: int, *args: Any, **kwargs: Any) -> Any:
            result = real_lookup(block_hashes, max_cache_hit_length, *args, **kwargs)
            spy._lookups.append(LookupRecord("find_longest_cache_hit", max_cache_hit_length, (result[1],),
                                             spy._owner(block_hashes, result[0]) if result[1] > max_cache_hit_length else ""))
            return result

        coord.find_longest_cache_hit = find_longest_cache_hit
        if hasattr(type(coord), "find_longest_cache_hit_per_group"):

            real_per_group = _unpatched(coord, "find_longest_cache_hit_per_group")

            def per_group(block_hashes: Any, max_cache_hit_length: int, *args: Any, **kwargs: Any) -> Any:
                result = real_per_group(block_hashes, max_cache_hit_length, *args, **kwargs)
                spy._lookups.append(LookupRecord(
                    "find_longest_cache_hit_per_group", max_cache_hit_length, tuple(result[1]),
                    spy._owner(block_hashes, result[0]) if any(h > max_cache_hit_length for h in result[1]) else ""))
                return result

            coord.find_longest_cache_hit_per_group = per_group

    def _owner(self, block_hashes: Any, hit: Any) -> str:
        """The live request whose ``block_hashes`` these are; "" where none
        is, or where a block of the ``hit`` (per group) was taken from the
        pool in this same ``schedule()`` (no lookup before it sees the hit)."""
        fresh = {block_id for block_id, *_ in self._fresh}
        if any(block.block_id in fresh for blocks in hit for block in blocks):
            return ""
        return next((r.request_id for r in self.scheduler.requests.values() if r.block_hashes is block_hashes), "")

    def _wrap_manager(self, index: int, stm: Any) -> None:
        spy = self

        real_count = _unpatched(stm, "get_num_blocks_to_allocate")

        def get_num_blocks_to_allocate(*args: Any, **kwargs: Any) -> int:
            n = real_count(*args, **kwargs)
            if spy._rid is not None and spy._counted:
                spy._counted[index] = n
            return n

        def in_group(name: str) -> Callable[..., Any]:
            owner = next(k for k in type(stm).__mro__ if name in k.__dict__).__qualname__
            caller = f"{owner}.{name}"
            real = _unpatched(stm, name)

            def call(*args: Any, **kwargs: Any) -> Any:
                outer = spy._group, spy._caller
                spy._group = index if spy._rid is not None and spy._taken else None
                spy._caller = caller
                try:
                    return real(*args, **kwargs)
                finally:
                    spy._group, spy._caller = outer

            return call

        stm.get_num_blocks_to_allocate = get_num_blocks_to_allocate
        for name in ("add_local_computed_blocks", "allocate_external_computed_blocks", "allocate_new_blocks"):
            if hasattr(type(stm), name):
                setattr(stm, name, in_group(name))

    # -- the observation -----------------------------------------------------
    def observe(
        self,
        step: int,
        out: Any,
        rules: tuple[tuple[str, int], ...],
        sending: Mapping[str, tuple[tuple[int, ...], ...]] | None = None,
        in_flight_step: int | None = None,
    ) -> OwnershipObservation:
        """Block ownership right after ``schedule()`` returned ``out``;
        ``sending``: per producer send in flight, the blocks ``request_finished``
        handed over (the worker reads them until it reports the send done);
        ``in_flight_step``: the step whose output is not fed back yet (async
        scheduling), whose observation this one carries."""
        sched = self.scheduler
        scheduled = dict(out.num_scheduled_tokens) if out is not None else {}
        null = self.null_block_id
        per_request: dict[str, list[tuple[int, ...]]] = {}
        blocks_seen: dict[int, Any] = {}
        managers = self.coordinator.single_type_managers
        for g, stm in enumerate(managers):
            for rid, blocks in stm.req_to_blocks.items():
                row = per_request.setdefault(rid, [()] * len(managers))
                row[g] = tuple(b.block_id for b in blocks)
                for b in blocks:
                    blocks_seen[b.block_id] = b
        pool_blocks = self.pool.blocks
        for bid, _, _ in self._fresh:
            blocks_seen.setdefault(bid, pool_blocks[bid])
        copies = tuple((c.src_block_id, c.dst_block_id) for c in (out.kv_cache_block_copies or ())) if out is not None else ()
        for src, dst in copies:
            blocks_seen.setdefault(src, pool_blocks[src])
            blocks_seen.setdefault(dst, pool_blocks[dst])
        sends = tuple(sorted((rid, tuple(tuple(g) for g in groups)) for rid, groups in (sending or {}).items()))
        for _, groups in sends:
            for g in groups:
                for bid in g:
                    blocks_seen.setdefault(bid, pool_blocks[bid])
        previous = self._last if self._last is not None and self._last.step == in_flight_step else None
        if previous is not None:
            for t in previous.tables:
                if t.num_scheduled:
                    for g in t.tables:
                        for bid in g:
                            blocks_seen.setdefault(bid, pool_blocks[bid])
        blocks_seen.pop(null, None)
        tables = []
        for rid, row in per_request.items():
            req = sched.requests.get(rid)
            n = scheduled.get(rid, 0)
            if req is None:
                status, num_tokens, prompt, computed = "GONE", 0, 0, 0
            else:
                status, num_tokens, prompt = req.status.name, req.num_tokens, req.num_prompt_tokens
                computed = req.num_computed_tokens - n
            tables.append(HeldTable(rid, status, num_tokens, prompt, computed, n, tuple(row)))
        observation = OwnershipObservation(
            step=step,
            groups=self.groups,
            spans=self.spans,
            read_rules=rules,
            null_block_id=null,
            tables=tuple(tables),
            ref_cnt={bid: b.ref_cnt for bid, b in blocks_seen.items()},
            in_free_queue=frozenset(bid for bid, b in blocks_seen.items() if b.prev_free_block is not None),
            cached=frozenset(bid for bid, b in blocks_seen.items() if b.block_hash is not None),
            fresh=tuple(self._fresh),
            copies=copies,
            allocations=tuple(self._allocations),
            lookups=tuple(self._lookups),
            sending=sends,
            in_flight=previous,
            defers_frees=self.defers_frees,
        )
        self._last = dataclasses.replace(observation, in_flight=None)
        return observation
