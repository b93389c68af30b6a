"""What a KV-event consumer learns of the prefix cache, replayed from the
events vLLM publishes, beside what the index holds.

A KV-aware router builds its picture of a replica's prefix cache from the
``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared`` events the engine
core publishes after each ``update_from_output()``; it never sees the block
pool. The contract it depends on: replaying the events reproduces the index.
vLLM's index is a multimap (two blocks may hold the same key, e.g. the same
prompt computed twice before either was cached), and each block that takes
a key is announced once and each that loses it is withdrawn once, so the
replay counts announcements per (group, key).

Standard library only: a standalone repro carries this file's source.
Events are read by their class name and fields, as a consumer decoding the
published batch would.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["EventLog", "event_gaps", "index_counts"]


class EventLog:
    """Stands in for the scheduler's event publisher: takes each published
    batch and keeps the replayed picture (announcements per (group, key)).

    ``events_seen`` counts every event by kind (a test can tell a draw that
    published nothing from one whose replay agreed)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[int | None, Any]] = Counter()
        self.events_seen: Counter[str] = Counter()
        # BlockStored events whose parent_block_hash no event replayed before
        # announces in their group (a router that hangs each announced block
        # under its parent cannot place them): (group, parent, the first key
        # announced, tokens the event carries, its block_size). Taken by the
        # caller (take_orphans).
        self.orphans: list[tuple[int | None, Any, Any, int, int]] = []

    # The publisher's interface, as Scheduler calls it.
    def publish(self, batch: Any) -> None:
        self.replay(batch.events)

    def shutdown(self) -> None:
        pass

    def replay(self, events: Iterable[Any]) -> None:
        for event in events:
            kind = type(event).__name__
            self.events_seen[kind] += 1
            if kind == "AllBlocksCleared":
                self.counts.clear()
            elif kind == "BlockStored":
                # (The orphan's record is one statement: a file that reads
                # no orphans drops it, and its test, whole.)
                if event.parent_block_hash is not None and self.counts[(event.group_idx, event.parent_block_hash)] <= 0:
                    self.orphans.append((event.group_idx, event.parent_block_hash,
                                         event.block_hashes[0] if event.block_hashes else None,
                                         len(event.token_ids), event.block_size))
                for key in event.block_hashes:
                    self.counts[(event.group_idx, key)] += 1
            elif kind == "BlockRemoved":
                for key in event.block_hashes:
                    # Kept even when it goes negative: a withdrawal of a key
                    # never announced is itself a disagreement.
                    self.counts[(event.group_idx, key)] -= 1
            else:
                raise ValueError(f"unknown KV event {kind}: {event!r}")

    def take_orphans(self) -> list[tuple[int | None, Any, Any, int, int]]:
        """The orphaned BlockStored events replayed since the last call."""
        orphans, self.orphans = self.orphans, []
        return orphans


def index_counts(cached: Mapping[Any, Any], key_of: Any) -> dict[tuple[int, Any], list[int]]:
    """(group, external key) -> the ids of the blocks the prefix-cache map
    ``cached`` (key -> block, or key -> {block id: block}) files under it,
    full and partial entries alike; ``key_of(key)`` gives (group, the key as
    events spell it)."""
    found: dict[tuple[int, Any], list[int]] = {}
    for key, blocks in cached.items():
        for block in blocks.values() if isinstance(blocks, dict) else (blocks,):
            found.setdefault(key_of(key), []).append(block.block_id)
    return found


def event_gaps(
    announced: Mapping[tuple[int | None, Any], int], indexed: Mapping[tuple[int, Any], list[int]]
) -> list[tuple[int | None, Any, int, tuple[int, ...]]]:
    """Each (group, key, announcements, block ids) where the replayed count
    differs from the number of blocks the index files under that key."""
    gaps = []
    for group, key in sorted(set(announced) | set(indexed), key=repr):
        blocks = tuple(sorted(indexed.get((group, key), ())))  # type: ignore[arg-type]
        count = announced.get((group, key), 0)
        if count != len(blocks):
            gaps.append((group, key, count, blocks))
    return gaps
