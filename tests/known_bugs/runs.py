"""Hand-made runs of known vLLM bugs that more than one test module plays:
the pins here, the repro writer's tests (tests/findings/) and the tooling
tests. The analyses stay with the pins (the ``test_*.py`` modules beside
this one).
"""

from __future__ import annotations

import random

from fuzz.adapter import SchedulerHarness
from fuzz.model import ExternalReply, LayoutDraw, PromptDraw, SchedulerDraw, SingleShotScenario, SpecDraw, StepObservation
from invariants.scheduler import check_no_exception_escapes
from tests.support.harnesses import harness_of

__all__ = [
    "FULL_PROMPT_ASYNC_LOAD",
    "SYNC_LOAD_THEN_SAME_STEP_PARTIAL_HIT",
    "failed_sync_load",
    "failed_sync_load_run",
    "pool_nearly_full_scenario",
    "shared_partial_hit_harness",
    "shared_partial_hit_step",
]


# --------------------------------------------------------------------------
# mamba-external-block-undercount (test_known_vllm_bugs_scheduler.py).
# --------------------------------------------------------------------------
def pool_nearly_full_scenario() -> tuple[SchedulerHarness, object]:
    """A running 900-token request fills most of a 140-block pool (enough for
    max_model_len=1024, as the engine requires); then a request arrives whose
    prompt the connector holds, sized so its admission estimate equals the
    free blocks exactly."""
    block = 8
    layout = LayoutDraw(
        groups=(SpecDraw("FullAttentionSpec", block), SpecDraw("MambaSpec", block)),
        hash_block_size=2,
        num_blocks=140,
    )
    harness = harness_of(layout, batch=64, seqs=2)
    harness.add_request([5_000 + i for i in range(900)], max_tokens=200, reply=ExternalReply("zero"))
    while harness.scheduler.requests[next(iter(harness.scheduler.requests))].num_computed_tokens < 900:
        step = harness.step()
        check_no_exception_escapes(step)
    free = harness.pool.get_num_free_blocks()
    # n = 8k + 1 tokens, 8k loaded: estimate (k + 1) + 1 == free.
    n = block * (free - 2) + 1
    harness.add_request(list(range(n)), max_tokens=1, reply=ExternalReply("store", store_len=n))
    return harness, harness.step()


# --------------------------------------------------------------------------
# same-step-cow-chain (test_known_vllm_bugs_scheduler.py).
# --------------------------------------------------------------------------
def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(3, 1023) for _ in range(n)]


def shared_partial_hit_step(copies_of_b: int, *, second_root: bool = False) -> StepObservation:
    """A 9-token prompt runs alone, then ``copies_of_b`` 130-token prompts
    sharing its first 8 tokens arrive together; returns their first step.
    With ``second_root``, two more 130-token prompts on another root, sharing
    129 tokens, arrive in the same step: the second could adopt the first's
    block-aligned Mamba state, cached as it is allocated."""
    harness = shared_partial_hit_harness(copies_of_b)
    if second_root:
        other = _tokens(2000, 330)
        for seed in (5, 6):
            harness.add_request(other[:129] + _tokens(seed, 1), max_tokens=1, reply=ExternalReply("zero"))
    return harness.step()


def shared_partial_hit_harness(copies_of_b: int) -> SchedulerHarness:
    """:func:`shared_partial_hit_step`'s harness, right before that step."""
    layout = LayoutDraw(
        groups=(SpecDraw("FullAttentionSpec", 64), SpecDraw("MambaSpec", 64)),
        hash_block_size=8,
        num_blocks=600,
    )
    harness = harness_of(layout, batch=4096, seqs=4)
    root = _tokens(1000, 330)
    harness.add_request(root[:8] + _tokens(0, 1), max_tokens=1, reply=ExternalReply("zero"))
    harness.drain()
    for _ in range(copies_of_b):
        harness.add_request(root[:129] + _tokens(0, 1), max_tokens=1, reply=ExternalReply("zero"))
    return harness


# --------------------------------------------------------------------------
# mamba-failed-load-rollback (test_mamba_failed_load_rollback.py).
# --------------------------------------------------------------------------
def failed_sync_load(spec: str) -> list[StepObservation]:
    """16 tokens, one group of block 4; the connector answers 12 from 0 and
    the load of [0, 12) is reported failed block by block."""
    return failed_sync_load_run(spec)[1]


def failed_sync_load_run(spec: str) -> tuple[SchedulerHarness, list[StepObservation]]:
    """:func:`failed_sync_load`'s harness (its operation log) and steps."""
    layout = LayoutDraw((SpecDraw(spec, 4),), hash_block_size=4, num_blocks=32)
    harness = harness_of(layout, batch=32, kv_load_failure_policy="recompute")
    harness.add_request(tuple(range(100, 116)), max_tokens=1, reply=ExternalReply("store", store_len=12))
    harness.fail_next_sync_loads()
    return harness, harness.drain(context=f"{spec}: sync load of [0, 12) fails")


# --------------------------------------------------------------------------
# The block-ownership model's findings (test_ownership_findings.py).
# --------------------------------------------------------------------------
_ZERO = ExternalReply(kind="zero", store_len=0, undecided=0, extra=0, load_async=False)

# Shrunk by hand from the fuzzer's first example on vLLM 0.33.0.
SYNC_LOAD_THEN_SAME_STEP_PARTIAL_HIT = SingleShotScenario(
    config=SchedulerDraw(
        layout=LayoutDraw(
            groups=(SpecDraw("MambaSpec", 6), SpecDraw("FullAttentionSpec", 6)), hash_block_size=1, num_blocks=29
        ),
        max_num_batched_tokens=30,
        max_num_seqs=2,
        long_prefill_token_threshold=0,
        divergent_hits=True,
        kv_load_failure_policy="recompute",
        model_runner="v1",
    ),
    shared_len=48,
    token_seed=574,
    fills=(PromptDraw(15, 0, 3, _ZERO), PromptDraw(20, 0, 2, _ZERO), PromptDraw(26, 0, 3, _ZERO)),
    concurrent=False,
    evict_from=None,
    replay=PromptDraw(28, 0, 3, ExternalReply(kind="store", store_len=28, undecided=0, extra=0, load_async=False)),
    flavour="tail",
    probe=PromptDraw(25, 0, 2, _ZERO),
    replay_copies=2,
)

FULL_PROMPT_ASYNC_LOAD = SingleShotScenario(
    config=SchedulerDraw(
        layout=LayoutDraw(
            groups=(SpecDraw("MambaSpec", 4), SpecDraw("FullAttentionSpec", 4)), hash_block_size=1, num_blocks=20
        ),
        max_num_batched_tokens=18,
        max_num_seqs=1,
        long_prefill_token_threshold=18,
        divergent_hits=True,
        kv_load_failure_policy="recompute",
        model_runner="v1",
    ),
    shared_len=32,
    token_seed=175,
    fills=(PromptDraw(6, 0, 2, _ZERO), PromptDraw(10, 0, 2, _ZERO)),
    concurrent=False,
    evict_from=None,
    replay=PromptDraw(12, 0, 2, ExternalReply(kind="undecided", store_len=12, undecided=1, extra=0, load_async=False)),
    flavour="tail",
    probe=PromptDraw(9, 0, 1, ExternalReply(kind="undecided", store_len=9, undecided=1, extra=0, load_async=True)),
)
