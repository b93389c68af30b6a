"""How long a prefix-cache hit the index allows one lookup: the rule of the
hit-length claim (``invariants/hits.py`` states it on the harness's
observations).

From the prefix lengths of the request that the index holds an entry for,
per group (``fuzz/adapter/_hits.py`` reads them at the instant of the
lookup), the groups' block sizes, kinds, sliding windows and attention chunks, the hit alignment and the
caller's limit: the longest hit every group serves, with each group's
reach. The rules are ``invariants/hits.py``'s docstring.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["allowed_hit"]


def _eagle_reach(held: frozenset[int], block: int, alignment: int, limit: int, drop: int) -> int:
    """How far one full-attention group of an EAGLE-style drafter serves a
    lookup capped at ``limit``: a length ``n`` only where its entries also
    reach ``n + drop`` (``drop``: one hash unit with sub-block hits on, else
    one block), which proves the token after the hit is the request's own
    (the drafter wrote the KV at the hit's last position with that token);
    the entries past ``limit`` that prove it count."""
    reach = _group_reach(held, block, alignment, limit + drop)
    return max(0, reach - drop) // alignment * alignment if reach else 0


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


def _window_serves(held: frozenset[int], block: int, window: int, alignment: int, limit: int,
                   drop: int = 0) -> set[int]:
    """The prefix lengths one sliding-window group serves, up to ``limit``:
    a whole number of its blocks and of the hit alignment, for which it
    holds each of the last ``ceil((window - 1) / block)`` full blocks before
    it (those the next token's window reads, fewer near token 0); blocks
    further back, out of every later token's window, are not needed. With an
    EAGLE drop (``drop``, one block), also the block after it; without one,
    at least one block (vLLM's search stops on a cached block: a one-token
    window, which reads no block before it, still needs one)."""
    need = -(-(window - 1) // block) if drop else max(1, -(-(window - 1) // block))
    step = block * alignment // _gcd(block, alignment)
    return {n for n in range(step, limit + 1, step)
            if all(k * block in held for k in range(max(1, n // block - need + 1), n // block + 1))
            and (not drop or n + block in held)}


def _chunk_serves(held: frozenset[int], block: int, chunk: int, limit: int) -> set[int]:
    """The prefix lengths one chunked-local group serves, up to ``limit``: a
    whole number of its blocks for which it holds every block from the
    start of the length's last chunk (``L // chunk * chunk``) up to it; the
    blocks of earlier chunks no later token reads (a length at a chunk
    boundary needs none)."""
    return {n for n in range(block, limit + 1, block)
            if all(k * block in held for k in range(n // chunk * chunk // block + 1, n // block + 1))}


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def allowed_hit(
    index_hold: Sequence[Sequence[int]],
    block_sizes: Sequence[int],
    mamba: Sequence[bool],
    alignment: int,
    limit: int,
    divergent_capable: bool,
    windows: Sequence[int] = (),
    chunks: Sequence[int] = (),
    drops: Sequence[int] = (),
) -> tuple[int, tuple[int, ...]] | None:
    """The longest hit the index allows a lookup (``index_hold``: per group,
    the prefix lengths it holds an entry for; ``mamba``: per group, whether
    it is a Mamba group; ``windows``: per group, the sliding window in tokens
    of a sliding-window group, 0 for any other, none given: no window
    group; ``chunks``: likewise the attention chunk of a chunked-local
    group; ``drops``: per group, the tokens an EAGLE-style drafter's drop
    takes off its hit, 0 for a group that does not drop), with each group's
    reach; None where the claim makes no prediction."""
    if alignment <= 0 or not block_sizes:
        return None
    limit = max(limit, 0)
    windows = tuple(windows) or (0,) * len(block_sizes)
    chunks = tuple(chunks) or (0,) * len(block_sizes)
    drops = tuple(drops) or (0,) * len(block_sizes)
    if any(c and (c % b or b != alignment) for c, b in zip(chunks, block_sizes)):
        return None  # a chunk not whole blocks, or a hit alignment vLLM's chunked lookup refuses
    reaches = []
    served: set[int] | None = None  # the lengths every Mamba, sliding-window and chunked-local group serves
    for held, block, is_mamba, window, chunk, drop in zip(index_hold, block_sizes, mamba, windows, chunks, drops):
        if chunk > 0:
            if drop:
                return None  # vLLM's chunked lookup refuses the EAGLE drop
            mine = _chunk_serves(frozenset(held), block, chunk, limit)
        elif window > 0:
            mine = _window_serves(frozenset(held), block, window, alignment, limit, drop)
        elif is_mamba:
            fine = alignment < block and block % alignment == 0
            mine = {n for n in held if n <= limit and n % alignment == 0 and (fine or n % block == 0)}
        elif drop:
            reaches.append(_eagle_reach(frozenset(held), block, alignment, limit, drop))
            continue
        else:
            reaches.append(_group_reach(frozenset(held), block, alignment, limit) // alignment * alignment)
            continue
        served = mine if served is None else served & mine
        reaches.append(max(mine, default=0))
    full = [r for r, is_mamba, window, chunk in zip(reaches, mamba, windows, chunks)
            if not is_mamba and not window and not chunk]
    if served is None:
        return min(reaches), tuple(reaches)
    if divergent_capable and any(mamba):
        # A connector that takes divergent hybrid hits: the local hit is the
        # full-attention group's own, unless a group reaches past it (then
        # the joint hit below).
        if len(full) != 1:
            return None
        if max(reaches) <= full[0]:
            return full[0], tuple(reaches)
    top = min(full) if full else limit
    return max((n for n in served if n <= top), default=0), tuple(reaches)
