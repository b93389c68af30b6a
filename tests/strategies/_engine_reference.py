"""vLLM's own planning for named model configurations, with the model built.

Run as a script (``python tests/strategies/_engine_reference.py NAME...``) by
tests/strategies/test_engine_plan.py, in a process of its own: it initialises torch
distributed and replaces the GPU attention-backend selection, neither of
which may leak into the suite's test process.

For each name of :func:`strategies.engine_models.named_engine_models` it
builds the model's real layers on the meta device, then runs the engine's
own steps with them: the platform's ``update_block_size_for_backend`` (which
finds the layers' backends itself), every layer's ``get_kv_cache_spec`` as
the GPU model runner collects them (``customize_attention_spec`` included),
``get_global_kv_cache_groups`` / ``get_kv_cache_configs``, the scheduler
config and the block-size resolver. It prints one JSON object per name:
group specs (``repr``) with their layer counts, pool size and block sizes.

The only substitution: the attention backend the GPU platform would select
is FlashAttention (this CPU install has no GPU platform to select it).
"""

from __future__ import annotations

import json
import socket
import sys

import fuzz.adapter  # noqa: F401 - the environment and the planner
from fuzz.adapter import _compat
from fuzz.adapter._engine_plan import _vllm_config

import torch
import vllm.model_executor.layers.attention.attention as _attention
from vllm.config import set_current_vllm_config
from vllm.config.vllm import get_layers_from_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.model_executor.models import ModelRegistry
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
from vllm.v1.core import kv_cache_planning as planning
from vllm.v1.core import kv_cache_utils as kcu
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import AttentionSpec
from vllm.v1.worker.gpu_model_runner import customize_attention_spec

from strategies.engine_models import named_engine_models

NUM_BLOCKS = 256
MAX_MODEL_LEN = 256


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reference(name: str) -> dict[str, object]:
    engine = named_engine_models()[name]
    vllm_config = _vllm_config(engine, None, MAX_MODEL_LEN)
    model_cls, _ = ModelRegistry.resolve_model_cls(
        vllm_config.model_config.architecture, model_config=vllm_config.model_config
    )
    with set_current_vllm_config(vllm_config), torch.device("meta"):
        model_cls(vllm_config=vllm_config, prefix="")
    # The executor, once the layers exist (uniproc_executor.py).
    Platform.update_block_size_for_backend(vllm_config)
    # GPUModelRunner.get_kv_cache_spec.
    specs = {}
    for layer_name, layer in get_layers_from_vllm_config(vllm_config, AttentionLayerBase).items():
        spec = layer.get_kv_cache_spec(vllm_config)
        if spec is None:
            continue
        if isinstance(spec, AttentionSpec):
            spec = customize_attention_spec(layer.get_attn_backend(), spec)
        specs[layer_name] = spec
    # EngineCore._initialize_kv_caches.
    register_all_kvcache_specs(vllm_config)
    backends = list(dict.fromkeys(layer.get_attn_backend() for layer in get_layers_from_vllm_config(
        vllm_config, AttentionLayerBase).values()))
    names = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
    resolve_kv_cache_layout(vllm_config, [names], list(specs.values()))
    groups = planning.get_global_kv_cache_groups(vllm_config, [specs])
    vllm_config.cache_config.num_gpu_blocks_override = NUM_BLOCKS
    configs = planning.get_kv_cache_configs(vllm_config, [specs], [1 << 36], groups)
    kv_config = kcu.generate_scheduler_kv_cache_config(configs)
    vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
    participating = [g.kv_cache_spec.block_size for g in kv_config.kv_cache_groups if g.kv_cache_spec.prefix_cacheable]
    vllm_config.cache_config.block_size = min(participating)
    vllm_config.validate_block_size()
    sched_bs, hash_bs = _compat.record_resolved_sizes(kv_config, vllm_config)
    return summary(kv_config, sched_bs, hash_bs)


def summary(kv_config: object, sched_bs: int, hash_bs: int) -> dict[str, object]:
    """What the scheduler receives, without layer names (the model's own
    module paths; the planner names layers by index only)."""
    return {
        "groups": [[repr(g.kv_cache_spec), len(g.layer_names)] for g in kv_config.kv_cache_groups],  # type: ignore[attr-defined]
        "num_blocks": kv_config.num_blocks,  # type: ignore[attr-defined]
        "scheduler_block_size": sched_bs,
        "hash_block_size": hash_bs,
    }


def main(names: list[str]) -> None:
    _attention.get_attn_backend = lambda *args, **kwargs: FlashAttentionBackend
    with set_current_vllm_config(_vllm_config(named_engine_models()[names[0]], None, MAX_MODEL_LEN)):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
    out = {name: reference(name) for name in names}
    print("REFERENCE " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
