"""Known vLLM bug: a request aborted while the model runs the step whose
synchronous KV load fails leaves the load's invalid blocks in the prefix
cache.

Found by: ``failed-load-not-cached`` in the scheduler state machine (an abort
drawn "during the step", on a single FullAttention group with the "fail"
policy), 2026-12-01, once the harness applied aborts where the engine does.

Analysis (vLLM 0.33.0):

- ``EngineCore`` puts a client's abort on ``aborts_queue`` as it arrives
  (``vllm/v1/engine/core.py``, the input thread), and both ``step`` and
  ``step_with_batch_queue`` call ``_process_aborts_queue()`` "before
  processing the model output", right before ``update_from_output``. So an
  abort racing the model run frees the request (``finish_requests``, its
  blocks back to the free queue with their hashes) before the scheduler reads
  the step's ``invalid_block_ids``.
- ``Scheduler._handle_invalid_blocks`` (``vllm/v1/core/sched/scheduler.py``)
  looks for the failed blocks' owners only in ``self.running`` and in the
  async-loading waiting requests. The aborted request is in neither, so
  ``total_failed_requests == 0`` and it returns before ``evict_blocks``.
- The blocks were cached at allocation (a synchronous load is not
  ``delay_cache_blocks``), so they keep their hashes: the next request with
  the same prefix takes them as a local hit and reads KV that was never
  written. Silent wrong output, no error.
- Under "recompute" the same blocks stay cached and no request recomputes
  them; the check makes its claim for "fail" only (vLLM documents keeping
  them cached under "recompute" for the requests that recompute them).

Reach: a real engine, sync or async scheduling: one KV-cache group (vLLM
refuses block-level failures with several), a connector that reports
``invalid_block_ids`` (block-level load failures), and a client abort (a
disconnect) while the model runs the loading step. Release 0.33.0 checked;
older releases not checked here.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the ``abort-during-failed-sync-load-keeps-invalid-blocks-cached`` entry of
fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.known_bugs import KNOWN_BUGS
from fuzz.model import InvariantViolation
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.connector import check_failed_load_not_cached
from tests.known_bugs._pin import known_vllm_bug
from tests.known_bugs.runs import ABORTED_LOAD_PROMPT, failing_sync_load

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


@known_vllm_bug("vLLM: invalid blocks of a request aborted during its failing sync load stay in the prefix cache")
def test_invalid_blocks_of_an_aborted_request_leave_the_cache() -> None:
    _, step = failing_sync_load(aborted=True)
    check_failed_load_not_cached(step)


def test_control_without_the_abort_the_invalid_blocks_are_evicted() -> None:
    _, step = failing_sync_load(aborted=False)
    check_failed_load_not_cached(step)
    (load,) = step.failed_loads
    assert load.status_after == "FINISHED_ERROR", load


def test_the_next_request_on_the_prefix_adopts_the_unloaded_blocks() -> None:
    """The consequence: the same prompt again, with no external answer, is
    admitted with a local hit on exactly the blocks whose load failed."""
    harness, step = failing_sync_load(aborted=True)
    (load,) = step.failed_loads
    harness.add_request(ABORTED_LOAD_PROMPT, max_tokens=1, request_id="r1")
    (admission,) = [a for s in harness.drain(context="same prompt again") for a in s.admissions if a.request_id == "r1"]
    assert admission.local_hit >= 4 and admission.num_computed_tokens == admission.local_hit, admission.describe()
    adopted = set(admission.local_blocks[0])
    assert adopted & set(load.failed_block_ids[0]), (admission.describe(), load.describe())


def test_the_failure_is_the_registered_known_bug() -> None:
    _, step = failing_sync_load(aborted=True)
    with pytest.raises(InvariantViolation) as caught:
        check_failed_load_not_cached(step)
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "abort-during-failed-sync-load-keeps-invalid-blocks-cached"
