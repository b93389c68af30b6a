"""What a KV-event consumer reads of each announced block, judged against
what the harness knows that block holds.

A router that keeps a tree of a replica's cached prefixes reads, of each
block a ``BlockStored`` event announces, more than its key: its tokens
(``token_ids``, ``block_size`` per key), the adapter it was computed under
(``lora_id``, ``lora_name``), the rest of what its hash folds in
(``extra_keys``, published untagged: the LoRA name, each multimodal item's
``(identifier, offset in the block)``, the cache salt on a request's first
block, a prompt-embeddings digest, in that order; see vLLM's
``BlockStored`` and ``to_event_extra_keys``) and the tier (``medium``).

The expected values come from the harness's own records, not from vLLM's
pool: which request's prefix a key stands for (``KeyPrefixes``: the hashes
the harness saw its requests carry), that request's tokens up to there,
and what the harness added it with (``AddRequest``: cache salt, LoRA
adapter, images and where they sit, prompt embeddings).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fuzz.adapter._contents import KeyPrefixes, lora_identity
from fuzz.adapter._events import EventLog
from fuzz.model import AddRequest, EventPayload

__all__ = ["PayloadJudge", "PayloadLog", "StoredBlock", "expected_extra_keys", "stored_blocks"]

MEDIUM = "GPU"  # the scheduler's block pool is the device tier (vLLM's MEDIUM_GPU)


class _Digest:
    """Where a prompt-embeddings digest goes: any bytes (the harness does
    not hash tensors)."""

    def __repr__(self) -> str:
        return "<prompt-embeddings digest>"


_DIGEST = _Digest()


def expected_extra_keys(add: AddRequest, start: int, end: int) -> tuple[Any, ...] | None:
    """The untagged extra keys of ``add``'s block of tokens ``[start, end)``
    (``end`` past the block where the hash looks ahead), as
    ``generate_block_hash_extra_keys`` and ``to_event_extra_keys`` document
    them; ``_DIGEST`` where a prompt-embeddings digest goes."""
    keys: list[Any] = [add.lora] if add.lora else []
    keys += [(name, offset - start) for name, offset, length in sorted(add.mm, key=lambda m: m[1])
             if end > offset and start < offset + length]
    keys += [add.cache_salt] if add.cache_salt and start == 0 else []
    keys += [_DIGEST] if add.embeds is not None else []
    return tuple(keys) or None


def _same_keys(announced: tuple[Any, ...] | None, expected: tuple[Any, ...] | None) -> bool:
    if announced is None or expected is None:
        return announced is expected
    return len(announced) == len(expected) and all(
        isinstance(a, bytes) if e is _DIGEST else a == e for a, e in zip(announced, expected)
    )


@dataclasses.dataclass(frozen=True)
class StoredBlock:
    """One block of a ``BlockStored`` event as a consumer reads it: the
    event's ``i``-th key, its parent (the key before it in the event, or the
    event's ``parent_block_hash`` for the first), and its slice of the
    event's ``token_ids`` (``token_ids[i * block_size:(i + 1) * block_size]``:
    the event carries one list for all its blocks); None where the event's
    tokens are not ``block_size`` per key (a sparse group's event carries
    the tokens of the blocks it skips as well). The rest is the event's
    (``extra_keys``: this block's entry)."""

    group: int | None
    key: Any
    parent: Any
    index: int  # its place in the event
    tokens: tuple[int, ...] | None
    block_size: int
    lora_id: int | None
    lora_name: str | None
    extra_keys: tuple[Any, ...] | None
    medium: str | None


def stored_blocks(event: Any) -> list[StoredBlock]:
    """The blocks a ``BlockStored`` event announces, as a consumer reads them."""
    keys = list(event.block_hashes)
    size, tokens = event.block_size, list(event.token_ids)
    per_key = len(tokens) == size * len(keys)
    extra = getattr(event, "extra_keys", None)
    blocks = []
    for i, key in enumerate(keys):
        keys_i = extra[i] if extra is not None and i < len(extra) else None
        blocks.append(StoredBlock(
            event.group_idx, key, keys[i - 1] if i else event.parent_block_hash, i,
            tuple(tokens[i * size:(i + 1) * size]) if per_key else None, size,
            getattr(event, "lora_id", None), getattr(event, "lora_name", None),
            None if keys_i is None else tuple(keys_i), getattr(event, "medium", None),
        ))
    return blocks


class PayloadLog(EventLog):
    """The replay with what a router keeps of each block besides its count:
    ``tree``, (group, key) -> the block the last ``BlockStored`` of that key
    announced, while the key is announced (a ``BlockRemoved`` of its last
    announcement and ``AllBlocksCleared`` drop it); and the blocks announced
    since the last :meth:`take_stored`."""

    def __init__(self) -> None:
        super().__init__()
        self.tree: dict[tuple[int | None, Any], StoredBlock] = {}
        self.stored: list[StoredBlock] = []

    def replay(self, events: Iterable[Any]) -> None:
        for event in events:
            super().replay((event,))
            kind = type(event).__name__
            if kind == "AllBlocksCleared":
                self.tree.clear()
            elif kind == "BlockStored":
                for block in stored_blocks(event):
                    self.tree[(block.group, block.key)] = block
                    self.stored.append(block)
            else:
                for key in event.block_hashes:
                    if self.counts[(event.group_idx, key)] <= 0:
                        self.tree.pop((event.group_idx, key), None)

    def take_stored(self) -> list[StoredBlock]:
        """The blocks announced since the last call, in publishing order."""
        stored, self.stored = self.stored, []
        return stored


class PayloadJudge:
    """Judges announced blocks for one harness: ``block_sizes`` per group,
    ``sparse`` per group (it caches only some blocks of a request, so its
    events may carry tokens of blocks they skip), the pool's hash block size
    and hash lookahead, ``external`` a block hash as events spell it."""

    def __init__(self, block_sizes: Sequence[int], sparse: Sequence[bool], hash_block_size: int, lookahead: int,
                 external: Callable[[Any], Any]) -> None:
        self.block_sizes, self.sparse = tuple(block_sizes), tuple(sparse)
        self.hash_block_size, self.lookahead = hash_block_size, lookahead
        self._external = external
        self._by_external: dict[Any, Any] = {}  # external key -> the hash KeyPrefixes files it under
        self._learned = 0  # KeyPrefixes entries converted so far (it only grows)
        self._adds: dict[str, AddRequest] = {}  # the harness's requests, by id
        self._ops_seen = 0

    def _hash_of(self, keys: KeyPrefixes, key: Any) -> Any:
        prefix = keys.prefix
        if len(prefix) > self._learned:
            for block_hash in itertools.islice(prefix, self._learned, None):
                self._by_external.setdefault(self._external(block_hash), block_hash)
            self._learned = len(prefix)
        return self._by_external.get(key)

    def payloads(self, blocks: Iterable[StoredBlock], keys: KeyPrefixes | None,
                 ops: Sequence[Any]) -> tuple[EventPayload, ...]:
        """Each field of each of ``blocks`` that is not what the harness
        knows of its block (``ops``: the harness's op log, its AddRequests
        read); a key no request the harness saw carried, or one whose
        request it did not add, is not judged."""
        for op in itertools.islice(ops, self._ops_seen, None):
            if isinstance(op, AddRequest):
                self._adds[op.request_id] = op
        self._ops_seen = len(ops)
        adds = self._adds
        found = []
        for b in blocks:
            block_hash = None if keys is None else self._hash_of(keys, b.key)
            if block_hash is None or b.group is None or not 0 <= b.group < len(self.block_sizes):
                continue
            rid, prefix = keys.prefix[block_hash]  # type: ignore[union-attr]
            add = adds.get(rid)
            if add is None:
                continue
            n, size = len(prefix), self.block_sizes[b.group]
            # A partial entry (a key inside a group block) carries the tokens
            # past its parent: one hash block.
            sizes = {self.hash_block_size} if n % size else {size}
            if not n % size and b.index == 0 and self.sparse[b.group]:
                sizes.add(self.hash_block_size)  # a sparse group's state cached at an aligned boundary
            own = b.block_size if b.block_size in sizes else min(sizes)
            start = max(n - own, 0)  # where the block's own tokens start
            wrong: list[tuple[str, object, object]] = []
            if b.block_size not in sizes:
                wrong.append(("block_size", b.block_size, own))
            if b.tokens is None:
                if not self.sparse[b.group]:
                    wrong.append(("token_ids", "not block_size tokens per key", tuple(prefix[start:n])))
            elif b.tokens != tuple(prefix[start:n]):
                wrong.append(("token_ids", b.tokens, tuple(prefix[start:n])))
            lora = lora_identity(add.lora) if add.lora else None
            wrong += [
                ("lora_name", b.lora_name, lora and lora[0]),
                ("lora_id", b.lora_id, lora and lora[1]),
                ("medium", b.medium, MEDIUM),
            ]
            want_keys = expected_extra_keys(add, start, n + self.lookahead)
            if not _same_keys(b.extra_keys, want_keys):
                wrong.append(("extra_keys", b.extra_keys, want_keys))
            found += [EventPayload(b.group, b.key, b.index, rid, n, field, got, want)
                      for field, got, want in wrong if field in ("block_size", "token_ids", "extra_keys") or got != want]
        return tuple(found)
