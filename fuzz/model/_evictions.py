"""Which cached blocks the block pool evicts under pressure: the model side
of the eviction-order claim (``invariants/hits.py``).

The harness (``fuzz/adapter/_evictions.py``) keeps, per free block, how it
came back to the pool (:class:`FreedBlock`), and records every cached block
an allocation takes from the pool (:class:`Eviction`) with the blocks still
free at that moment. It never reads the pool's free queue: the order the
claim holds them to is derived from these records alone.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Eviction", "FreedBlock"]


@dataclasses.dataclass(frozen=True)
class FreedBlock:
    """A block as the pool took it back (its last reference dropped), or as
    it was free when the harness started watching (``step`` 0).

    ``keys``: its prefix-cache keys at that moment ("g<group>:<hash>", with
    ``@<tokens>`` for the key it carries as its own hash), empty for a block
    that never served a hit. ``request``, ``group``, ``index`` and
    ``release``: set when the block left with a request's free of one group
    (``SingleTypeKVCacheManager.free``): the request, the group, the block's
    place in that request's table as the free began, and which free it was
    (one number per such call); None when another path freed it (a window
    or Mamba group dropping blocks a running request no longer reads, a
    copy's retention, a deferred free)."""

    block: int
    step: int
    keys: tuple[str, ...] = ()
    request: str | None = None
    group: int | None = None
    index: int | None = None
    release: int | None = None

    def describe(self) -> str:
        how = "free from the start" if self.step == 0 else f"freed at step {self.step}"
        if self.request is not None:
            how += f" by request {self.request}'s free of group {self.group} (table index {self.index})"
        elif self.step:
            how += " outside a request's free"
        keys = f"keys {list(self.keys)}" if self.keys else "no key"
        return f"block {self.block} ({how}, {keys})"


@dataclasses.dataclass(frozen=True)
class Eviction:
    """A cached block ``BlockPool.get_new_blocks`` handed out, dropping its
    prefix-cache keys, at ``step``: ``freed`` is how it had come back to the
    pool, ``keys`` the keys it lost, ``survivors`` every other block still
    free right after it was taken (the blocks the same call hands out after
    it included), each as it came back."""

    step: int
    freed: FreedBlock
    keys: tuple[str, ...]
    survivors: tuple[FreedBlock, ...]

    def describe(self) -> str:
        lost = "" if self.keys == self.freed.keys else f", losing keys {list(self.keys)}"
        return (
            f"step {self.step}: get_new_blocks evicted {self.freed.describe()}{lost}; "
            f"{len(self.survivors)} other block(s) still free"
        )
