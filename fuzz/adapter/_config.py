"""vLLM configuration, built offline the way the engine core builds it.

Construction follows ``EngineCore`` (``vllm/v1/engine/core.py``):
``ModelConfig`` from a tiny ``config.json`` written locally (a real hybrid
``NemotronHForCausalLM`` for layouts with a whole-state group,
``LlamaForCausalLM`` otherwise; never the hub), ``VllmConfig`` with prefix
caching, chunked prefill and a ``KVTransferConfig`` naming the scripted
connector by module path, then the engine's own post-profiling steps:
``num_gpu_blocks``, ``block_size`` = the smallest prefix-cacheable group
block, ``validate_block_size()``, the block-size resolver and what KV-cache
planning writes back onto the KV-cache config. ``ModelConfig`` and
``VllmConfig`` are built once per process (per distinct settings) and reused.

The scheduler flags (:func:`scheduler_config`, :func:`speculative_kw`) serve
the engine planner (:mod:`fuzz.adapter._engine_plan`) too; the scheduler
itself is constructed, for either, in :mod:`fuzz.adapter._build`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pydantic

from fuzz.adapter import _compat, _connector
from fuzz.adapter._env import init_hashing
from fuzz.adapter._specs import InvalidLayout, kv_cache_config, refused

from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)

from fuzz.model import SchedulerDraw  # noqa: E402

__all__ = [
    "MAX_MODEL_LEN",
    "SchedulerPlan",
    "plan_scheduler",
    "scheduler_config",
    "speculative_kw",
]

MAX_MODEL_LEN = 1024

# ---------------------------------------------------------------------------
# Tiny local models. vLLM only reads config.json (skip_tokenizer_init, no
# weights); the files live in one directory per process, removed at exit.
# ---------------------------------------------------------------------------

_MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    # A real hybrid: one Mamba2 layer, one attention layer ("M*"). vLLM turns
    # on Mamba "align" cache mode itself when prefix caching is on.
    "hybrid": dict(
        architectures=["NemotronHForCausalLM"],
        model_type="nemotron_h",
        hidden_size=64,
        num_hidden_layers=2,
        hybrid_override_pattern="M*",
        mamba_num_heads=4,
        mamba_head_dim=32,
        ssm_state_size=16,
        n_groups=1,
        conv_kernel=4,
        expand=2,
        chunk_size=64,
        vocab_size=1024,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=4096,
        torch_dtype="float32",
    ),
    # A plain decoder.
    "plain": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        vocab_size=1024,
        max_position_embeddings=4096,
        torch_dtype="float32",
    ),
    # An EAGLE draft head (``--speculative-config '{"method": "eagle",
    # "model": <dir>}'``): one Llama-style layer, the target's vocabulary.
    # vLLM reads its config.json only (draft ModelConfig, runner="draft").
    "eagle-draft": dict(
        architectures=["EagleLlamaForCausalLM"],
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        vocab_size=1024,
        max_position_embeddings=4096,
        torch_dtype="float32",
    ),
}


@functools.cache
def _models_dir() -> str:
    path = tempfile.mkdtemp(prefix="kvtrunc-models-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def _model_dir(kind: str) -> str:
    directory = os.path.join(_models_dir(), kind)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(_MODEL_CONFIGS[kind], f)
    return directory


@functools.cache
def _model_config(kind: str, max_model_len: int = MAX_MODEL_LEN) -> ModelConfig:
    _compat.inspect_models_in_process(_model_dir(kind))
    return ModelConfig(
        model=_model_dir(kind),
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=max_model_len,
    )


_VLLM_CONFIGS: dict[tuple[Any, ...], VllmConfig] = {}


def speculative_kw(draw: SchedulerDraw, model_config: ModelConfig) -> dict[str, Any]:
    """``VllmConfig`` keywords for ``draw``'s speculative decoding, built as
    ``EngineArgs.create_speculative_config`` does: ``SpeculativeConfig(
    target_model_config=..., target_parallel_config=..., method=...,
    num_speculative_tokens=...)``, the same ``ParallelConfig`` handed to
    ``VllmConfig``. "ngram" needs no draft model (vLLM reuses the target's
    config); "eagle" reads the local draft head's config.json."""
    if draw.speculative_method is None:
        return {}
    parallel = ParallelConfig()
    extra: dict[str, Any] = {}
    if draw.speculative_method == "eagle":
        extra["model"] = _model_dir("eagle-draft")
        _compat.inspect_models_in_process(extra["model"])
    speculative = SpeculativeConfig(
        method=draw.speculative_method,
        num_speculative_tokens=draw.num_speculative_tokens,
        target_model_config=model_config,
        target_parallel_config=parallel,
        **extra,
    )
    return {"parallel_config": parallel, "speculative_config": speculative}


def _vllm_config(draw: SchedulerDraw, block_size: int, prefix_match_unit: int | None) -> VllmConfig:
    key = (
        draw.model,
        block_size,
        prefix_match_unit,
        draw.max_num_batched_tokens,
        draw.max_num_seqs,
        draw.long_prefill_token_threshold,
        draw.kv_load_failure_policy,
        draw.model_runner,
        draw.async_scheduling,
        draw.prefill_schedule_interval,
        draw.kv_role,
        draw.speculative_method,
        draw.num_speculative_tokens,
        draw.layout.max_model_len,
        draw.kv_events,
        draw.max_loras,
        draw.connector,
        draw.metrics,
        draw.prefix_caching,
        draw.chunked_prefill,
    )
    config = _VLLM_CONFIGS.get(key)
    if config is None:
        with _speculation_refusals(draw):
            config = _new_vllm_config(draw, block_size, prefix_match_unit)
        # The lean CPU install has no vLLM platform, so VllmConfig turns the
        # hybrid KV-cache manager off; the deployments this suite models (GPU)
        # run with it on, and the scheduler config we hand over is hybrid.
        config.scheduler_config.disable_hybrid_kv_cache_manager = False
        if len(_VLLM_CONFIGS) > 256:
            _VLLM_CONFIGS.clear()
        _VLLM_CONFIGS[key] = config
    return config


@contextlib.contextmanager
def _speculation_refusals(draw: SchedulerDraw) -> Iterator[None]:
    """vLLM's refusals of a speculative configuration, as ``InvalidLayout``.

    VllmConfig validates through pydantic, which re-raises a validator's
    ``ValueError`` as a ``ValidationError`` with no vLLM frame left (it would
    read as the suite's own misfit). Errors of type ``value_error`` are such
    refusals (e.g. 0.33.0: ngram with async scheduling on the V1 runner;
    0.28.0: ngram on the V2 runner); a wrong argument has another type.
    """
    try:
        yield
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        if draw.speculative_method is None or not errors or any(e["type"] != "value_error" for e in errors):
            raise
        raise InvalidLayout(f"VllmConfig refused {draw.speculative_method} speculative decoding: {errors[0]['msg']}") from exc


def _new_vllm_config(draw: SchedulerDraw, block_size: int, prefix_match_unit: int | None) -> VllmConfig:
    model_config = _model_config(draw.model, draw.layout.max_model_len)
    return VllmConfig(
        model_config=model_config,
        **speculative_kw(draw, model_config),
        scheduler_config=scheduler_config(draw, draw.layout.max_model_len),
        cache_config=CacheConfig(
            block_size=block_size,
            enable_prefix_caching=draw.prefix_caching,
            mamba_cache_mode="align",
            prefix_match_unit=prefix_match_unit,
            cache_dtype="auto",
        ),
        kv_transfer_config=(
            _connector.transfer_config(draw.kv_load_failure_policy, draw.kv_role) if draw.connector else None
        ),
        device_config=DeviceConfig(device="cpu"),
        **_compat.kv_events_kw(draw.kv_events),
        **_compat.lora_kw(draw.max_loras),
        **_compat.observability_kw(draw.metrics, draw.speculative_method is not None),
    )


def scheduler_config(draw: SchedulerDraw, max_model_len: int) -> SchedulerConfig:
    """The ``SchedulerConfig`` of ``draw``'s scheduler flags (budgets,
    long-prefill threshold, scheduling mode, prefill cadence, chunked
    prefill), for scheduler-API and engine-planned configurations alike."""
    return SchedulerConfig(
        max_num_seqs=draw.max_num_seqs,
        max_num_batched_tokens=draw.max_num_batched_tokens,
        max_model_len=max_model_len,
        long_prefill_token_threshold=draw.long_prefill_token_threshold,
        enable_chunked_prefill=draw.chunked_prefill,
        is_encoder_decoder=False,
        **async_scheduling_kw(draw),
        **_compat.prefill_cadence_kw(draw.prefill_schedule_interval),
    )


def async_scheduling_kw(draw: SchedulerDraw) -> dict[str, Any]:
    """``SchedulerConfig`` keywords for ``draw``'s scheduling mode.

    Always explicit, as a user's flag is. An async draw asks for
    ``async_scheduling=True`` (what ``VllmConfig`` resolves the default None
    to for these configurations: no pooling, no PP, the uni executor). A sync
    draw is ``--no-async-scheduling``: ``async_scheduling=False``, so
    ``max_concurrent_batches`` is 1 (no PP) and the engine core drives it
    with ``EngineCore.step``. Left at None it would resolve to True: a plain
    ``Scheduler`` deferring block frees for two batches in flight
    (scheduler.py, ``defer_block_free``) while driven one step at a time,
    which no engine runs (with PP, the only sync setting with two batches,
    the core drives it through its batch queue).
    """
    return {"async_scheduling": bool(draw.async_scheduling)}


@dataclasses.dataclass
class SchedulerPlan:
    """What the engine core resolves for a scheduler-API draw before it
    constructs the scheduler (the fields :class:`fuzz.adapter._engine_plan.EnginePlan`
    has too, so :mod:`fuzz.adapter._build` constructs from either)."""

    vllm_config: VllmConfig
    kv_config: Any
    scheduler_block_size: int
    hash_block_size: int


def plan_scheduler(draw: SchedulerDraw) -> SchedulerPlan:
    """The configuration and resolved sizes for a draw without an engine.

    Raises :class:`InvalidLayout` when vLLM refuses the configuration (its
    config validation or block-size resolver).
    """
    init_hashing()
    layout = draw.layout
    prefix_match_unit = None if len(layout.groups) == 1 else layout.hash_block_size
    try:
        kv_config = kv_cache_config(layout)
        groups = kv_config.kv_cache_groups
        participating = [g.kv_cache_spec.block_size for g in groups if _compat.prefix_cacheable(g.kv_cache_spec)]
        block_size = min(participating or [g.kv_cache_spec.block_size for g in groups])
        with _compat.model_runner(draw.model_runner):
            vllm_config = _vllm_config(draw, block_size, prefix_match_unit)
            # EngineCore._initialize_kv_caches, after profiling:
            vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
            vllm_config.cache_config.block_size = block_size
            vllm_config.validate_block_size()
            sched_bs, hash_bs = _compat.record_resolved_sizes(kv_config, vllm_config)
    except InvalidLayout:
        raise
    except Exception as exc:  # noqa: BLE001 - vLLM's verdict, or the suite's misfit
        raise refused(exc) from exc
    return SchedulerPlan(vllm_config, kv_config, sched_bs, hash_bs)
