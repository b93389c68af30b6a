"""Known vLLM bugs: what a failed KV load leaves behind keeps a request from
ever running again.

Found by: ``unblocked-request-admitted`` and ``running-request-progresses``
in the scheduler state machine (its ``fail_next_async_loads`` and
``fail_next_sync_loads`` rules under ``kv_load_failure_policy="recompute"``),
2026-12-05, on unmodified vLLM 0.33.0.

1. ``failed-async-load-keeps-own-reservation``
   (``vllm/v1/core/sched/scheduler.py``): admitting an async load adds the
   request to ``_inflight_prefills``, whose remaining blocks every later
   async admission must leave free (``_inflight_prefill_reserved_blocks``,
   passed to ``allocate_slots`` as ``reserved_blocks``). When the load is
   reported failed with no valid token, ``_update_waiting_for_remote_kv``
   frees the request's blocks and sends it back to the waiting queue, but
   leaves it in ``_inflight_prefills``. Asked again, the connector answers
   an async load again, and the request's admission must leave free the
   whole sequence its own stale reservation names: on a pool smaller than
   twice its need it is refused at every ``schedule()``. It sits first in
   ``kv_holding_waiting``, which the waiting loop drains first and leaves
   with ``break``, so no other waiting request is admitted either: the
   engine idles with free blocks. vLLM PR
   https://github.com/vllm-project/vllm/pull/48433 (closed unmerged)
   proposed excluding a request's own reservation when it resumes.

2. ``encoder-output-held-past-failed-load-rollback``: a request admitted
   with a synchronous load that covers an image placeholder computes (and
   keeps in the encoder cache) only the image its first scheduled position
   needs. When the load is reported failed under the recompute policy,
   ``_update_requests_with_invalid_blocks`` rolls ``num_computed_tokens``
   back before an earlier image, but nothing frees the later image's
   encoder-cache entry, which the request itself references. The earlier
   image then needs room the cache only has once the later one is freed,
   which happens only after the request has passed it: the request stays
   RUNNING and is never scheduled again
   (``_try_schedule_encoder_inputs`` cuts it to zero tokens every step).
   Upstream reports of encoder-cache stalls in ``schedule()`` came first
   (https://github.com/vllm-project/vllm/pull/31699 and
   https://github.com/vllm-project/vllm/issues/45414); this trigger, a
   rollback below an image the request holds, is not among them.

Reach: in principle a real engine (an async or synchronous KV connector
that reports failed blocks, ``kv_load_failure_policy="recompute"``; for the
second, a multimodal prompt whose two items together exceed the encoder
cache, which vLLM sizes at the batch's token budget or one item); shown
here through the scheduler API.

Strict xfail: each turns red the day vLLM fixes it; then set ``fixed_in``
on its entry of fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.known_bugs import SUPPRESS_ENV
from fuzz.targets.target_scheduler import UNSUPPORTED
from tests.known_bugs._pin import known_vllm_bug, shown_as
from tests.known_bugs.runs import failed_async_load, rolled_back_below_an_image

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


@pytest.fixture(autouse=True)
def _report_known_bugs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stepper sets registered bugs aside; a pin reports them."""
    monkeypatch.setenv(SUPPRESS_ENV, "report")


def test_a_failed_async_load_on_a_roomy_pool_is_recomputed() -> None:
    """The control: with 24 free blocks the stale reservation (7) still
    leaves room for the request's own 7, and it runs to its end."""
    failed_async_load(25)


@known_vllm_bug("vLLM 0.33.0: a request whose async load failed keeps its reservation in _inflight_prefills "
                "and is never admitted again on a pool under twice its need")
def test_a_failed_async_load_is_recomputed_on_a_pool_that_holds_it() -> None:
    """12 free blocks hold the request's 7, but not 7 more for its own
    stale reservation."""
    with shown_as("failed-async-load-keeps-own-reservation"):
        failed_async_load(13)


def test_a_rollback_below_one_image_is_recomputed() -> None:
    """The control: one image (positions 4-6) fits the encoder cache beside
    nothing else, and the request runs to its end."""
    rolled_back_below_an_image((("image-b", 4, 3),))


@known_vllm_bug("vLLM 0.33.0: a failed-load rollback below an image keeps the later image's encoder output, "
                "and the earlier one never gets room")
def test_a_rollback_below_two_images_is_recomputed() -> None:
    """Images at 1-3 and 4-6, an encoder cache of 4 embeddings: the step that
    loaded the prompt computed image b for position 6; rolled back to 0, the
    request needs image a, which has no room beside image b."""
    with shown_as("encoder-output-held-past-failed-load-rollback"):
        rolled_back_below_an_image((("image-a", 1, 3), ("image-b", 4, 3)))
