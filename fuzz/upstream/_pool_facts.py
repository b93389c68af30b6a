"""The fact subjects of block ownership, KV events, stale outputs and
leaks, registered in :data:`fuzz.upstream._facts.SUBJECTS` beside the
others (same ``Context``, same assertion form).

Subjects (their ``args``):

* ``num-tokens`` (request, why): the request's ``num_tokens`` after the
  step's ``update_from_output()``;
* ``free-blocks`` (): the block pool's free count (``get_num_free_blocks()``);
* ``ref-cnt`` (block): the block's ``ref_cnt``;
* ``removed-event`` (request, tokens, group, block): the block pool's
  queued KV events hold a ``BlockRemoved`` of the request's key over its
  first ``tokens`` tokens (expected True: the index dropped it; ``block``:
  the block the step evicted it with, or None);
* ``cleared-event`` (): the queued KV events hold an ``AllBlocksCleared``
  (expected True: a reset succeeded);
* ``stored-parent`` (request, tokens): the ``BlockStored`` event that
  announces the request's key over its first ``tokens`` tokens first names
  as ``parent_block_hash`` the key of its first ``expected`` tokens;
* ``cache-hit`` (request): the hit ``get_computed_blocks`` finds for the
  waiting request (its ``num_computed_tokens`` answer), before the step's
  ``schedule()`` looks it up (``after="before"``);
* ``counted-blocks`` (request, counted per group, taken per group): what
  the coordinator's ``get_num_blocks_to_allocate`` counted for the
  request's ``allocate_slots`` in the step (recorded from the start:
  :data:`POOL_SETUPS`);
* ``copied-block`` (reader, source, destination, writer, how): the step's
  ``kv_cache_block_copies`` copy the source block into the reader's
  destination block (expected False: the writer writes the source in the
  same step, ``how``, and the model runner applies copies first).
"""

from __future__ import annotations

import dataclasses

from fuzz.model import Fact
from fuzz.upstream._file import Context
from fuzz.upstream._file import assert_lines as _assert

__all__ = ["POOL_PRELUDES", "POOL_SETUPS", "POOL_SUBJECTS", "STORED_EVENTS"]

_POOL = "scheduler.kv_cache_manager.block_pool"

# Each announced key's BlockStored event and place in it (vLLM publishes them after the step).
STORED_EVENTS: tuple[list[str], tuple[tuple[str, str], ...]] = (
    [
        "    announced = {",
        "        key: (event, i)",
        "        for event in scheduler.kv_cache_manager.block_pool.kv_event_queue",
        "        if isinstance(event, BlockStored)",
        "        for i, key in enumerate(event.block_hashes)",
        "    }",
    ],
    (("vllm.distributed.kv_events", "BlockStored"), ("vllm.v1.core.kv_cache_utils", "maybe_convert_block_hash")),
)


def _num_tokens(fact: Fact, ctx: Context) -> list[str] | None:
    rid, why = fact.args
    return _assert(f"{ctx.names[rid]}.num_tokens", fact, (
        f"step {ctx.step}: {rid} has {fact.observed} tokens after update_from_output, though {why}: it keeps "
        f"{fact.expected}"))


def _free_blocks(fact: Fact, ctx: Context) -> list[str] | None:
    return _assert(f"{_POOL}.get_num_free_blocks()", fact, (
        f"after step {ctx.step}, with every request finished, the pool has {fact.observed} free blocks: every "
        f"block but the null block ({fact.expected}) is free again"))


def _ref_cnt(fact: Fact, ctx: Context) -> list[str] | None:
    (block,) = fact.args
    return _assert(f"{_POOL}.blocks[{block}].ref_cnt", fact, (
        f"after step {ctx.step}, with every request finished, block {block} keeps ref_cnt={fact.observed}: no "
        f"request holds it, so it must be {fact.expected}"))


def _removed_event(fact: Fact, ctx: Context) -> list[str] | None:
    rid, tokens, group, block = fact.args
    k = ctx.key_index(tokens, group)
    if k is None or fact.expected is not True or len(ctx.block_sizes) != 1:
        return None
    what = (f"schedule() evicted block {block}, which held {rid}'s first {tokens} tokens" if block is not None
            else f"the prefix cache no longer files {rid}'s first {tokens} tokens")
    return _assert(f"maybe_convert_block_hash({ctx.names[rid]}.block_hashes[{k}]) in removed", fact, (
        f"step {ctx.step}: {what} (group {group}), but the step's KV events hold no BlockRemoved for that "
        "key: a router replaying them keeps routing to a hit that is gone"))


def _cleared_event(fact: Fact, ctx: Context) -> list[str] | None:
    if fact.expected is not True:
        return None
    return _assert("any(isinstance(event, AllBlocksCleared) for event in queued)", fact, (
        f"step {ctx.step}: reset_prefix_cache() emptied the prefix cache before this step, but the KV events "
        "queued since hold no AllBlocksCleared: a router replaying them keeps every block it was told of"))


def _stored_parent(fact: Fact, ctx: Context) -> list[str] | None:
    rid, tokens = fact.args
    parent = fact.expected
    k = ctx.key_index(tokens, 0)
    kp = ctx.key_index(parent, 0) if isinstance(parent, int) else None  # type: ignore[arg-type]
    if k is None or kp is None or len(ctx.block_sizes) != 1:
        return None
    named = "its own key" if fact.observed == tokens else (
        f"the key of its first {fact.observed} tokens" if fact.observed else "a key no event announced")
    read = f"event.parent_block_hash == maybe_convert_block_hash({ctx.names[rid]}.block_hashes[{kp}])"
    return [f"    event, _ = announced[maybe_convert_block_hash({ctx.names[rid]}.block_hashes[{k}])]"] + _assert(
        read, dataclasses.replace(fact, expected=True), (
            f"step {ctx.step}: the BlockStored event announcing {rid}'s block over tokens "
            f"[{tokens - ctx.block_sizes[0]}, {tokens}) names as parent_block_hash {named}, not the key of its "
            f"first {parent} tokens, announced before it: a router cannot hang the block under its prefix"))


def _cache_hit(fact: Fact, ctx: Context) -> list[str] | None:
    (rid,) = fact.args
    return [f"    num_hit = scheduler.kv_cache_manager.get_computed_blocks({ctx.names[rid]})[1]"] + _assert(
        "num_hit", fact, (
            f"step {ctx.step}: the prefix-cache lookup of {rid} hits {fact.observed} tokens of its prompt; the hit stops before the last prompt token, at most "
            f"{fact.expected}, so that the step computes at least one token"))


def _counted_blocks(fact: Fact, ctx: Context) -> list[str] | None:
    rid, counted, taken = fact.args
    return _assert(f'counted["{rid}"]', fact, (
        f"step {ctx.step}: get_num_blocks_to_allocate counted {fact.observed} block(s) for {rid}'s allocate_slots "
        f"(per group {list(counted)}), which then took {fact.expected} from the pool (per group {list(taken)}): a "
        "pool holding exactly the count runs dry"))


def _copied_block(fact: Fact, ctx: Context) -> list[str] | None:
    reader, src, dst, writer, how = fact.args
    if fact.expected is not False:
        return None
    return _assert(f"({src}, {dst}) in {{(c.src_block_id, c.dst_block_id) for c in {ctx.output}.kv_cache_block_copies}}",
                   fact, (f"step {ctx.step}: {reader}'s copy-on-write copies block {src} into block {dst}, but {writer} "
                          f"writes block {src} in the same step ({how}): the model runner applies a step's copies "
                          "before its forward pass, so the copy reads KV not written yet"))


POOL_SUBJECTS = {
    "num-tokens": _num_tokens,
    "free-blocks": _free_blocks,
    "ref-cnt": _ref_cnt,
    "removed-event": _removed_event,
    "cleared-event": _cleared_event,
    "stored-parent": _stored_parent,
    "cache-hit": _cache_hit,
    "counted-blocks": _counted_blocks,
    "copied-block": _copied_block,
}

# The keys the step's queued BlockRemoved events withdraw.
POOL_PRELUDES: dict[str, tuple[list[str], tuple[tuple[str, str], ...]]] = {
    "removed-event": ([
        "    removed = [",
        "        key",
        f"        for event in {_POOL}.kv_event_queue",
        "        if isinstance(event, BlockRemoved)",
        "        for key in event.block_hashes",
        "    ]",
    ], (("vllm.distributed.kv_events", "BlockRemoved"), ("vllm.v1.core.kv_cache_utils", "maybe_convert_block_hash"))),
    "cleared-event": ([f"    queued = {_POOL}.kv_event_queue"], (("vllm.distributed.kv_events", "AllBlocksCleared"),)),
    # Each announced key's BlockStored event (the stored-event subject's).
    "stored-parent": STORED_EVENTS,
}

# What a subject's facts read that the test records from the start: lines
# right after the scheduler is built.
POOL_SETUPS: dict[str, list[str]] = {
    # The count allocate_slots' free-block check compares with the pool (the
    # whole-sequence admission gate counts with apply_admission_cap).
    "counted-blocks": [
        "    counted = {}  # request id -> what the coordinator counted for its allocate_slots",
        "    count = scheduler.kv_cache_manager.coordinator.get_num_blocks_to_allocate",
        "",
        "    def counting(request_id, **kwargs):",
        "        num_blocks = count(request_id=request_id, **kwargs)",
        '        if not kwargs.get("apply_admission_cap"):',
        "            counted[request_id] = num_blocks",
        "        return num_blocks",
        "",
        "    scheduler.kv_cache_manager.coordinator.get_num_blocks_to_allocate = counting",
    ],
}
