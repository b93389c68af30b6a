# Standalone repro in vLLM's tests/v1/core idiom: it imports vLLM only (not
# this suite), so it can be pasted into vLLM's test tree as is.
"""Known vLLM 0.33.0 bug: a SinkFullAttentionSpec group cannot be built.

Found by: the spec strategies' constructibility sweep (every classified spec
type is built into a KVCacheManager before it is fuzzed).

Analysis: ``KVCacheCoordinator.__init__`` (vllm/v1/core/kv_cache_coordinator.py)
passes ``needs_kv_cache_zeroing=...`` to every single-type manager through
``get_manager_for_kv_cache_spec``. ``SinkFullAttentionManager.__init__``
(vllm/v1/core/single_type_kv_cache_manager.py) lists its keyword arguments
explicitly and does not accept it, so constructing any KV-cache manager (and
therefore the scheduler) for a model with static-sink attention layers
(vllm/model_executor/layers/attention/static_sink_attention.py registers
SinkFullAttentionSpec) raises ``TypeError`` at start-up. Smallest trigger: one
group, block size 4, sink_len 4.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the ``sink-full-attention-manager-init`` entry of fuzz/known_bugs.py (the
strategies then start fuzzing the type on the fixed releases) and delete this
file.
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


class ManagerRejectsZeroingFlag(Exception):
    """The pinned failure: the manager's constructor refuses the coordinator's
    ``needs_kv_cache_zeroing`` keyword."""


def _build_manager(spec_type, **extra):
    block_size = 4
    spec = spec_type(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32, **extra)
    config = KVCacheConfig(
        num_blocks=16,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
    return KVCacheManager(
        config,
        max_model_len=256,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        enable_caching=True,
    )


def test_control_the_same_group_as_plain_full_attention_builds():
    """Control: the construction below is right; only the spec type differs."""
    manager = _build_manager(FullAttentionSpec)
    assert len(manager.coordinator.single_type_managers) == 1


@pytest.mark.known_vllm_bug
@pytest.mark.xfail(
    strict=True,
    raises=ManagerRejectsZeroingFlag,
    reason="vLLM 0.33.0: SinkFullAttentionManager rejects needs_kv_cache_zeroing",
)
def test_sink_full_attention_group_builds_a_manager():
    try:
        # The manager asserts sink_len % block_size == 0.
        manager = _build_manager(SinkFullAttentionSpec, sink_len=4)
    except TypeError as exc:
        # Only this TypeError is the pinned bug; any other one fails the test.
        if "needs_kv_cache_zeroing" in str(exc):
            raise ManagerRejectsZeroingFlag(str(exc)) from exc
        raise
    assert len(manager.coordinator.single_type_managers) == 1
