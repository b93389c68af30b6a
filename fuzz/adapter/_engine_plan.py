"""The KV-cache config a real engine plans for a model, without a model or GPU.

The path follows vLLM's engine start-up, calling vLLM's own code at every
step that decides a number:

1. ``ModelConfig`` from the drawn ``config.json`` (written locally, never
   the hub) and ``VllmConfig`` with the drawn cache flags: its
   ``__post_init__`` runs the architecture's ``verify_and_update_config``
   hooks (``MambaModelConfig`` / ``HybridAttentionMambaModelConfig``:
   Mamba cache mode, ``mamba_block_size``; ``NemotronHForCausalLMConfig``:
   the SSM state dtype);
2. ``Platform.update_block_size_for_backend`` (what the executor calls once
   the layers exist): the backend's preferred block size and, for hybrids,
   ``_align_hybrid_block_size`` (attention page >= Mamba page, Mamba page
   padded). The GPU deployments this suite models run FlashAttention; the
   one thing the real method would learn from built layers (which backends
   they use) is supplied from the layer plan, see :class:`_GpuPlatform`;
3. per-layer ``KVCacheSpec``\\ s as the layers' ``get_kv_cache_spec`` build
   them (attention: ``FullAttentionSpec`` or ``SlidingWindowSpec`` with
   vLLM's own ``_largest_kernel_block_within``; Mamba layers: shapes and
   dtypes from the model class's ``get_mamba_state_*_from_config``), one per
   layer, named as the model names them;
4. ``get_global_kv_cache_groups`` + ``get_kv_cache_configs`` (grouping, page
   size unification, the memory check against ``max_model_len``; the pool
   size comes from ``num_gpu_blocks_override``, a real engine flag),
   ``generate_scheduler_kv_cache_config``, then ``EngineCore``'s
   post-profiling steps (``block_size`` = smallest prefix-cacheable group
   block, ``validate_block_size``, the block-size resolver).

Which layer of an architecture is attention, sliding window or Mamba is the
model class's rule (:data:`_LAYER_RULES`), read from vLLM's model files.
What is not modelled: FlashInfer GDN prefill (its checkpoint alignment is a
property of built layers; the Triton prefill path is modelled), drafters with
layers of their own (EAGLE, MTP: only "ngram" speculative decoding, which
adds the Mamba layers' speculative state blocks and no layer), KV-cache
quantisation.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from fuzz.adapter import _compat, _connector
from fuzz.adapter._config import scheduler_config, speculative_kw
from fuzz.adapter._env import init_hashing
from fuzz.adapter._specs import refused

from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    VllmConfig,
)
from vllm.model_executor.layers.attention.attention import _largest_kernel_block_within  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.platforms.interface import Platform  # noqa: E402
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE  # noqa: E402
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum  # noqa: E402
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout  # noqa: E402
from vllm.v1.attention.selector import get_mamba_attn_backend  # noqa: E402
from vllm.v1.core import kv_cache_planning as _planning  # noqa: E402
from vllm.v1.core import kv_cache_utils as _kcu  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec  # noqa: E402

from fuzz.adapter._specs import InvalidLayout  # noqa: E402
from fuzz.model import LayoutDraw, SchedulerDraw, SpecDraw  # noqa: E402
from fuzz.model._engine import EngineDraw  # noqa: E402

__all__ = ["EnginePlan", "layout_or_none", "plan_draw", "plan_engine", "planned_layout"]

# What a layer is, per the model class: ("attention", sliding_window or
# None) or ("mamba", mamba_type). A layer may hold both (Falcon-H1).
_Layer = tuple[tuple[str, Any], ...]


def _nemotron_h(hf: Any) -> list[_Layer]:
    # nemotron_h.py: hybrid_override_pattern[i]: "M" Mamba2 mixer, "*"
    # attention (every one with config.sliding_window, when set), "-" MLP and
    # "E" MoE (no KV cache).
    window = getattr(hf, "sliding_window", None)
    kinds = {"M": (("mamba", "mamba2"),), "*": (("attention", window),)}
    return [kinds.get(c, ()) for c in hf.hybrid_override_pattern]


def _block_types(attention: str, mamba: str, mamba_type: str, key: str) -> Callable[[Any], list[_Layer]]:
    def layers(hf: Any) -> list[_Layer]:
        table = {attention: (("attention", None),), mamba: (("mamba", mamba_type),)}
        return [table[t] for t in getattr(hf, key)]

    return layers


def _falcon_h1(hf: Any) -> list[_Layer]:
    # falcon_h1.py: every decoder layer runs attention and a Mamba2 mixer in parallel.
    return [(("attention", None), ("mamba", "mamba2"))] * hf.num_hidden_layers


def _gemma3(hf: Any) -> list[_Layer]:
    # gemma3.py: sliding_window on "sliding_attention" layers.
    return [
        (("attention", hf.sliding_window if t == "sliding_attention" else None),) for t in hf.layer_types
    ]


def _gpt_oss(hf: Any) -> list[_Layer]:
    # gpt_oss.py: even layers slide (config.sliding_window), odd ones attend fully.
    return [(("attention", hf.sliding_window if i % 2 == 0 else None),) for i in range(hf.num_hidden_layers)]


# Architecture -> the model class's per-layer rule (over the parsed HF config).
_LAYER_RULES: dict[str, Callable[[Any], list[_Layer]]] = {
    "NemotronHForCausalLM": _nemotron_h,
    # jamba.py: config.layers_block_type[i]; MambaMixer (Mamba1).
    "JambaForCausalLM": _block_types("attention", "mamba", "mamba1", "layers_block_type"),
    # qwen3_next.py / qwen3_5.py: config.layer_types[i]; GatedDeltaNet layers.
    "Qwen3NextForCausalLM": _block_types("full_attention", "linear_attention", "gdn_attention", "layer_types"),
    "Qwen3_5ForCausalLM": _block_types("full_attention", "linear_attention", "gdn_attention", "layer_types"),
    # granitemoehybrid.py: config.layer_types[i] (transformers maps the
    # published "attention" / "mamba" to these); MambaMixer2.
    "GraniteMoeHybridForCausalLM": _block_types("full_attention", "linear_attention", "mamba2", "layer_types"),
    "FalconH1ForCausalLM": _falcon_h1,
    "Gemma3ForCausalLM": _gemma3,
    "GptOssForCausalLM": _gpt_oss,
}

# vLLM's Mamba2 mixer exports block-boundary states from inside a prefill
# (mamba_mixer2.py get_kv_cache_spec); Mamba1 and Triton-prefill GDN do not.
_MAMBA_SPEC_EXTRAS: dict[str, dict[str, Any]] = {
    "mamba2": dict(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1),
    "mamba1": {},
    "gdn_attention": {},
}
# The layer's ``mamba_type`` (its backend), per mixer.
_MAMBA_TYPES = {
    "mamba2": MambaAttentionBackendEnum.MAMBA2,
    "mamba1": MambaAttentionBackendEnum.MAMBA1,
    "gdn_attention": MambaAttentionBackendEnum.GDN_ATTN,
}


class _GpuPlatform(Platform):
    """vLLM's base platform logic (what CUDA runs) with the attention
    backends of the built layers supplied from the layer plan: the real
    ``_find_non_ssm_backends`` walks the static forward context of a built
    model, which this path has not got."""

    _backends: list[type] = [FlashAttentionBackend]

    @classmethod
    def _find_non_ssm_backends(cls, vllm_config: VllmConfig) -> list[type]:  # type: ignore[override]
        return list(cls._backends)


@functools.cache
def _models_dir() -> str:
    path = tempfile.mkdtemp(prefix="kvtrunc-engine-models-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _model_dir(engine: EngineDraw) -> str:
    digest = hashlib.sha1(json.dumps(engine.hf_config).encode()).hexdigest()[:16]
    directory = os.path.join(_models_dir(), digest)
    if not os.path.exists(os.path.join(directory, "config.json")):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(engine.config_dict(), f)
    return directory


@dataclasses.dataclass
class EnginePlan:
    """What the engine core hands the scheduler for one model + flags."""

    vllm_config: Any
    kv_config: Any  # the scheduler's KVCacheConfig
    layer_specs: dict[str, Any]  # per layer, as the model runner reports them
    scheduler_block_size: int
    hash_block_size: int

    def layout(self) -> LayoutDraw:
        """The plan in the suite's vocabulary (group spec kind, block size,
        the spec's integer fields the managers read)."""
        groups = []
        for g in self.kv_config.kv_cache_groups:
            spec = g.kv_cache_spec
            params: list[tuple[str, int]] = []
            for name in ("sliding_window", "attention_chunk_size"):
                if getattr(spec, name, None) is not None:
                    params.append((name, int(getattr(spec, name))))
            # Mamba under speculative decoding; Mamba2's prefill checkpoints.
            for name in ("num_speculative_blocks", "num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment"):
                if getattr(spec, name, None):
                    params.append((name, int(getattr(spec, name))))
            groups.append(SpecDraw(type(spec).__name__, spec.block_size, tuple(params)))
        return LayoutDraw(
            tuple(groups),
            hash_block_size=self.hash_block_size,
            num_blocks=self.kv_config.num_blocks,
            max_model_len=self.vllm_config.model_config.max_model_len,
        )


def _layer_specs(vllm_config: VllmConfig, layers: list[_Layer]) -> dict[str, Any]:
    """Each layer's spec, as its ``get_kv_cache_spec`` builds it."""
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    num_kv_heads = model_config.get_num_kv_heads(vllm_config.parallel_config)
    head_size = model_config.get_head_size()
    kv_dtype = (
        model_config.dtype
        if cache_config.cache_dtype == "auto"
        else STR_DTYPE_TO_TORCH_DTYPE[cache_config.cache_dtype]
    )
    backend = FlashAttentionBackend
    # MambaBase.get_kv_cache_spec: a state block per speculative token (none
    # under ReplaySSM).
    speculative = vllm_config.speculative_config
    speculative_blocks = (
        0
        if speculative is None or getattr(cache_config, "use_replayssm", False)
        else speculative.num_speculative_tokens or 0
    )
    model_cls, _ = ModelRegistry.resolve_model_cls(model_config.architecture, model_config=model_config)
    specs: dict[str, Any] = {}
    for i, parts in enumerate(layers):
        for kind, arg in parts:
            if kind == "attention" and arg is None:
                specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                    block_size=cache_config.block_size, num_kv_heads=num_kv_heads, head_size=head_size, dtype=kv_dtype
                )
            elif kind == "attention":
                # attention.py: the sliding-window layer picks its own block,
                # the largest kernel block whose page fits the primary page.
                one = backend.customize_spec(
                    SlidingWindowSpec(
                        block_size=1, num_kv_heads=num_kv_heads, head_size=head_size, dtype=kv_dtype, sliding_window=arg
                    )
                )
                per_token = one.real_page_size_bytes
                block = _largest_kernel_block_within(
                    backend, per_token, per_token * cache_config.block_size, cache_config.block_size, one
                )
                specs[f"model.layers.{i}.self_attn.attn"] = SlidingWindowSpec(
                    block_size=block, num_kv_heads=num_kv_heads, head_size=head_size, dtype=kv_dtype, sliding_window=arg
                )
            else:
                # mamba/abstract.py MambaBase.get_kv_cache_spec.
                specs[f"model.layers.{i}.mixer"] = MambaSpec(
                    shapes=tuple(model_cls.get_mamba_state_shape_from_config(vllm_config)),
                    dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(vllm_config)),
                    block_size=cache_config.mamba_block_size,
                    page_size_padded=cache_config.mamba_page_size_padded,
                    mamba_type=_MAMBA_TYPES[arg],
                    mamba_cache_mode=cache_config.mamba_cache_mode,
                    num_speculative_blocks=speculative_blocks,
                    **_MAMBA_SPEC_EXTRAS[arg],
                )
    return specs


def _vllm_config(engine: EngineDraw, draw: SchedulerDraw | None, max_model_len: int) -> VllmConfig:
    _compat.inspect_models_in_process(_model_dir(engine))
    model_config = ModelConfig(
        model=_model_dir(engine),
        skip_tokenizer_init=True,
        dtype=engine.dtype,
        seed=0,
        max_model_len=max_model_len,
    )
    draw = draw or SchedulerDraw(layout=LayoutDraw((), 1, 1))
    config = VllmConfig(
        model_config=model_config,
        **speculative_kw(draw, model_config),
        scheduler_config=scheduler_config(draw, max_model_len),
        cache_config=CacheConfig(
            block_size=engine.block_size,
            enable_prefix_caching=engine.enable_prefix_caching,
            mamba_cache_mode=engine.mamba_cache_mode,
            mamba_block_size=engine.mamba_block_size,
            prefix_match_unit=engine.prefix_match_unit,
            cache_dtype="auto",
        ),
        kv_transfer_config=(
            _connector.transfer_config(draw.kv_load_failure_policy, draw.kv_role) if draw.connector else None
        ),
        device_config=DeviceConfig(device="cpu"),
        **_compat.kv_events_kw(draw.kv_events),
        **_compat.observability_kw(draw.metrics, draw.speculative_method is not None),
    )
    # The lean CPU install has no vLLM platform, so VllmConfig turns the
    # hybrid KV-cache manager off; the GPU deployments modelled run with it.
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    return config


def plan_engine(
    engine: EngineDraw,
    *,
    num_blocks: int | None = None,
    max_model_len: int = 1024,
    draw: SchedulerDraw | None = None,
) -> EnginePlan:
    """Plan ``engine`` as vLLM's engine start-up does (module docstring).

    ``num_blocks`` is the pool (``--num-gpu-blocks-override``; None: ample); ``draw`` supplies the scheduler
    flags. Raises :class:`fuzz.adapter.InvalidLayout` when vLLM refuses
    the configuration.
    """
    init_hashing()
    try:
        with _compat.model_runner(None if draw is None else draw.model_runner):
            vllm_config = _vllm_config(engine, draw, max_model_len)
            architecture = vllm_config.model_config.architecture
            if architecture not in _LAYER_RULES:
                raise ValueError(f"no layer rule for {architecture}")
            layers = _LAYER_RULES[architecture](vllm_config.model_config.hf_text_config)
            _GpuPlatform.update_block_size_for_backend(vllm_config)
            register_all_kvcache_specs(vllm_config)
            specs = _layer_specs(vllm_config, layers)
            # EngineCore: one KV-cache layout for every backend the layers use.
            backends = [FlashAttentionBackend] + sorted(
                {get_mamba_attn_backend(s.mamba_type) for s in specs.values() if isinstance(s, MambaSpec)},
                key=lambda b: b.__name__,
            )
            names = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
            resolve_kv_cache_layout(vllm_config, [names], list(specs.values()))
            groups = _planning.get_global_kv_cache_groups(vllm_config, [specs])
            # The profiled memory is replaced by the override's blocks; with
            # no override, ample memory (only the layout is wanted).
            vllm_config.cache_config.num_gpu_blocks_override = num_blocks
            memory = 1 << 36
            configs = _planning.get_kv_cache_configs(vllm_config, [specs], [memory], groups)
            kv_config = _kcu.generate_scheduler_kv_cache_config(configs)
            # EngineCore._initialize_kv_caches, after profiling.
            vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
            participating = [
                g.kv_cache_spec.block_size
                for g in kv_config.kv_cache_groups
                if _compat.prefix_cacheable(g.kv_cache_spec)
            ]
            vllm_config.cache_config.block_size = min(
                participating or [g.kv_cache_spec.block_size for g in kv_config.kv_cache_groups]
            )
            vllm_config.validate_block_size()
            sched_bs, hash_bs = _compat.record_resolved_sizes(kv_config, vllm_config)
    except Exception as exc:  # noqa: BLE001 - vLLM's verdict, or the suite's misfit
        raise refused(exc) from exc
    return EnginePlan(vllm_config, kv_config, specs, sched_bs, hash_bs)


@functools.lru_cache(maxsize=4096)
def planned_layout(engine: EngineDraw, num_speculative_tokens: int = 0) -> LayoutDraw:
    """The layout (block sizes, hash unit) the engine plans for ``engine``,
    with ``num_speculative_tokens`` ngram drafts (they change the Mamba
    state shapes, so the page sizes and block sizes, and add speculative
    state blocks); what strategies size prompts by. Raises ``InvalidLayout``
    if refused."""
    draw = None
    if num_speculative_tokens:
        draw = SchedulerDraw(
            layout=LayoutDraw((), 1, 1),
            speculative_method="ngram",
            num_speculative_tokens=num_speculative_tokens,
            draft_acceptance=(0,),
        )
    return plan_engine(engine, draw=draw).layout()


def layout_or_none(engine: EngineDraw, num_speculative_tokens: int = 0) -> LayoutDraw | None:
    """:func:`planned_layout`, or None when vLLM refuses the configuration
    (what ``fuzz.model.installed().plan_layout`` answers)."""
    try:
        return planned_layout(engine, num_speculative_tokens)
    except InvalidLayout:
        return None


def plan_draw(draw: SchedulerDraw) -> EnginePlan:
    """The plan the engine core makes for ``draw.engine``, with the pool
    (``num_blocks``) and ``max_model_len`` of ``draw.layout``. Raises
    ``InvalidLayout`` when vLLM refuses the configuration (e.g. a pool too
    small for ``max_model_len``)."""
    assert draw.engine is not None
    plan = plan_engine(
        draw.engine, num_blocks=draw.layout.num_blocks, max_model_len=draw.layout.max_model_len, draw=draw
    )
    if plan.layout().groups != draw.layout.groups:
        raise RuntimeError(f"the engine planned {plan.layout()!r}, the draw holds {draw.layout!r}")
    return plan
