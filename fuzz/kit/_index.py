"""What a standalone repro watches of the prefix-cache index's names.

After each step's loads and forward pass (WATCH_INDEX, on the contents
model): each entry of the index whose block holds, at positions its key
covers inside it, the KV of another position or another token than the
key's prefix. What a key stands for is learnt from the hashes the
scheduler's requests carry over their tokens, never from the cache.
"""

from __future__ import annotations

from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id

from fuzz.adapter._contents import all_entries_of
from fuzz.model._contents import MisnamedEntry


def _misnamed_entries(scheduler, contents, keys):
    """Each index entry whose block holds other KV where its key says
    (MisnamedEntry, as the suite orders them)."""
    for rid, request in scheduler.requests.items():
        keys.learn(rid, request.block_hashes, request.all_token_ids, contents.namespaces.get(rid, ""))
    cached = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block._cache
    found = []
    for group, block_id, block_hash, _ in all_entries_of(cached, lambda key: (get_group_id(key), get_block_hash(key))):
        rid, tokens = keys.prefix.get(block_hash, ("", ()))
        wrong = contents.misnamed(group, block_id, tokens, rid)
        if wrong:
            found.append(MisnamedEntry(group, block_id, bytes(block_hash).hex()[:12], rid, len(tokens), tuple(wrong)))
    return sorted(found, key=lambda e: (e.group, e.block_id, e.key))
