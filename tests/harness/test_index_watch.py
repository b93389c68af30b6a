"""The contents model judges only the prefix-cache entries that may need it
(fuzz/adapter/_index_watch.py): every entry a whole walk of the index finds
is either judged right already or judged again at the next step."""

from __future__ import annotations

from typing import Any

import pytest

from fuzz.adapter import FIXED_RUNS, _compat, planted_scheduler_bug
from fuzz.adapter._contents import all_entries_of
from fuzz.adapter._runner import ScriptedRunner
from fuzz.runners.scheduler import run_fixed


@pytest.mark.parametrize(("run", "bug"), [("eviction_announces_nothing", None), ("reset_keeps_index", None),
                                          ("evicted_key_stays_indexed", None),
                                          ("evicted_key_stays_indexed", "evicted_key_stays_indexed")])
def test_no_entry_of_the_index_goes_unjudged(monkeypatch: pytest.MonkeyPatch, run: str, bug: str | None) -> None:
    real = ScriptedRunner.index_entries
    looked = []

    def index_entries(self: ScriptedRunner, pool: Any, *args: Any) -> Any:
        found = real(self, pool, *args)
        cached = _compat.prefix_cache_map(pool)
        standing = {self._split(key) for key in self._index_changes._standing}
        for group, block_id, block_hash, n in all_entries_of(cached or {}, self._split):
            done = self._judged_right.get(block_id, ())
            judged = (group, block_hash) in done and (n is None or (group, n) in done)
            assert judged or (group, block_hash) in standing, (group, block_id, n)
            looked.append(judged)
        return found

    monkeypatch.setattr(ScriptedRunner, "index_entries", index_entries)
    if bug is None:
        run_fixed(FIXED_RUNS[run], ())
    else:
        with planted_scheduler_bug(bug):
            run_fixed(FIXED_RUNS[run], ())
    assert any(looked)
