# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A request rolled back by a failed KV load below an image it holds in the
encoder cache must still be scheduled until it finishes.

Claim (kv_load_failure_policy="recompute"): after a rollback, the request
recomputes its prompt, its images included, and finishes.

Broken on 0.33.0 (bug id encoder-output-held-past-failed-load-rollback): a
request admitted with a synchronous load that covers an image placeholder
computes (and keeps in the encoder cache) only the image its first
scheduled position needs. When the load is reported failed,
_update_requests_with_invalid_blocks rolls num_computed_tokens back before
an earlier image, but nothing frees the later image's encoder-cache entry,
which the request itself references. The earlier image needs room the cache
has only once the later one is freed, which happens only after the request
has passed it: the request stays RUNNING and _try_schedule_encoder_inputs
cuts it to zero tokens at every step. With one image it finishes (the
control).

Upstream: other encoder-cache stalls in schedule() came first
(https://github.com/vllm-project/vllm/pull/31699,
https://github.com/vllm-project/vllm/issues/45414); this trigger, a
rollback below an image the request holds, is not among them.
"""

import pytest

from vllm.multimodal.inputs import PlaceholderRange
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler, mock_kv

pytestmark = pytest.mark.cpu_test


def _rolled_back_below_the_images(images: list[PlaceholderRange]):
    scheduler = create_scheduler(
        enable_prefix_caching=True,
        block_size=4,
        max_num_batched_tokens=4,
        max_num_seqs=1,
        use_kv_connector=mock_kv(matched_tokens=6, is_async=False),
    )
    # What kv_load_failure_policy="recompute" sets (create_scheduler has no option).
    scheduler.recompute_kv_load_failures = True
    # A multimodal model's encoder budget: 4 embeddings, the batch's token budget.
    scheduler.max_num_encoder_input_tokens = 4
    scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=4)
    (request,) = create_requests(
        1, num_tokens=7, max_tokens=1, mm_positions=[images], block_size=4
    )
    scheduler.add_request(request)

    # Step 1: load [0, 6), compute position 6 (the last image).
    out1 = scheduler.schedule()
    (block_ids,) = out1.scheduled_new_reqs[0].block_ids
    scheduler.update_from_output(
        out1, create_model_runner_output([request], invalid_block_ids={block_ids[0]})
    )
    assert request.num_computed_tokens == 0  # rolled back to block 0's start

    scheduled = [out1.num_scheduled_tokens]
    for _ in range(4):  # steps 2-5: recompute the 7 tokens, 4 a step, then finish
        out = scheduler.schedule()
        scheduled.append(out.num_scheduled_tokens)
        output = create_model_runner_output([request])
        if request.num_computed_tokens < request.num_prompt_tokens:
            output.sampled_token_ids = [[]]  # a prefill chunk samples nothing
        scheduler.update_from_output(out, output)
    return scheduler, request, scheduled


def test_rollback_below_two_images_finishes():
    # Images a (positions 1-3) and b (4-6): 6 embeddings, a cache of 4.
    images = [
        PlaceholderRange(offset=1, length=3),
        PlaceholderRange(offset=4, length=3),
    ]
    scheduler, request, scheduled = _rolled_back_below_the_images(images)
    cached = sorted(scheduler.encoder_cache_manager.cached)
    assert request.is_finished(), (
        f"request {request.request_id} is {request.status.name} after 5 steps, "
        f"scheduled {scheduled}: rolled back to 0 at step 1, it needs image a "
        f"(3 embeddings) but the encoder cache of 4 still holds {cached}, image b "
        f"computed at step 1 for position 6"
    )


def test_rollback_below_one_image_finishes():
    images = [PlaceholderRange(offset=4, length=3)]
    scheduler, request, scheduled = _rolled_back_below_the_images(images)
    assert request.is_finished()
