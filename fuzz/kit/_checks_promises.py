"""The claims a standalone repro states of what the prefix cache promises
(:mod:`invariants.promises`'s): hits stay within a cache salt, the drafter's
lookahead is allocated, KV events replay to the index (a preemption's
claim is in :mod:`fuzz.kit._preempt`, with what it watches).

Called as ``check(scheduler, out, watch, step)`` like every kit check
(:mod:`fuzz.kit._checks_scheduler`).
"""

from __future__ import annotations

from fuzz.kit._build import _describe_groups
from fuzz.kit._params import READ_RULES, SPECS


def _check_hits_within_namespace(scheduler, out, watch, step):
    """Isolation: every block a request adopts from the prefix cache as
    computed (the local blocks handed to allocate_slots) was last written
    for a request of the same namespace: the same cache_salt, LoRA adapter
    and prompt embeddings (none is a namespace of its own), and the same
    images placed in the adopted prefix. vLLM folds them into the block
    hashes, and every later hash chains on them, so no lookup may cross
    namespaces."""
    hits = [
        f"request {rid} (namespace {mine!r}) adopted block {block} of group {g} {type(SPECS[g]).__name__} "
        f"(block_size={SPECS[g].block_size}) as computed (adopted {watch.admissions[rid]['adopted'][g]}), last "
        f"written for a request of namespace {theirs!r}"
        for rid, mine, g, block, theirs in watch.foreign
    ]
    assert not hits, (
        f"step {step}: a prefix-cache hit crosses namespaces (cache_salt, 'lora:' adapter, 'embeds:' prompt "
        f"embeddings, 'mm:' image@placeholder offset, as far as the hit reaches; '' for none): " + "; ".join(hits)
        + f"; a tenant is served another tenant's KV; groups: {_describe_groups()}"
    )


def _check_hits_after_reset(scheduler, out, watch, step):
    """After a reset_prefix_cache() that succeeded, no request adopts from
    the prefix cache, as computed, a position whose KV was computed before
    the reset: the reset exists to invalidate the cache (RLHF flows call it
    after a weight update)."""
    hits = [
        f"request {rid} adopted block {block} of group {g} {type(SPECS[g]).__name__} holding position {position}'s "
        f"KV computed at step {written}"
        for rid, g, block, position, written in watch.across_reset
    ]
    assert not hits, (
        f"step {step}: a prefix-cache hit serves KV computed before the reset that preceded step "
        f"{watch.reset_before}: " + "; ".join(hits) + f"; groups: {_describe_groups()}"
    )


def _check_lookahead_allocated(scheduler, out, watch, step):
    """A drafter with its own forward pass (EAGLE) writes KV
    num_lookahead_tokens positions past each step it drafts from: for each
    request whose step reaches its end, every per-position group's table
    handed to the runner already covers min(num_computed_tokens + scheduled
    + lookahead, max_model_len) positions, or the drafter writes into
    blocks the request does not own."""
    short = [
        f"request {rid}: group {g} {type(SPECS[g]).__name__} (block_size={SPECS[g].block_size}) table covers "
        f"{covered} positions, but num_computed_tokens={computed} + {n} scheduled + lookahead "
        f"{scheduler.num_lookahead_tokens} needs {needed} (max_model_len={scheduler.max_model_len})"
        for rid, g, computed, n, needed, covered in watch.short_tables
    ]
    assert not short, (
        f"step {step}: the drafter writes past the blocks allocated: " + "; ".join(short)
        + f"; groups: {_describe_groups()}"
    )


def _check_events_replay_index(scheduler, out, watch, step):
    """After update_from_output() published the step's KV events, replaying
    every BlockStored, BlockRemoved and AllBlocksCleared so far counts,
    under each (group, key), as many blocks as the prefix-cache index files
    there: a KV-aware router never reads the block pool, only the events."""
    assert not watch.event_gaps, (
        f"step {step}: the replayed KV events disagree with the prefix-cache index at (group, key, blocks the "
        f"events announce, block ids the index files there): {watch.event_gaps}; events seen so far: "
        f"{dict(watch.events.events_seen)}; a router routes to hits that are gone, or never to hits that are "
        f"there; groups: {_describe_groups()}"
    )


def _check_events_chain(scheduler, out, watch, step):
    """In a group that caches every block of a request (full attention), every
    BlockStored event the step published names as parent_block_hash a key
    the events before it announce in that group: a router that keeps the
    cache as a tree of prefixes hangs each block under its parent."""
    orphans = [o for o in watch.event_orphans if o[0] is not None and READ_RULES[o[0]][0] == "full"]
    assert not orphans, (
        f"step {step}: BlockStored events name a parent no event before them announced, as (group, parent, "
        f"first key announced, tokens, block_size): {orphans}; a router cannot place these blocks; groups: "
        f"{_describe_groups()}"
    )
