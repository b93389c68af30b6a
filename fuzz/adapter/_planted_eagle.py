"""A planted EAGLE bug, added to the truncation variants of
:mod:`fuzz.adapter._planted` (:data:`PLANTED_TRUNCATE_BUGS`): it shows the
truncation checks see the EAGLE path the strategies now draw.

The lookup already dropped the EAGLE block; a truncation that drops it again
leaves a drafter's attention group one block short of the endpoint, and
nothing fails. It only differs from vLLM when the manager was built with
``use_eagle``, so only scenarios that speculate can find it.
"""

from __future__ import annotations

from typing import Any

from fuzz.adapter import _compat
from fuzz.adapter._planted import PLANTED_TRUNCATE_BUGS

import vllm.v1.kv_cache_interface as _ki  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager  # noqa: E402

__all__: list[str] = []

_REAL_TRUNCATE = KVCacheManager.truncate_computed_blocks


def _drops_eagle_block_again(self: KVCacheManager, blocks: KVCacheBlocks, n: int) -> KVCacheBlocks:
    result = _REAL_TRUNCATE(self, blocks, n)
    drop = _compat.eagle_drop_group_ids(self.coordinator)
    out: list[list[Any]] = []
    for i, (group_blocks, group) in enumerate(zip(result.blocks, self.kv_cache_config.kv_cache_groups)):
        view = list(group_blocks)
        if i in drop and view and not isinstance(group.kv_cache_spec, _ki.MambaSpec):
            view.pop()
        out.append(view)
    return self.create_kv_cache_blocks(tuple(out))


PLANTED_TRUNCATE_BUGS["eagle_drops_again"] = (
    "re-applies the EAGLE last-block drop to the truncated view (the lookup "
    "already took it): a drafter's attention group comes back one block short",
    _drops_eagle_block_again,
)
