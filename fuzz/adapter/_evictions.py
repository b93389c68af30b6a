"""Which cached blocks the block pool evicts, and how every free block came
back to it: the harness side of the eviction-order claim
(``invariants/hits.py``).

:class:`EvictionWatch` wraps, on the *instances* of one scheduler's block
pool and single-type managers (classes untouched, so planted bugs apply;
built after the ownership spy, it wraps that spy's wrappers):

* ``BlockPool.free_blocks``: each block whose last reference the call drops
  comes back to the pool, recorded with the step, its prefix-cache keys at
  that moment and, inside a request's free of one group (each manager's
  ``free``), the request, the group and the block's place in the table
  read as that free began;
* ``BlockPool.touch``: a free block a prefix-cache hit adopts leaves the pool;
* ``BlockPool.get_new_blocks``: every block handed out leaves the pool; one
  the prefix-cache index named just before the call is an eviction,
  recorded with every block still free right after it was taken;
* ``BlockPool.reset_prefix_cache``: every free block keeps, where it lies
  in the free queue, only the keys the index still files under it (none,
  after a reset that succeeded).

It also lists (``dropped``) every block handed out, every block
``BlockPool.evict_blocks`` is asked to evict, and each reset that
succeeded: the events that let the cache model (``_cache_model.py``)
forget an entry.

Which blocks are free is the watch's own model: those free when it starts,
plus those freed since, less those handed out or adopted. It never reads
the pool's free queue. With prefix caching off (no key, so no eviction) or
an index it cannot read, it watches nothing.

vLLM's objects and the standard library only; where a vLLM release keeps
the prefix-cache map, and a key's group, the caller says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from fuzz.model._evictions import Eviction, FreedBlock

__all__ = ["EvictionWatch"]


def _key_text(key: Any, block: Any, group_of: Callable[[Any], int], base: str | None = None) -> str:
    """One prefix-cache key filed under ``block``, as "g<group>:<hash>"
    (``base``, where known) and "@<tokens>" for the key the block carries as
    its own hash."""
    text = base or f"g{group_of(key)}:{bytes(key[:-4])[:4].hex()}"
    if block.block_hash == key and getattr(block, "block_hash_num_tokens", None) is not None:
        text += f"@{block.block_hash_num_tokens}"
    return text


def _keys_by_block(cached: dict[Any, Any], group_of: Callable[[Any], int]) -> dict[int, tuple[str, ...]]:
    """Per block id, the prefix-cache keys the index ``cached`` (key ->
    block, or block id -> block) files under it (:func:`_key_text`)."""
    found: dict[int, list[str]] = {}
    for key, blocks in cached.items():
        for block in blocks.values() if isinstance(blocks, dict) else (blocks,):
            found.setdefault(block.block_id, []).append(_key_text(key, block, group_of))
    return {bid: tuple(sorted(keys)) for bid, keys in found.items()}


class _KeysByBlock:
    """Which keys the prefix-cache index files under each block, kept up to
    date from the keys the index map's own ``insert`` and ``pop`` touched
    (each re-read from the map itself) instead of a walk over the whole map
    at every free and allocation. A key's text (:func:`_key_text`) reads
    its block when asked, as the walk did. A map that is rebound (a reset)
    or cannot be wrapped (a plain dict) is read whole, as before."""

    def __init__(self, pool: Any, index: Callable[[Any], dict[Any, Any] | None], group_of: Callable[[Any], int]) -> None:
        self._pool, self._index, self._group_of = pool, index, group_of
        self._touched: set[Any] = set()
        self._map: dict[Any, Any] | None = None  # the map read last
        self._wrapped: Any = None  # the map object whose insert and pop report here
        self._blocks: dict[Any, dict[int, Any]] = {}  # key -> block id -> block
        self._keys: dict[int, set[Any]] = {}  # block id -> keys
        self._base: dict[Any, str] = {}  # key -> "g<group>:<hash>"

    def sync(self) -> None:
        cached = self._index(self._pool) or {}
        holder = getattr(self._pool, "cached_block_hash_to_block", None)
        if self._wrapped is None or cached is not self._map or holder is not self._wrapped:
            self._read_whole(cached, holder)
            return
        touched, self._touched = self._touched, set()
        for key in touched:
            for bid in self._blocks.pop(key, {}):
                self._keys[bid].discard(key)
            if key in cached:
                self._file(key, cached[key])

    def _file(self, key: Any, blocks: Any) -> None:
        filed = self._blocks[key] = dict(blocks) if isinstance(blocks, dict) else {blocks.block_id: blocks}
        if key not in self._base:
            self._base[key] = f"g{self._group_of(key)}:{bytes(key[:-4])[:4].hex()}"
        for bid in filed:
            self._keys.setdefault(bid, set()).add(key)

    def _read_whole(self, cached: dict[Any, Any], holder: Any) -> None:
        self._map, self._touched, self._blocks, self._keys, self._base = cached, set(), {}, {}, {}
        for key, blocks in cached.items():
            self._file(key, blocks)
        self._wrapped = holder if holder is not None and self._wrap(holder) else None

    def _wrap(self, holder: Any) -> bool:
        insert, pop = getattr(holder, "insert", None), getattr(holder, "pop", None)
        if isinstance(holder, dict) or insert is None or pop is None:
            return False
        def wrapped_insert(key: Any, *args: Any, **kwargs: Any) -> Any:
            self._touched.add(key)
            return insert(key, *args, **kwargs)

        def wrapped_pop(key: Any, *args: Any, **kwargs: Any) -> Any:
            self._touched.add(key)
            return pop(key, *args, **kwargs)

        holder.insert, holder.pop = wrapped_insert, wrapped_pop
        return True

    def of(self, block_id: int) -> tuple[str, ...]:
        """The keys filed under ``block_id`` as of the last :meth:`sync`."""
        keys = self._keys.get(block_id)
        if not keys:
            return ()
        texts = [_key_text(k, self._blocks[k][block_id], self._group_of, self._base[k]) for k in keys]
        return tuple(sorted(texts)) if len(texts) > 1 else tuple(texts)

    def everything(self) -> dict[int, tuple[str, ...]]:
        """Every block's keys, as :func:`_keys_by_block` reads them whole."""
        return {bid: self.of(bid) for bid, keys in self._keys.items() if keys}


class EvictionWatch:
    """The recording wrappers for one scheduler; :meth:`take` after each
    step hands over the evictions seen since the last one. ``step``: the
    engine step now; ``index``: the block pool's prefix-cache map (None
    where it cannot be read); ``group_of``: a key's KV-cache group."""

    def __init__(
        self,
        scheduler: Any,
        step: Callable[[], int],
        index: Callable[[Any], dict[Any, Any] | None],
        group_of: Callable[[Any], int],
    ) -> None:
        self.pool = scheduler.kv_cache_manager.block_pool
        self._step = step
        self._index, self._group_of = index, group_of
        self.judged = 0  # evictions recorded so far
        self._evictions: list[Eviction] = []
        # The request free in progress: (request, group, block id -> table index, release number).
        self._freeing: tuple[str, int, dict[int, int], int] | None = None
        self._releases = 0
        # Inside get_new_blocks: block id -> its keys just before the pool evicted them.
        self._evicting: dict[int, tuple[str, ...]] | None = None
        # Block ids handed out or evicted by id, in order, and None for each
        # reset that succeeded: what the cache model (_cache_model.py) drops.
        self.dropped: list[int | None] = []
        cached = index(self.pool)
        self.on = self._on = bool(getattr(self.pool, "enable_caching", False)) and cached is not None
        if not self._on:
            self.free: dict[int, FreedBlock] = {}
            return
        self._filed = _KeysByBlock(self.pool, index, group_of)
        self._filed.sync()
        self.free = {
            b.block_id: FreedBlock(b.block_id, 0, self._filed.of(b.block_id))
            for b in self.pool.blocks
            if not b.is_null and b.ref_cnt == 0
        }
        self._install(scheduler.kv_cache_manager.coordinator.single_type_managers)

    def take(self) -> tuple[Eviction, ...]:
        found, self._evictions = tuple(self._evictions), []
        return found

    # -- wrappers ------------------------------------------------------------
    def _install(self, managers: Iterable[Any]) -> None:
        pool, watch = self.pool, self
        real_free, real_touch, real_new, real_reset = pool.free_blocks, pool.touch, pool.get_new_blocks, pool.reset_prefix_cache
        real_evict = getattr(pool, "evict_blocks", None)

        def free_blocks(ordered_blocks: Iterable[Any]) -> None:
            blocks = list(ordered_blocks)  # the order vLLM passes, kept
            real_free(blocks)
            watch._came_back(blocks)

        def touch(blocks: Any) -> Any:
            for b in blocks:
                if not b.is_null and b.ref_cnt == 0:
                    watch.free.pop(b.block_id, None)
            return real_touch(blocks)

        def get_new_blocks(num_blocks: int) -> Any:
            watch._filed.sync()  # what each block held before the call (not synced again inside it)
            watch._evicting = {}
            try:
                blocks = real_new(num_blocks)
            finally:
                held, watch._evicting = watch._evicting, None
            watch.dropped.extend(b.block_id for b in blocks)
            for b in blocks:
                freed = watch.free.pop(b.block_id, None)
                # Read as the block was before its keys went, where the pool's
                # own eviction step showed it; else as it is now.
                lost = held[b.block_id] if b.block_id in held else watch._filed.of(b.block_id)
                if lost and freed is not None:
                    watch.judged += 1
                    watch._evictions.append(Eviction(watch._step(), freed, lost, tuple(watch.free.values())))
            return blocks

        def reset_prefix_cache() -> bool:
            done = real_reset()
            if done:
                watch.dropped.append(None)
            watch._filed.sync()  # after a reset that succeeded, no key is left
            watch.free = {bid: dataclasses.replace(freed, keys=watch._filed.of(bid)) for bid, freed in watch.free.items()}
            return done

        pool.free_blocks, pool.touch, pool.get_new_blocks = free_blocks, touch, get_new_blocks
        pool.reset_prefix_cache = reset_prefix_cache

        real_drop = getattr(pool, "_maybe_evict_cached_block", None)

        def maybe_evict_cached_block(block: Any) -> Any:
            if watch._evicting is not None:
                watch._evicting[block.block_id] = watch._filed.of(block.block_id)
            return real_drop(block)

        if real_drop is not None:
            pool._maybe_evict_cached_block = maybe_evict_cached_block

        def evict_blocks(block_ids: set[int]) -> None:
            watch.dropped.extend(sorted(block_ids))
            real_evict(block_ids)

        if real_evict is not None:
            pool.evict_blocks = evict_blocks
        for group, manager in enumerate(managers):
            self._wrap_free(group, manager)

    def _wrap_free(self, group: int, manager: Any) -> None:
        watch, real = self, manager.free

        def free(request_id: str) -> Any:
            table = manager.req_to_blocks.get(request_id, ())
            outer = watch._freeing
            watch._releases += 1
            where = {b.block_id: i for i, b in enumerate(table) if not b.is_null}
            watch._freeing = (request_id, group, where, watch._releases)
            try:
                return real(request_id)
            finally:
                watch._freeing = outer

        manager.free = free

    def _came_back(self, blocks: list[Any]) -> None:
        """Record the blocks of a ``free_blocks`` call whose last reference it dropped."""
        pool_blocks = self.pool.blocks
        back = [
            b for b in blocks
            if not b.is_null and b.ref_cnt == 0 and b.block_id < len(pool_blocks) and pool_blocks[b.block_id] is b
        ]
        if not back:
            return
        self._filed.sync()
        keys, step, freeing = {b.block_id: self._filed.of(b.block_id) for b in back}, self._step(), self._freeing
        for b in back:
            if freeing is not None and b.block_id in freeing[2]:
                rid, group, where, release = freeing
                record = FreedBlock(b.block_id, step, keys.get(b.block_id, ()), rid, group, where[b.block_id], release)
            else:
                record = FreedBlock(b.block_id, step, keys.get(b.block_id, ()))
            self.free[b.block_id] = record
