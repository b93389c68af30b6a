"""What a standalone repro watches of how long a hit each lookup serves and
which cached blocks survive pool pressure, for :mod:`invariants.hits`'s
claims (whose checks the file carries as they are: each lookup is kept as
a HitLookup), with the suite's own rules: the hit the index allows
(``fuzz/model/_hits.py``), the index read at the instant of the lookup
(``fuzz/adapter/_hits.py``), vLLM's free order (``fuzz/model/_evictions.py``)
and the watch of every free and eviction (``fuzz/adapter/_evictions.py``),
all carried by the file as they are.

A lookup shorter than the index allows, and an eviction out of the free
order, are missed hits: performance bugs (cached tokens recomputed), not
wrong results; a lookup longer than the index allows reads blocks the
index does not hold for the prefix (a violation).
"""

from __future__ import annotations

import dataclasses

from vllm.v1.core.kv_cache_utils import get_group_id

from fuzz.adapter._evictions import EvictionWatch
from fuzz.adapter._hits import index_hold
from fuzz.kit._build import _describe_groups
from fuzz.kit._params import ROLES, SPECS
from fuzz.model._kv import GroupInfo


@dataclasses.dataclass(frozen=True)
class HitLookup:
    """One local prefix-cache lookup as the suite's hit claim reads an
    admission (``check_hit_matches_index``): the AdmissionObservation's
    fields it reads, under the same names (tests/findings/test_repro_kit.py
    holds them to it)."""

    request_id: str
    step: int
    local_hit: int
    groups: tuple  # GroupInfo per group
    divergent_capable: bool
    index_hold: tuple | None = None
    hit_alignment: int = 0
    hit_limit: int = 0
    hit_windows: tuple = ()
    hit_chunks: tuple = ()
    hit_drops: tuple = ()

    def describe(self):
        return (
            f"request {self.request_id}'s lookup at step {self.step}: prefix lengths the index held per group "
            f"{[list(g) for g in self.index_hold or ()]}"
            + (f", EAGLE drop per group {list(self.hit_drops)}" if any(self.hit_drops) else "")
            + f"; groups: {_describe_groups()}"
        )


def _groups():
    """Each group as the suite describes it (GroupInfo)."""
    return tuple(
        GroupInfo(index=g, spec_class=f"{type(spec).__module__}.{type(spec).__qualname__}", inner_classes=(),
                  block_size=spec.block_size, prefix_cacheable=role != "scratch")
        for g, (spec, role) in enumerate(zip(SPECS, ROLES))
    )


def _prefix_cache_map(pool):
    """The block pool's prefix-cache index: key -> block (or block id -> block)."""
    return pool.cached_block_hash_to_block._cache


def _index_at_lookup(manager, request, max_cache_hit_length):
    """Per group, the prefix lengths of ``request`` the index holds an entry
    for, the hit alignment and the lookup's limit, read as the lookup
    begins (empty where the claim makes no prediction)."""
    partial = bool(getattr(manager.coordinator, "enable_partial_hash_hits", False))
    return index_hold(manager, request, max_cache_hit_length, _prefix_cache_map(manager.block_pool), partial)


def _watch_frees(scheduler, watch):
    """How every free block came back to the pool, and each cached block an
    allocation evicts (with the blocks still free then): the suite's watch."""
    return EvictionWatch(scheduler, lambda: watch.step, _prefix_cache_map, get_group_id)

