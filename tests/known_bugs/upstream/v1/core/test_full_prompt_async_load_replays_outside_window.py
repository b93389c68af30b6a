# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""After an async KV load of the whole prompt, the recompute of its last token
must read only blocks the request holds.

Bug id full-prompt-async-load-replays-outside-window (0.33.0): the admission sizes
the window for num_tokens (63: blocks [0, 48) nulled), then the landed load sets
num_computed_tokens to num_tokens - 1: token 62's window starts at 47, in a nulled
block (a Mamba group likewise keeps only the state at 63). Upstream: none found.
"""

import pytest

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler, mock_kv, new_sliding_window_spec

pytestmark = pytest.mark.cpu_test


def _first_step_after_an_async_load(matched_tokens: int):
    window = new_sliding_window_spec(block_size=16, sliding_window=16)
    connector = mock_kv(matched_tokens, is_async=True)
    scheduler = create_scheduler(enable_prefix_caching=True, kv_cache_spec=window, use_kv_connector=connector)
    (request,) = create_requests(num_requests=1, num_tokens=63, max_tokens=1)
    scheduler.add_request(request)
    out1 = scheduler.schedule()  # step 1: the async load starts
    scheduler.update_from_output(out1, create_model_runner_output([], finished_recving={"0"}))
    out2 = scheduler.schedule()  # step 2: the load has landed, compute resumes
    first = request.num_computed_tokens - out2.num_scheduled_tokens["0"]
    return first, scheduler.kv_cache_manager.get_block_ids("0")[0]


def test_recompute_after_a_full_prompt_async_load_reads_held_blocks():
    first, table = _first_step_after_an_async_load(matched_tokens=63)
    assert first == 62  # its window [47, 62] starts in block 2, [32, 48)
    assert table[2] != 0, f"request 0 recomputes token 62 at step 2, [32, 48) nulled: table {table}"


def test_first_token_after_a_partial_async_load_reads_held_blocks():
    first, table = _first_step_after_an_async_load(matched_tokens=48)
    assert first == 48 and table[2] != 0  # its window [33, 48]
