"""A run that is ended (going nowhere, or stalled) still feeds back the
output of the step in flight: with async scheduling and a KV consumer, vLLM
returns an aborted request's blocks only once that step's output is
processed (``Scheduler.deferred_frees``), as the engine's next
``update_from_output`` does. Found by a 60 s campaign: the leak check
failed on blocks the harness never let vLLM return."""

from __future__ import annotations

import pytest

from fuzz.adapter import SchedulerHarness
from fuzz.model import LayoutDraw, SpecDraw
from fuzz.runners.scheduler import Stepper
from invariants.scheduler import check_no_leaked_blocks
from tests.support.harnesses import harness_of


def _harness() -> SchedulerHarness:
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=17)
    return harness_of(layout, batch=8, seqs=2, async_scheduling=True)


@pytest.mark.parametrize("stuck", ["going_nowhere", "stalled"])
def test_an_ended_run_feeds_the_step_in_flight_before_the_leak_check(monkeypatch: pytest.MonkeyPatch, stuck: str) -> None:
    h = _harness()
    assert h.scheduler.defer_block_free  # the frees this is about
    rid = h.add_request(range(13), max_tokens=4)
    run = Stepper(h, ())
    run.step()
    run.step()
    assert h.has_pending_output
    h.abort(rid)  # between steps, with the last step's output still pending
    assert h.scheduler.deferred_frees  # vLLM holds the blocks until that output
    monkeypatch.setattr(SchedulerHarness, stuck, property(lambda self: True))
    run.drain()
    assert not h.has_pending_output
    check_no_leaked_blocks(h.pool_observation())
