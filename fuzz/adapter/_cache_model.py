"""The harness's own model of the prefix cache: which full-block entries the
index must still file, and so how long a hit every lookup must at least
serve (the claims of ``invariants/cache.py``).

It is kept from what the harness saw, never from vLLM's prefix-cache map:

* filed: each request a ``SchedulerOutput`` schedules has its full blocks
  cached by ``allocate_slots`` up to ``min(num_computed + scheduled,
  request.num_tokens)`` less the coordinator's re-prefillable tokens (MTP),
  cut to a whole scheduler block by the hybrid coordinator unless sub-block
  hits are on (``HybridKVCacheCoordinator.get_num_cacheable_tokens``; an
  EAGLE group may get more), and no further than the request's block
  hashes reach; block ``j`` of a
  group of block size ``b`` under the request's hash at token ``(j + 1) * b``
  (``BlockPool.cache_full_blocks``, ``SingleTypeKVCacheManager.cache_blocks``,
  ``KVCacheCoordinator.get_num_cacheable_tokens``). The tables are the ones
  the output hands the runner.
* dropped: a block ``get_new_blocks`` hands out (an allocation evicts what
  a free cached block held), a block evicted by id (``evict_blocks``: failed
  loads, the search's shortcut), the source of a copy the output makes (a
  partial hit's copy-on-write may move its entries to the copy), and
  everything on a reset that succeeded. The block pool's own watch
  (:class:`fuzz.adapter._evictions.EvictionWatch`) reports those calls as
  they happen. Frees drop nothing.

An entry the model misses (cached by a path it does not follow, such as a
landed async load) only weakens the claims; one it holds must be in the
index. The model is kept only where it is exact: every group full
attention (``FullAttentionManager`` itself, one block pool, no DCP/PCP,
prefix-cacheable) with prefix caching on; partial (sub-block) entries are
not modelled.

With prefix caching off (the draw's ``--no-enable-prefix-caching``, told by
the harness, never read from vLLM's manager) the model files nothing and
the index must stay empty whatever the layout: every entry it holds after
a step is reported (``cached_while_off``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import FullAttentionSpec

from fuzz.adapter._compat import group_of_key, prefix_cache_map
from fuzz.adapter._reports import take_handed_tables
from fuzz.model import AdmissionObservation
from fuzz.model._cache import CachedWhileOff, ForgottenEntry, ShortHit

__all__ = ["CacheModel"]


def _exact(manager: Any) -> bool:
    """The layout is one the model follows exactly."""
    coordinator = manager.coordinator
    if int(getattr(coordinator, "pcp_world_size", 1) or 1) > 1:
        return False
    for group, single in zip(manager.kv_cache_config.kv_cache_groups, coordinator.single_type_managers):
        if type(single) is not FullAttentionManager or not isinstance(group.kv_cache_spec, FullAttentionSpec):
            return False
        if single.block_pool is not manager.block_pool or not getattr(group.kv_cache_spec, "prefix_cacheable", True):
            return False
        if max(int(getattr(single, "dcp_world_size", 1) or 1), int(getattr(single, "pcp_world_size", 1) or 1)) > 1:
            return False
    return True


class CacheModel:
    """The entries one scheduler's index must file. ``watch``: the pool's
    :class:`~fuzz.adapter._evictions.EvictionWatch`; ``step``: the engine
    step now; ``prefix_caching``: whether the engine was started with prefix
    caching (the configuration's flag)."""

    def __init__(self, scheduler: Any, watch: Any, step: Callable[[], int], *, prefix_caching: bool = True) -> None:
        manager = scheduler.kv_cache_manager
        self.caching = prefix_caching
        self.on = prefix_caching and bool(watch.on) and _exact(manager)
        self._watch, self._step = watch, step
        self._pool = manager.block_pool
        self._sizes = tuple(int(m.block_size) for m in manager.coordinator.single_type_managers)
        self._hash_block = int(self._pool.hash_block_size)
        self._reprefill = int(getattr(manager.coordinator, "num_reprefillable_tokens", 0) or 0)
        # The hybrid coordinator files only up to a whole scheduler block
        # unless sub-block hits are on (an EAGLE group may get a block more).
        hybrid = isinstance(manager.coordinator, HybridKVCacheCoordinator)
        partial = bool(getattr(manager.coordinator, "enable_partial_hash_hits", False))
        self._align = int(manager.coordinator.scheduler_block_size) if hybrid and not partial else 1
        self._null = self._pool.null_block.block_id
        # block id -> key -> (request, group, tokens, step) of the entry the model files there.
        self._entries: dict[int, dict[Any, tuple[str, int, int, int]]] = {}
        self._holders: dict[Any, set[int]] = {}  # key -> the blocks the model files under it
        self._tables: dict[str, list[list[int]]] = {}
        self._filed: dict[str, list[int]] = {}  # per request, per group: blocks filed from its table so far
        # Per request a step's schedule() looked up: the model's reach at the lookup.
        self._reaches: dict[str, tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]] = {}
        if self.on:
            self._install(scheduler)

    # -- what the harness saw ---------------------------------------------------
    def _install(self, scheduler: Any) -> None:
        real, model = scheduler.schedule, self

        def schedule() -> Any:
            out = real()
            model._scheduled(out, scheduler.requests)
            return out

        scheduler.schedule = schedule
        manager = scheduler.kv_cache_manager
        for name in ("get_computed_blocks", "get_computed_blocks_for_connector"):
            if hasattr(manager, name):
                setattr(manager, name, self._looking_up(getattr(manager, name)))

    def _looking_up(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """``real`` (a lookup), first noting what the model guarantees it:
        the entries filed by earlier steps that no block handed out or
        evicted since has taken."""
        model = self

        def lookup(request: Any, *args: Any, **kwargs: Any) -> Any:
            model._take_drops()
            model._reaches[request.request_id] = model._reach(request.block_hashes)
            return real(request, *args, **kwargs)

        return lookup

    def _scheduled(self, out: Any, requests: Mapping[str, Any]) -> None:
        """Right after ``schedule()`` returned ``out``: what its allocations
        cached."""
        self._take_drops()
        for copy in getattr(out, "kv_cache_block_copies", None) or ():
            self._drop(copy.src_block_id)
        for rid in take_handed_tables(self._tables, out):
            self._filed[rid] = [0] * len(self._sizes)
        scheduled = out.num_scheduled_tokens
        cached = out.scheduled_cached_reqs
        for new in out.scheduled_new_reqs:
            self._file(new.req_id, new.num_computed_tokens + scheduled.get(new.req_id, 0), requests)
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
            if rid in self._tables:
                self._file(rid, computed + scheduled.get(rid, 0), requests)

    def take(self, admissions: Sequence[AdmissionObservation]) -> dict[str, tuple[Any, ...]]:
        """After the step, the StepObservation fields: every entry the model
        files that the index lacks, and the step's lookups that served less
        than the model guaranteed them."""
        self._take_drops()
        reaches, self._reaches = self._reaches, {}
        if not self.caching:
            return {"cached_while_off": self._cached_while_off()}
        if not self.on:
            return {}
        short = [hit for adm in admissions if (hit := self._short(adm, reaches.get(adm.request_id))) is not None]
        cached = prefix_cache_map(self._pool) or {}
        missing = []
        for block, keys in self._entries.items():
            for key, (rid, group, tokens, step) in keys.items():
                held = cached.get(key)
                if held is None or not (block in held if isinstance(held, dict) else held.block_id == block):
                    missing.append(ForgottenEntry(rid, group, block, tokens, bytes(key[:4]).hex(), step))
        return {"forgotten_entries": tuple(missing), "short_hits": tuple(short)}

    def _cached_while_off(self) -> tuple[CachedWhileOff, ...]:
        """Every entry of the index (prefix caching is off: there must be none)."""
        entries = []
        for key, held in (prefix_cache_map(self._pool) or {}).items():
            for block in held.values() if isinstance(held, dict) else (held,):
                entries.append(CachedWhileOff(group_of_key(key), int(block.block_id), bytes(key[:4]).hex(),
                                              self._step()))
        return tuple(sorted(entries, key=lambda e: (e.group, e.block)))

    # -- the model ----------------------------------------------------------------
    def _file(self, rid: str, computed: int, requests: Mapping[str, Any]) -> None:
        request = requests.get(rid)
        if request is None:
            return
        hashes = request.block_hashes
        cacheable = max(0, min(computed, request.num_tokens) - self._reprefill) // self._align * self._align
        upto = min(cacheable, len(hashes) * self._hash_block)
        filed, tables = self._filed[rid], self._tables[rid]
        for g, (size, table) in enumerate(zip(self._sizes, tables)):
            full = min(upto // size, len(table))
            for j in range(filed[g], full):
                block = table[j]
                if block == self._null:
                    continue
                key = make_block_hash_with_group_id(hashes[(j + 1) * size // self._hash_block - 1], g)
                self._entries.setdefault(block, {})[key] = (rid, g, (j + 1) * size, self._step())
                self._holders.setdefault(key, set()).add(block)
            filed[g] = max(filed[g], full)

    def _take_drops(self) -> None:
        dropped, self._watch.dropped = self._watch.dropped, []
        for block in dropped if self.on else ():
            if block is None:  # a reset that succeeded
                self._entries.clear()
                self._holders.clear()
            else:
                self._drop(block)

    def _drop(self, block: int) -> None:
        for key in self._entries.pop(block, {}):
            holders = self._holders.get(key)
            if holders is not None:
                holders.discard(block)
                if not holders:
                    del self._holders[key]

    def _reach(self, hashes: Sequence[Any]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        """Per group, how far the run of full blocks from token 0 the model
        files under ``hashes`` reaches (tokens), and the blocks holding it."""
        reaches, blocks = [], []
        for g, size in enumerate(self._sizes):
            run: list[int] = []
            while (len(run) + 1) * size <= len(hashes) * self._hash_block:
                key = make_block_hash_with_group_id(hashes[(len(run) + 1) * size // self._hash_block - 1], g)
                holders = self._holders.get(key)
                if not holders:
                    break
                run.append(min(holders))
            reaches.append(len(run) * size)
            blocks.append(tuple(run))
        return tuple(reaches), tuple(blocks)

    @staticmethod
    def _short(adm: AdmissionObservation, reach: Any) -> ShortHit | None:
        """``adm``'s lookup against the hit the model guarantees it: the
        shortest group reach, no longer than the caller's limit, cut to the
        hit alignment, less an EAGLE drop (then cut again). Only for lookups
        the hit-length claim states (``index_hold`` set)."""
        if reach is None or adm.index_hold is None or not adm.hit_alignment or not adm.admitted:
            return None
        reaches, blocks = reach
        align = adm.hit_alignment
        guaranteed = min([*reaches, adm.hit_limit]) // align * align
        guaranteed = max(0, guaranteed - max(adm.hit_drops or (0,))) // align * align
        if adm.local_hit >= guaranteed:
            return None
        return ShortHit(adm.request_id, adm.local_hit, guaranteed, reaches, blocks)
