"""Which reads of the contents model need no second look.

A step reads, for every running request, every position its groups' rules
say it reads below where it starts (``BlockContents.unread``): for full
attention the whole context, every step. Whether a block holds a
position's KV depends only on the block's contents and on what the reader
computed there, so a read of the same positions of a block whose contents
have not changed since a read that found them all, by the same request
under the same prefix, finds them all again. :class:`CleanReads` keeps,
per (request, group, block), the last such read; the reader's identity at
its last position is the whole-prefix digest there (``_identity.py``),
which names every token and the namespace before it, so a request whose
earlier tokens changed (a rejected draft) is read again.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CleanReads", "read_runs"]


def read_runs(rule: tuple[str, int], start: int, prompt: int) -> list[range]:
    """The positions below ``start`` whose KV a step computing from
    ``start`` reads in a group with read ``rule`` (see
    ``fuzz.adapter._ownership.read_rules``), as runs of consecutive
    positions: every one (full attention), the last W - 1 (a sliding
    window of W), those of ``start``'s chunk (chunked local attention), the
    prompt and the last W (R-SWA); none for a state or scratch group."""
    kind, value = rule
    if kind == "full":
        return [range(start)]
    if kind == "window":
        return [range(max(0, start - value + 1), start)]
    if kind == "chunk":
        return [range(start // value * value, start)]
    if kind == "rswa":
        head = min(prompt, start)
        return [range(head), range(max(head, start - value), start)]
    return []


class CleanReads:
    """Per (request, group, block id): (the block's change count, the first
    and one past the last position, the reader's identity at the last) of
    the last read that found every position there."""

    def __init__(self) -> None:
        self._changes: dict[int, int] = {}
        self._clean: dict[tuple[str, int, int], tuple[int, int, int, object]] = {}

    def changed(self, block_id: int) -> None:
        """The model changed what ``block_id`` holds (a write, a load, a copy)."""
        self._changes[block_id] = self._changes.get(block_id, 0) + 1

    def forget(self, key: tuple[str, int, int]) -> None:
        """The read of ``key`` just made did not find everything."""
        self._clean.pop(key, None)

    def unseen(self, key: tuple[str, int, int], runs: Sequence[range], tokens: Sequence[int],
               digests: Sequence[int] | None) -> list[int]:
        """Of the positions in ``runs`` (ascending runs of consecutive
        positions) of the read ``key``, those the last clean read of the
        unchanged block under the same prefix did not cover; the read is
        recorded as clean (:meth:`forget` undoes it)."""
        runs = [r for r in runs if r]
        if len(runs) != 1:  # not one run of positions: read them all
            return [p for r in runs for p in r]
        lo, hi = runs[0].start, runs[0].stop

        def identity(p: int) -> object:
            if digests is not None and p < len(digests):
                return digests[p]
            return tokens[p] if p < len(tokens) else None

        changes = self._changes.get(key[2], 0)
        last = self._clean.get(key)
        self._clean[key] = (changes, lo, hi, identity(hi - 1))
        if last is None or last[0] != changes or not last[1] <= lo <= last[2] or identity(last[2] - 1) != last[3]:
            return list(range(lo, hi))
        if hi <= last[2]:
            self._clean[key] = last
            return []
        self._clean[key] = (changes, last[1], hi, identity(hi - 1))
        return list(range(last[2], hi))
