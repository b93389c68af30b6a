"""How long a prefix-cache hit the index allows one lookup: the rule of the
hit-length claim (``invariants/hits.py`` states it on the harness's
observations; standalone repro files carry this module's source and state
it on vLLM's own objects).

From the prefix lengths of the request that the index holds an entry for,
per group (``fuzz/adapter/_hits.py`` reads them at the instant of the
lookup), the groups' block sizes and kinds, the hit alignment and the
caller's limit: the longest hit every group serves, with each group's
reach. The rules are ``invariants/hits.py``'s docstring.

Standard library only: standalone repro files carry this module's source.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["allowed_hit"]


def _group_reach(held: frozenset[int], block: int, alignment: int, limit: int) -> int:
    """How far one full-attention group's entries take a lookup capped at ``limit``."""
    full = 0
    while full + block <= limit and full + block in held:
        full += block
    if alignment < block and block % alignment == 0:  # sub-block hits: the first block past the full run
        tails = [n for n in held if full < n < full + block and n <= limit]
        if tails:
            return max(tails)
    return full


def allowed_hit(
    index_hold: Sequence[Sequence[int]],
    block_sizes: Sequence[int],
    mamba: Sequence[bool],
    alignment: int,
    limit: int,
    divergent_capable: bool,
) -> tuple[int, tuple[int, ...]] | None:
    """The longest hit the index allows a lookup (``index_hold``: per group,
    the prefix lengths it holds an entry for; ``mamba``: per group, whether
    it is a Mamba group), with each group's reach; None where the claim
    makes no prediction."""
    if alignment <= 0 or not block_sizes:
        return None
    limit = max(limit, 0)
    reaches = []
    states: set[int] | None = None  # the lengths every Mamba group holds a state for
    for held, block, is_mamba in zip(index_hold, block_sizes, mamba):
        if not is_mamba:
            reaches.append(_group_reach(frozenset(held), block, alignment, limit) // alignment * alignment)
            continue
        fine = alignment < block and block % alignment == 0
        mine = {n for n in held if n <= limit and n % alignment == 0 and (fine or n % block == 0)}
        states = mine if states is None else states & mine
        reaches.append(max(mine, default=0))
    if states is None:
        return min(reaches), tuple(reaches)
    if divergent_capable:
        # A connector that takes divergent hybrid hits: the local hit is the
        # full-attention group's own, unless a group reaches past it (then
        # the joint hit below).
        full = [r for r, is_mamba in zip(reaches, mamba) if not is_mamba]
        if len(full) != 1:
            return None
        if max(reaches) <= full[0]:
            return full[0], tuple(reaches)
    top = min(r for r, is_mamba in zip(reaches, mamba) if not is_mamba) if not all(mamba) else limit
    return max((n for n in states if n <= top), default=0), tuple(reaches)
