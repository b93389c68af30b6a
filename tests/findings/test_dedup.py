"""Deduplication by vLLM's own location (fuzz/campaign/findings.py).

A distinct failure is the invariant plus, when vLLM raised, the exception
type and vLLM's three innermost frames (the ClusterFuzz crash state), or,
when an invariant broke on a result, the vLLM function whose result broke
it. Planted cases: two different exceptions (types, or places in vLLM) never
merge; one bug reached through two targets is one entry listing both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fuzz.campaign.findings import Findings, crash_state
from fuzz.campaign.totals import Totals
from fuzz.model import InvariantViolation

POOL = ("vllm/v1/core/block_pool.py:BlockPool.get_new_blocks",
        "vllm/v1/core/kv_cache_manager.py:KVCacheManager.allocate_slots",
        "vllm/v1/core/sched/scheduler.py:Scheduler.schedule")
TRUNCATE = ("vllm/v1/core/kv_cache_manager.py:KVCacheManager.truncate_computed_blocks",
            "vllm/v1/core/sched/scheduler.py:Scheduler.schedule")


def _raised(exception: str, frames: tuple[str, ...], invariant: str = "no-exception") -> InvariantViolation:
    # The message names our own failing line; it must not matter.
    return InvariantViolation(invariant, f"schedule() raised {exception}", where="Scheduler.schedule",
                              exception=exception, frames=frames)


START = time.time()  # one campaign start for every worker here


def _findings(tmp_path: Path, worker: str = "w") -> Findings:
    return Findings(repro_dir=tmp_path, start=START, campaign_seed=0, worker=worker, vllm_version="0.33.0")


def test_two_different_vllm_exceptions_are_two_entries() -> None:
    a, b = _raised("ValueError", POOL), _raised("AssertionError", TRUNCATE)
    c = _raised("AssertionError", POOL)  # same place, another type
    assert len({crash_state(a), crash_state(b), crash_state(c)}) == 3
    assert crash_state(a) == "no-exception|ValueError|" + " < ".join(POOL)


def test_only_the_three_innermost_frames_count() -> None:
    outer = ("vllm/v1/engine/core.py:EngineCore.step",)
    assert crash_state(_raised("ValueError", POOL + outer)) == crash_state(_raised("ValueError", POOL))


def test_a_violated_invariant_is_keyed_by_the_vllm_function_that_broke_it() -> None:
    a = InvariantViolation("computed-adds-up", "numbers A", where="Scheduler.schedule")
    b = InvariantViolation("computed-adds-up", "other numbers", where="Scheduler.schedule")
    c = InvariantViolation("no-leaked-blocks", "x", where="KVCacheManager.free")
    assert crash_state(a) == crash_state(b) == "computed-adds-up|Scheduler.schedule"
    assert crash_state(c) != crash_state(a)


def test_a_raw_exception_is_keyed_by_its_own_vllm_frames(tmp_path: Path) -> None:
    # Code compiled under a vLLM-looking file name stands for vLLM's frames.
    source = "def get_new_blocks():\n    raise ValueError('Cannot get 1 free blocks')\n"
    namespace: dict = {}
    exec(compile(source, str(tmp_path / "site-packages/vllm/v1/core/block_pool.py"), "exec"), namespace)
    with pytest.raises(ValueError) as caught:
        namespace["get_new_blocks"]()
    assert crash_state(caught.value) == "ValueError|ValueError|vllm/v1/core/block_pool.py:get_new_blocks"


def test_one_bug_through_two_targets_is_one_entry_listing_both(tmp_path: Path) -> None:
    findings = _findings(tmp_path)
    first = findings.record("scheduler-single-shot", 1, _raised("AssertionError", TRUNCATE))
    assert first is not None
    assert findings.record("scheduler-machine", 2, _raised("AssertionError", TRUNCATE)) is None
    assert findings.known("scheduler-any-layout", _raised("AssertionError", TRUNCATE))
    other = findings.record("scheduler-machine", 3, _raised("ValueError", POOL))
    assert other is not None and other["key"] != first["key"]
    sidecars = sorted(tmp_path.glob("*.json"))
    assert len(sidecars) == 2
    metas = {m["key"]: m for m in (json.loads(p.read_text()) for p in sidecars)}
    assert metas[first["key"]]["targets"] == ["scheduler-single-shot", "scheduler-machine", "scheduler-any-layout"]
    assert metas[other["key"]]["targets"] == ["scheduler-machine"]


def test_workers_and_runners_merge_one_bug_into_one_entry(tmp_path: Path) -> None:
    a = _findings(tmp_path / "a", "a").record("scheduler-single-shot", 1, _raised("AssertionError", TRUNCATE))
    time.sleep(0.01)
    b = _findings(tmp_path / "b", "b").record("scheduler-machine", 1, _raised("AssertionError", TRUNCATE))
    assert a is not None and b is not None and a["key"] == b["key"]
    total = Totals(failures=[b]).merge(Totals(failures=[a]))
    (entry,) = total.failures
    assert entry["worker"] == "a"  # the earlier finding is kept
    assert entry["targets"] == ["scheduler-single-shot", "scheduler-machine"]
    # Two workers writing one repro directory keep one sidecar with both targets.
    shared = tmp_path / "shared"
    _findings(shared, "a").record("scheduler-single-shot", 1, _raised("AssertionError", TRUNCATE))
    _findings(shared, "b").record("scheduler-machine", 1, _raised("AssertionError", TRUNCATE))
    (sidecar,) = shared.glob("*.json")
    assert json.loads(sidecar.read_text())["targets"] == ["scheduler-single-shot", "scheduler-machine"]
