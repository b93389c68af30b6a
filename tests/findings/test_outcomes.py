"""Three outcomes, never confused: each class has planted cases.

A planted piece of vLLM code is compiled under the vLLM file it would live
in, so its frames are vLLM's, exactly as an edit of vLLM's source would be;
planted suite code lives in this file, so its frames are the suite's.
"""

from __future__ import annotations

import inspect
import textwrap

import pytest

from fuzz import adapter, telemetry
from fuzz.model import ExternalReply, HarnessError, InvariantViolation, LayoutDraw, SchedulerDraw, SpecDraw
from fuzz.outcomes import REFUSALS, ConfigRejected, Outcome, classify, started, vllm_calls
from fuzz.runners.scheduler import build_harness
from fuzz.runners.truncation import run_truncation_scenario
from fuzz.model import EndpointRule, TruncationScenario

import vllm.v1.core.single_type_kv_cache_manager as stkm
import vllm.v1.kv_cache_interface as ki
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.scheduler import Scheduler

VERSION = adapter.VLLM_VERSION


def _in_vllm(module, owner: str, source: str, name: str):
    """Method ``name`` of class ``owner`` as ``source`` defines it, compiled
    as if it were in ``module``'s file (so its frames read ``owner.name``)."""
    namespace = dict(vars(module))
    body = f"class {owner}:\n" + textwrap.indent(textwrap.dedent(source), "    ")
    exec(compile(body, inspect.getsourcefile(module), "exec"), namespace)
    return vars(namespace[owner])[name]


def _scenario(groups: tuple[SpecDraw, ...]) -> TruncationScenario:
    return TruncationScenario(
        layout=LayoutDraw(groups, hash_block_size=4, num_blocks=32),
        shared=tuple(range(64)),
        prompts=((16, 0),),
        prefill_chunk=None,
        evict_from=tuple(None for _ in groups),
        replay=(20, 8),
        lookup_mode="joint",
        endpoint=EndpointRule("cover_hit", 0, 0),
    )


HYBRID = (SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4))
WINDOWED = (SpecDraw("FullAttentionSpec", 4), SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 16),)))


# -- violation ---------------------------------------------------------------


def test_vllm_raising_in_a_runtime_path_is_a_violation(monkeypatch) -> None:
    broken = _in_vllm(
        __import__("vllm.v1.core.kv_cache_manager", fromlist=["x"]),
        "KVCacheManager",
        """
        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            return self.block_pool.get_new_blocks(10**6)
        """,
        "allocate_slots",
    )
    monkeypatch.setattr(KVCacheManager, "allocate_slots", broken)
    with pytest.raises(InvariantViolation) as caught:
        run_truncation_scenario(_scenario(HYBRID))
    v = caught.value
    assert (v.invariant, v.exception, v.where) == ("no-exception", "ValueError", "KVCacheManager.allocate_slots")
    assert v.frames and v.frames[0].endswith(":BlockPool.get_new_blocks"), v.frames
    assert classify(v, VERSION).outcome is Outcome.VIOLATION


# -- config rejected -----------------------------------------------------------


def test_a_constructor_refusing_a_drawn_parameter_is_a_config_rejection(monkeypatch) -> None:
    """What a vLLM release that starts rejecting wide windows looks like."""
    original = ki.SlidingWindowSpec.__post_init__ if hasattr(ki.SlidingWindowSpec, "__post_init__") else None
    strict = _in_vllm(
        ki,
        "SlidingWindowSpec",
        """
        def __post_init__(self):
            if ORIGINAL is not None:
                ORIGINAL(self)
            if self.sliding_window > 2 * self.block_size:
                raise ValueError("sliding_window wider than two blocks is not supported")
        """,
        "__post_init__",
    )
    strict.__globals__["ORIGINAL"] = original
    monkeypatch.setattr(ki.SlidingWindowSpec, "__post_init__", strict)
    before = telemetry.COUNTERS["rejections"].copy()
    assert run_truncation_scenario(_scenario(WINDOWED)) is None
    added = telemetry.COUNTERS["rejections"] - before
    assert sum(added.values()) == 1 and "sliding_window wider" in next(iter(added)), added
    with pytest.raises(adapter.InvalidLayout, match="sliding_window wider"):
        adapter.ManagerHarness(_scenario(WINDOWED).layout)


def test_a_documented_refusal_at_first_use_is_a_config_rejection_on_its_releases(monkeypatch) -> None:
    """vLLM 0.27.1's sliding-window manager asserts on partial hits at lookup."""
    (refusal,) = [r for r in REFUSALS if r.id == "sliding-window-partial-hits"]
    refusing = _in_vllm(
        stkm,
        "SlidingWindowManager",
        """
        @classmethod
        def find_longest_cache_hit(cls, *args, **kwargs):
            assert False, "SlidingWindowManager does not support fine-grained (partial) cache hits"
        """,
        "find_longest_cache_hit",
    )
    monkeypatch.setattr(stkm.SlidingWindowManager, "find_longest_cache_hit", refusing)
    with pytest.raises(AssertionError) as raised:
        adapter.ManagerHarness(_scenario(WINDOWED).layout).lookup(list(range(20)), "joint")
    assert classify(raised.value, "0.27.1").outcome is Outcome.CONFIG_REJECTED
    # The same exception from the same place on a release that no longer
    # documents that refusal is a bug.
    assert classify(raised.value, "0.33.0").outcome is Outcome.VIOLATION


# -- harness error -------------------------------------------------------------


def test_a_missing_private_api_is_a_harness_error(monkeypatch) -> None:
    monkeypatch.delattr(Scheduler, "_get_local_prefix_cache_hit")
    with pytest.raises(AttributeError) as raised:
        build_harness(SchedulerDraw(LayoutDraw(HYBRID, 4, 32)))
    verdict = classify(raised.value, VERSION)
    assert verdict.outcome is Outcome.HARNESS_ERROR
    assert "_get_local_prefix_cache_hit" in verdict.reason and VERSION in verdict.reason
    assert verdict.where.startswith("fuzz/adapter/"), verdict.where


def test_a_changed_constructor_signature_is_a_harness_error_not_a_rejection(monkeypatch) -> None:
    """A vLLM release whose KVCacheManager no longer takes ``hash_block_size``:
    the suite's call does not fit; vLLM refused nothing."""
    narrower = _in_vllm(
        __import__("vllm.v1.core.kv_cache_manager", fromlist=["x"]),
        "KVCacheManager",
        """
        def __init__(self, kv_cache_config, max_model_len, scheduler_block_size, enable_caching=True):
            raise AssertionError("never reached: the call does not bind")
        """,
        "__init__",
    )
    monkeypatch.setattr(KVCacheManager, "__init__", narrower)
    with pytest.raises(HarnessError, match="hash_block_size"):
        adapter.ManagerHarness(_scenario(HYBRID).layout)
    with pytest.raises(HarnessError):
        run_truncation_scenario(_scenario(HYBRID))


def test_suite_code_raising_inside_a_scenario_is_a_harness_error() -> None:
    with pytest.raises(HarnessError, match="KeyError"):
        with vllm_calls(VERSION):
            {}["missing"]


def test_a_producer_scripted_to_load_is_a_harness_error_not_a_vllm_bug() -> None:
    """A P/D prefill instance's connector (``kv_producer``) never reports
    external tokens; a scenario that scripts one a load drives vLLM into a
    state no deployment reaches, so the step fails as the suite's misfit (a
    failing-load machine run once armed a producer's first request with a
    store hit, and vLLM's Mamba rollback then looked like a new bug)."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=20)
    for role, outcome in (("kv_both", None), ("kv_producer", Outcome.HARNESS_ERROR)):
        harness = build_harness(SchedulerDraw(layout, async_scheduling=True, kv_role=role))
        assert harness is not None
        harness.add_request(range(12), reply=ExternalReply("store", store_len=8))
        if outcome is None:
            harness.step()  # a consumer may load: no error
            continue
        with pytest.raises(HarnessError, match="kv_producer") as info:
            harness.step()
        assert classify(info.value, VERSION).outcome is outcome


def test_each_outcome_keeps_its_own_type_through_the_runner_boundary() -> None:
    assert classify(ConfigRejected("x"), VERSION).outcome is Outcome.CONFIG_REJECTED
    assert classify(HarnessError("x"), VERSION).outcome is Outcome.HARNESS_ERROR
    assert classify(InvariantViolation("must-cover", "x"), VERSION).outcome is Outcome.VIOLATION


# -- building an engine (the engine tier's start-up goes through this) ---------


def test_started_sorts_a_build_failure_into_the_three_outcomes() -> None:
    """What the engine tier does with an engine that will not start: the
    same three outcomes as the other tiers, decided by where it raised."""
    refusing = _in_vllm(
        ki,
        "SlidingWindowSpec",
        """
        def __post_init__(self):
            raise ValueError("sliding_window must be positive")
        """,
        "__post_init__",
    )
    crashing = _in_vllm(
        __import__("vllm.v1.core.kv_cache_manager", fromlist=["x"]),
        "KVCacheManager",
        """
        def allocate_slots(self):
            return {}["missing"]
        """,
        "allocate_slots",
    )

    def misfit() -> None:
        Scheduler.this_method_is_gone()  # type: ignore[attr-defined]

    with pytest.raises(ConfigRejected, match="sliding_window must be positive"):
        started(lambda: refusing(object()), VERSION)
    with pytest.raises(HarnessError, match="this_method_is_gone") as caught:
        started(misfit, VERSION)
    assert VERSION in str(caught.value)
    with pytest.raises(KeyError):
        started(lambda: crashing(object()), VERSION)
    assert started(lambda: 7, VERSION) == 7
