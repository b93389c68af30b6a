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

Standard library only.
Events are read by their class name and fields, as a consumer decoding the
published batch would.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["EventLog", "IndexTally", "event_gaps", "index_counts", "watch_map"]


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
        # The (group, key)s whose count changed since the last take_touched().
        self.touched: set[tuple[int | None, Any]] = set()

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
                self.touched.update(self.counts)
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
                    self.touched.add((event.group_idx, key))
            elif kind == "BlockRemoved":
                for key in event.block_hashes:
                    # Kept even when it goes negative: a withdrawal of a key
                    # never announced is itself a disagreement.
                    self.counts[(event.group_idx, key)] -= 1
                    self.touched.add((event.group_idx, key))
            else:
                raise ValueError(f"unknown KV event {kind}: {event!r}")

    def take_touched(self) -> set[tuple[int | None, Any]]:
        """The (group, key)s replayed since the last call."""
        touched, self.touched = self.touched, set()
        return touched

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


class IndexTally:
    """:func:`event_gaps` of the replayed counts against the index, without
    walking the index each step: only the keys that may have changed since the
    last call are compared. Those are the keys events touched, the keys the
    index map's own ``insert`` / ``pop`` touched (wrapped on the map object,
    so an index change no event announced is seen too), and the keys that
    disagreed last time (a gap stands until something changes it). A new map
    object (a reset replaces it) puts every key of the old and the new map in
    play; a map whose size differs from the keys seen in it (written some way
    other than ``insert`` / ``pop``) is walked whole, as is a map that cannot
    be wrapped. What it reports equals ``event_gaps(announced,
    index_counts(cached, key_of))``.

    ``key_of(key)``: (group, the key as events spell it); remembered per key
    (keys are immutable)."""

    def __init__(self, key_of: Any) -> None:
        self._key_of = key_of
        self._names: dict[Any, tuple[int, Any]] = {}  # map key -> event key
        self._keys: dict[tuple[int, Any], set[Any]] = {}  # event key -> map keys
        self._holder: Any = None  # the map object wrapped
        self._touched: set[Any] = set()  # map keys insert/pop touched since the last call
        self._present: set[Any] = set()  # map keys the map held at the last look
        self._standing: set[tuple[int | None, Any]] = set()  # event keys that disagreed last call

    def _name(self, key: Any) -> tuple[int, Any]:
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = self._key_of(key)
            self._keys.setdefault(name, set()).add(key)
        return name

    def gaps(self, announced: Mapping[tuple[int | None, Any], int], replayed: Iterable[tuple[int | None, Any]],
             holder: Any, cached: Mapping[Any, Any]) -> list[tuple[int | None, Any, int, tuple[int, ...]]]:
        """The gaps now: ``announced`` the replayed counts, ``replayed`` the
        event keys replayed since the last call, ``holder`` the index map
        object, ``cached`` its key -> block(s) dict."""
        whole = self._holder is None
        if holder is not self._holder:
            # First look, or a reset put a new map in place of the old one.
            self._touched.update(self._present)
            self._touched.update(cached)
            self._holder = holder if watch_map(holder, self._touched) else None
            whole = self._holder is None
        candidates = set(self._standing)
        candidates.update(replayed)
        present = self._present
        for key in self._touched:
            candidates.add(self._name(key))
            if key in cached:
                present.add(key)
            else:
                present.discard(key)
        self._touched.clear()
        if whole or len(present) != len(cached):
            present.clear()
            present.update(cached)
            candidates.update(map(self._name, cached))
            candidates.update(announced)
        found = []
        for name in candidates:
            blocks: list[int] = []
            for key in self._keys.get(name, ()):  # type: ignore[arg-type]
                held = cached.get(key)
                if held is not None:
                    blocks.extend(b.block_id for b in (held.values() if isinstance(held, dict) else (held,)))
            count = announced.get(name, 0)
            if count != len(blocks):
                found.append((name[0], name[1], count, tuple(sorted(blocks))))
        self._standing = {(g, k) for g, k, _, _ in found}
        found.sort(key=lambda gap: repr((gap[0], gap[1])))
        return found


def watch_map(holder: Any, touched: set[Any]) -> bool:
    """Wraps the ``insert`` and ``pop`` of the prefix-cache map object
    ``holder`` (vLLM's BlockHashToBlockMap) on the object itself, so each key
    they are called with lands in ``touched``; False where it has no such
    methods (a plain dict), and nothing is wrapped."""
    insert, pop = getattr(holder, "insert", None), getattr(holder, "pop", None)
    if holder is None or isinstance(holder, dict) or insert is None or pop is None:
        return False

    def wrapped_insert(key: Any, *args: Any, **kwargs: Any) -> Any:
        touched.add(key)
        return insert(key, *args, **kwargs)

    def wrapped_pop(key: Any, *args: Any, **kwargs: Any) -> Any:
        touched.add(key)
        return pop(key, *args, **kwargs)

    holder.insert, holder.pop = wrapped_insert, wrapped_pop
    return True
