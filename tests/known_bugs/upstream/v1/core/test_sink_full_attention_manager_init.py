# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A KV-cache group of static-sink attention must build its manager.

Claim: KVCacheManager builds a single-type manager for every KV-cache spec
a model registers, so a model with static-sink attention layers
(SinkFullAttentionSpec) starts.

Broken on 0.33.0 (bug id sink-full-attention-manager-init): the coordinator
builds every manager through ``get_manager_for_kv_cache_spec`` with
``needs_kv_cache_zeroing=...``; ``SinkFullAttentionManager.__init__`` names
its keyword arguments one by one and has no such parameter, so the
constructor raises TypeError and the engine fails at start-up. The same
group as plain full attention (the control) builds.

Upstream: the same constructor missed ``scheduler_block_size`` when that
argument came (vllm-project/vllm PR 44951,
https://github.com/vllm-project/vllm/pull/44951, reported the start-up
crash); no report found of the ``needs_kv_cache_zeroing`` one.
"""

import pytest
import torch

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SinkFullAttentionSpec,
)

pytestmark = pytest.mark.cpu_test


def _manager(spec):
    config = KVCacheConfig(
        num_blocks=16,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
    return KVCacheManager(
        config,
        max_model_len=256,
        scheduler_block_size=4,
        hash_block_size=4,
        enable_caching=True,
    )


def test_sink_full_attention_group_builds_a_manager():
    # sink_len must be a multiple of the block size.
    spec = SinkFullAttentionSpec(
        block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32, sink_len=4
    )
    try:
        manager = _manager(spec)
        raised = None
    except TypeError as error:
        raised = error
    assert raised is None, (
        f"KVCacheManager raised TypeError ({raised}) building the manager of one "
        "SinkFullAttentionSpec group: a model with static-sink attention cannot start"
    )
    assert len(manager.coordinator.single_type_managers) == 1


def test_plain_full_attention_group_builds_a_manager():
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
    manager = _manager(spec)
    assert len(manager.coordinator.single_type_managers) == 1
