"""The eviction watch's view of which keys the index files under each block
(``_KeysByBlock`` in fuzz/adapter/_evictions.py), kept from the keys the
map's own insert and pop touched, is at every step what a whole walk of
the index finds: on fixed runs that evict, reset and keep stale keys, with
and without the planted bugs that break the index."""

from __future__ import annotations

from typing import Any

import pytest

from fuzz.adapter import FIXED_RUNS, _compat, planted_scheduler_bug
from fuzz.adapter._evictions import EvictionWatch, _keys_by_block
from fuzz.runners.scheduler import run_fixed


@pytest.mark.parametrize(("run", "bug"), [("eviction_announces_nothing", None), ("reset_keeps_index", None),
                                          ("reset_keeps_index", "reset_keeps_index"),
                                          ("evicted_key_stays_indexed", "evicted_key_stays_indexed"),
                                          ("free_forgets_keys", "free_forgets_keys"),
                                          ("free_evicts_head_first", "free_evicts_head_first")])
def test_the_kept_view_is_the_whole_walk_at_every_step(monkeypatch: pytest.MonkeyPatch, run: str, bug: str | None) -> None:
    real = EvictionWatch.take
    compared = []

    def take(self: EvictionWatch) -> Any:
        if self.on:
            self._filed.sync()
            whole = _keys_by_block(_compat.prefix_cache_map(self.pool) or {}, _compat.group_of_key)
            compared.append((self._filed.everything() == whole, len(whole)))
        return real(self)

    monkeypatch.setattr(EvictionWatch, "take", take)
    try:
        if bug is None:
            run_fixed(FIXED_RUNS[run], ())
        else:
            with planted_scheduler_bug(bug):
                run_fixed(FIXED_RUNS[run], ())
    except AssertionError:  # the plant is caught (a claim, or the run's own expected hits)
        assert bug is not None
    assert len(compared) >= 3 and any(n for _, n in compared)
    assert all(same for same, _ in compared), [i for i, (same, _) in enumerate(compared) if not same]
