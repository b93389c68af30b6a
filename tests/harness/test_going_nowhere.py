"""A run that keeps scheduling work without any request getting further is
ended, and an honest one is not.

Found by the state machine on vLLM 0.33.0 (scheduler-API layout): under
async scheduling, a KV producer and an EAGLE drafter, a lone 21-token
request on a pool of 11 blocks is admitted with 20 tokens computed (a
sub-block hit), preempted at the next step for the block its decode needs,
admitted again, and so on for ever: every step schedules something, so the
quiet-step count never sees it, and each ``run_until_idle`` spent its 200
steps on it (one example ran 10,202 steps). With 12 blocks the same request
finishes in a few steps. The harness's ``going_nowhere`` ends such a run
once no request has passed its best for longer than recomputing every
request's tokens, one a step, could take.
"""

from __future__ import annotations

from fuzz.adapter import SchedulerHarness
from fuzz.model import LayoutDraw, SchedulerDraw, SpecDraw

STEPS = 80


def _harness(num_blocks: int) -> SchedulerHarness:
    layout = LayoutDraw(
        (SpecDraw("MambaSpec", 4, (("num_speculative_blocks", 2),)), SpecDraw("FullAttentionSpec", 4)),
        hash_block_size=1, num_blocks=num_blocks, max_model_len=22,
    )
    draw = SchedulerDraw(
        layout=layout, max_num_batched_tokens=16, max_num_seqs=3, long_prefill_token_threshold=1,
        model_runner="v2", async_scheduling=True, kv_role="kv_producer", speculative_method="eagle",
        num_speculative_tokens=2, draft_acceptance=(1, 2, 1, 1),
    )
    harness = SchedulerHarness(draw)
    harness.add_request(list(range(100, 121)), max_tokens=1)  # 21 tokens, within max_model_len
    return harness


def _drive(harness: SchedulerHarness) -> list[tuple[str, int]]:
    """Step until idle, stalled or going nowhere; each step's (status, computed tokens) of the request."""
    seen = []
    for _ in range(STEPS):
        if harness.is_idle() or harness.stalled or harness.going_nowhere:
            break
        harness.step("")
        seen += [(r.status.name, r.num_computed_tokens) for r in harness.scheduler.requests.values()]
    return seen


def test_a_preemption_loop_is_seen_going_nowhere() -> None:
    harness = _harness(num_blocks=11)
    seen = _drive(harness)
    assert harness.going_nowhere, f"the loop ran {len(seen)} steps unseen: {seen[-6:]}"
    # The loop itself, as found: admitted at 20 of 21 tokens, preempted, again.
    assert ("PREEMPTED", 0) in seen[-4:] and ("RUNNING", 20) in seen[-4:], seen[-6:]
    # Ended within the bound: 20 tokens to recompute, one a step, plus the margin.
    assert len(seen) <= 20 + 8 + 4, len(seen)
    assert not harness.stalled  # every step scheduled something: no quiet step saw it


def test_a_request_that_fits_finishes_without_going_nowhere() -> None:
    harness = _harness(num_blocks=12)
    seen = _drive(harness)
    assert harness.is_idle(), seen
    assert not harness.going_nowhere
