# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A waiting request padded to the uniform spec-decode size must not be cut
by long_prefill_token_threshold.

Claim: schedule() never raises on a valid configuration; a request admitted
with one token left is scheduled whole (padded to 1 + k, or not padded).

Broken on 0.33.0 (bug id spec-decode-padding-cut-by-long-prefill-threshold):
in the waiting loop a request with num_new_tokens == 1 and tokens already
computed (here a prefix-cache hit of all but its last token) is padded to
1 + num_spec_tokens with pad_spec_decode = True; right after,
``0 < long_prefill_token_threshold < num_new_tokens`` cuts it back, and
``assert num_new_tokens == 1 + self.num_spec_tokens`` fails: the engine core
dies. The threshold applies only with more than one eligible request.

Upstream: vllm-project/vllm PR 54028
(https://github.com/vllm-project/vllm/pull/54028) reports the same cut on a
GPU engine (ngram, k=3, threshold 2) and proposes skipping the padding when
the threshold cannot hold it.
"""

import traceback

import pytest

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler

pytestmark = pytest.mark.cpu_test

K = 2  # ngram speculative tokens


def _admit_a_hit_of_all_but_one(threshold: int):
    scheduler = create_scheduler(
        enable_prefix_caching=True,
        num_speculative_tokens=K,
        long_prefill_token_threshold=threshold,
    )
    # a and b: the same 17 tokens (one full block of 16, then 1 token); c: 4.
    a, b = create_requests(
        2, num_tokens=17, max_tokens=2, same_prompt=True, req_ids=["a", "b"]
    )
    (c,) = create_requests(1, num_tokens=4, max_tokens=2, req_ids=["c"])

    scheduler.add_request(a)
    out1 = scheduler.schedule()  # step 1: a's 17 tokens; block 1 is cached
    scheduler.update_from_output(out1, create_model_runner_output([a], use_eos=True))
    assert a.is_finished()

    scheduler.add_request(b)  # hits block 1: 16 of 17 tokens computed
    scheduler.add_request(c)  # two eligible requests: the threshold applies
    try:
        out2 = scheduler.schedule()  # step 2
    except AssertionError as exc:
        out2 = traceback.extract_tb(exc.__traceback__)[-1]  # where vLLM asserted
    return b, c, out2


def test_threshold_below_padded_spec_decode_size():
    b, c, out2 = _admit_a_hit_of_all_but_one(threshold=K)
    assert not isinstance(out2, traceback.FrameSummary), (
        f"step 2: schedule() raised AssertionError ({out2.line}): request "
        f"{b.request_id} (16 of 17 tokens cached) was padded to 1 + {K} = {1 + K} "
        f"tokens, then cut to long_prefill_token_threshold={K} with request "
        f"{c.request_id} waiting"
    )
    assert out2.num_scheduled_tokens[b.request_id] in (1, 1 + K)
    assert out2.num_scheduled_tokens[c.request_id] <= K


def test_threshold_holds_padded_spec_decode_size():
    b, c, out2 = _admit_a_hit_of_all_but_one(threshold=1 + K)
    # b: 16 cached + 1 + K padded; c: 3 of its 4 tokens (the threshold).
    assert b.num_computed_tokens == 16 + 1 + K
    assert out2.num_scheduled_tokens == {b.request_id: 1 + K, c.request_id: 1 + K}
    assert out2.scheduled_spec_decode_tokens[b.request_id] == [-1] * K
