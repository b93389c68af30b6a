"""Which cached blocks the block pool evicts under pressure: the model side
of the eviction-order claim (``invariants/hits.py``).

The harness (``fuzz/adapter/_evictions.py``) keeps, per free block, how it
came back to the pool (:class:`FreedBlock`), and records every cached block
an allocation takes from the pool (:class:`Eviction`) with the blocks still
free at that moment. It never reads the pool's free queue: the order the
claim holds them to is derived from these records alone: the partial
order's rules (:func:`reused_before`, stated in ``invariants/hits.py``'s
docstring) and the evictions that break it (:func:`evicted_out_of_order`).

Standard library only.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Eviction", "FreedBlock", "describe_out_of_order", "evicted_out_of_order", "reused_before"]


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


def reused_before(c: FreedBlock, b: FreedBlock) -> str | None:
    """The rule by which vLLM's free order reuses free block ``c`` before
    ``b``, a block that came back cached; None where the partial order
    does not say (``b`` came back with no key, or the two are unordered)."""
    if not b.keys or c.block == b.block:
        return None
    if not c.keys:
        return "(a) a block with no key is reused before any that came back cached"
    if c.step < b.step:
        return f"(c) it came back cached at an earlier step ({c.step} < {b.step})"
    same_free = c.release is not None and c.release == b.release
    if same_free and c.index is not None and b.index is not None and c.index > b.index:
        return f"(b) the same free of request {c.request}'s group {c.group} frees table index {c.index} before {b.index}"
    return None


def evicted_out_of_order(evictions: tuple[Eviction, ...]) -> list[tuple[Eviction, list[tuple[FreedBlock, str]]]]:
    """Each eviction that left free a block the free order puts ahead of the
    one it evicted, with those blocks and the rule that puts each ahead."""
    found = []
    for ev in evictions:
        ahead = [(c, why) for c in ev.survivors if (why := reused_before(c, ev.freed)) is not None]
        if ahead:
            found.append((ev, ahead))
    return found


def describe_out_of_order(found: list[tuple[Eviction, list[tuple[FreedBlock, str]]]]) -> str:
    """:func:`evicted_out_of_order`'s findings, one eviction a paragraph
    (at most six blocks ahead of it each)."""
    paragraphs = []
    for ev, ahead in found:
        lines = [f"  {ev.describe()}"]
        lines += [f"    still free, ahead of it: {c.describe()}: {why}" for c, why in ahead[:6]]
        if len(ahead) > 6:
            lines.append(f"    ... and {len(ahead) - 6} more")
        paragraphs.append("\n".join(lines))
    return "\n".join(paragraphs)
