"""What a standalone repro watches of the prefix-cache index's names, and its claim.

After each step's loads and forward pass (WATCH_INDEX, on the contents
model): each entry of the index whose block holds, at positions its key
covers inside it, the KV of another position or another token than the
key's prefix. What a key stands for is learnt from the hashes the
scheduler's requests carry over their tokens, never from the cache.
"""

from __future__ import annotations

from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id

from fuzz.adapter._contents import all_entries_of
from fuzz.kit._build import _describe_groups


def _misnamed_entries(scheduler, contents, keys):
    """(group, block, the request whose prefix the key is, tokens the key
    covers, [(position, the key's token, what the block holds there)]) for
    each index entry whose block holds other KV where its key says."""
    for rid, request in scheduler.requests.items():
        keys.learn(rid, request.block_hashes, request.all_token_ids)
    cached = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block._cache
    found = []
    for group, block_id, block_hash, _ in all_entries_of(cached, lambda key: (get_group_id(key), get_block_hash(key))):
        rid, tokens = keys.prefix.get(block_hash, ("", ()))
        wrong = contents.misnamed(group, block_id, tokens)
        if wrong:
            found.append((group, block_id, rid, len(tokens), wrong))
    return found


def _check_index_names_its_prefix(scheduler, out, watch, step):
    """The index names what it holds: as a step runs, every key of the
    prefix-cache index names a block whose KV, where the block holds any at
    the positions the key covers, is that of the key's own prefix. A block
    reused for other tokens leaves no key of its old prefix behind."""
    assert not watch.misnamed, (
        f"step {step}: a prefix-cache key names a block holding other KV: (group, block, the request whose "
        f"prefix the key is, tokens the key covers, [(position, the key's token, what the block holds there: "
        f"(position, step written, token))]): {watch.misnamed}; groups: {_describe_groups()}"
    )
