"""Strategies for engine-reachable scheduler configurations.

Models are drawn, not layouts: a ``config.json`` of a real architecture
(per-layer types, head counts and sizes, Mamba / linear-attention state
shapes, dtype) and the cache flags an operator passes (``--block-size``,
``--mamba-cache-mode``, ``--mamba-block-size``, ``--prefix-match-unit``).
vLLM's own planning code (``fuzz.adapter._engine_plan``) turns each into
the KV-cache config the engine hands the scheduler; the strategies only
size prompts and pools by it. Every config dict is written here, shrunk to
toy widths (the scheduler never reads weights); nothing comes from a hub.

Architectures (:data:`ARCHITECTURES`): NemotronH, Jamba, Qwen3-Next and
Qwen3.5 (gated linear attention), Granite-4.0-H, Falcon-H1 (Mamba hybrids),
Gemma-3 and GPT-OSS (sliding window + full attention).

Shrinking goes towards the first architecture (NemotronH), its smallest
layer pattern and the backend's default block size.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from fuzz.model import EngineDraw, LayoutDraw, SchedulerDraw, SpecDraw, installed
from fuzz.model import SingleShotScenario
from strategies.scheduler import scheduler_draws
from strategies.single_shot import single_shot_scenarios

__all__ = [
    "ARCHITECTURES",
    "engine_models",
    "engine_scheduler_draws",
    "engine_single_shot_scenarios",
    "named_engine_models",
]

_COMMON: dict[str, Any] = dict(vocab_size=1024, max_position_embeddings=4096, tie_word_embeddings=False)


def _pattern(draw: st.DrawFn, n: int, mamba: str, attention: str, label: str) -> list[str]:
    """``n`` layer kinds with at least one of each, attention mostly rare
    (hybrids put one attention layer among several Mamba layers)."""
    kinds = [draw(st.sampled_from((mamba, mamba, attention)), label=f"{label}[{i}]") for i in range(n)]
    at = draw(st.integers(0, n - 1), label=f"{label} attention at")
    kinds[at] = attention
    if mamba not in kinds:
        kinds[(at + 1) % n] = mamba
    return kinds


def _attention_dims(draw: st.DrawFn) -> dict[str, Any]:
    heads = draw(st.sampled_from((2, 4)), label="num_attention_heads")
    kv = draw(st.sampled_from((1, 2)), label="num_key_value_heads")
    head_dim = draw(st.sampled_from((32, 64, 16)), label="head_dim")
    return dict(hidden_size=64, num_attention_heads=heads, num_key_value_heads=min(kv, heads), head_dim=head_dim)


@st.composite
def _nemotron_h(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(2, 6), label="layers")
    kinds = _pattern(draw, n, "M", "*", "layer")
    # An MLP layer ("-") sometimes, as real NemotronH interleaves them.
    if draw(st.booleans(), label="with an MLP layer"):
        kinds.append("-")
    return dict(
        architectures=["NemotronHForCausalLM"],
        model_type="nemotron_h",
        num_hidden_layers=len(kinds),
        hybrid_override_pattern="".join(kinds),
        mamba_num_heads=draw(st.sampled_from((4, 2, 8)), label="mamba_num_heads"),
        mamba_head_dim=draw(st.sampled_from((16, 8, 32)), label="mamba_head_dim"),
        ssm_state_size=draw(st.sampled_from((16, 8, 32)), label="ssm_state_size"),
        n_groups=1,
        conv_kernel=4,
        expand=1,
        chunk_size=64,
        intermediate_size=128,
        **_attention_dims(draw),
        **_COMMON,
    )


@st.composite
def _jamba(draw: st.DrawFn) -> dict[str, Any]:
    period = draw(st.integers(2, 4), label="attn_layer_period")
    n = period * draw(st.integers(1, 2), label="periods")
    return dict(
        architectures=["JambaForCausalLM"],
        model_type="jamba",
        num_hidden_layers=n,
        attn_layer_period=period,
        attn_layer_offset=draw(st.integers(0, period - 1), label="attn_layer_offset"),
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=1,
        num_experts_per_tok=1,
        mamba_d_state=draw(st.sampled_from((8, 16)), label="mamba_d_state"),
        mamba_d_conv=4,
        mamba_expand=draw(st.sampled_from((1, 2)), label="mamba_expand"),
        mamba_dt_rank=8,
        intermediate_size=128,
        **_attention_dims(draw),
        **_COMMON,
    )


def _qwen_linear(draw: st.DrawFn, arch: str, model_type: str) -> dict[str, Any]:
    interval = draw(st.integers(2, 4), label="full_attention_interval")
    n = interval * draw(st.integers(1, 2), label="intervals")
    layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    return dict(
        architectures=[arch],
        model_type=model_type,
        num_hidden_layers=n,
        layer_types=layer_types,
        full_attention_interval=interval,
        linear_num_key_heads=draw(st.sampled_from((2, 4)), label="linear_num_key_heads"),
        linear_num_value_heads=4,
        linear_key_head_dim=draw(st.sampled_from((16, 32)), label="linear_key_head_dim"),
        linear_value_head_dim=draw(st.sampled_from((16, 32)), label="linear_value_head_dim"),
        linear_conv_kernel_dim=4,
        intermediate_size=128,
        **_attention_dims(draw),
        **_COMMON,
    )


@st.composite
def _qwen3_next(draw: st.DrawFn) -> dict[str, Any]:
    cfg = _qwen_linear(draw, "Qwen3NextForCausalLM", "qwen3_next")
    cfg.update(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=64, shared_expert_intermediate_size=64,
               decoder_sparse_step=1, norm_topk_prob=True)
    return cfg


@st.composite
def _qwen3_5(draw: st.DrawFn) -> dict[str, Any]:
    return _qwen_linear(draw, "Qwen3_5ForCausalLM", "qwen3_5_text")


def _mamba2_heads(draw: st.DrawFn) -> dict[str, int]:
    # heads * head dim = mamba_expand * hidden_size (64), which the configs check.
    heads = draw(st.sampled_from((4, 8, 2)), label="mamba_n_heads")
    return dict(mamba_n_heads=heads, mamba_d_head=64 // heads)


@st.composite
def _granite_4_h(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(2, 6), label="layers")
    kinds = _pattern(draw, n, "mamba", "attention", "layer")
    return dict(
        architectures=["GraniteMoeHybridForCausalLM"],
        model_type="granitemoehybrid",
        num_hidden_layers=n,
        layer_types=kinds,
        **_mamba2_heads(draw),
        mamba_d_state=draw(st.sampled_from((16, 8, 32)), label="mamba_d_state"),
        mamba_n_groups=1,
        mamba_d_conv=4,
        mamba_expand=1,
        mamba_chunk_size=64,
        num_local_experts=0,
        shared_intermediate_size=128,
        intermediate_size=128,
        position_embedding_type="rope",
        **_attention_dims(draw),
        **_COMMON,
    )


@st.composite
def _falcon_h1(draw: st.DrawFn) -> dict[str, Any]:
    return dict(
        architectures=["FalconH1ForCausalLM"],
        model_type="falcon_h1",
        num_hidden_layers=draw(st.integers(1, 3), label="layers"),
        mamba_d_ssm=64,
        **_mamba2_heads(draw),
        mamba_d_state=draw(st.sampled_from((16, 8, 32)), label="mamba_d_state"),
        mamba_n_groups=1,
        mamba_d_conv=4,
        mamba_expand=1,
        mamba_chunk_size=64,
        intermediate_size=128,
        **_attention_dims(draw),
        **_COMMON,
    )


@st.composite
def _gemma_3(draw: st.DrawFn) -> dict[str, Any]:
    every = draw(st.integers(2, 6), label="sliding_window_pattern")
    n = every * draw(st.integers(1, 2), label="periods")
    return dict(
        architectures=["Gemma3ForCausalLM"],
        model_type="gemma3_text",
        num_hidden_layers=n,
        layer_types=["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)],
        sliding_window=draw(st.sampled_from((32, 64, 16, 128, 48)), label="sliding_window"),
        intermediate_size=128,
        query_pre_attn_scalar=32,
        **_attention_dims(draw),
        **_COMMON,
    )


@st.composite
def _gpt_oss(draw: st.DrawFn) -> dict[str, Any]:
    n = 2 * draw(st.integers(1, 3), label="layer pairs")
    return dict(
        architectures=["GptOssForCausalLM"],
        model_type="gpt_oss",
        num_hidden_layers=n,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
        sliding_window=draw(st.sampled_from((128, 32, 64, 16)), label="sliding_window"),
        num_local_experts=2,
        num_experts_per_tok=1,
        intermediate_size=64,
        **_attention_dims(draw),
        **_COMMON,
    )


# name -> (config.json strategy, is a Mamba hybrid)
_BUILDERS: dict[str, tuple[Callable[[], st.SearchStrategy[dict[str, Any]]], bool]] = {
    "nemotron-h": (_nemotron_h, True),
    "jamba": (_jamba, True),
    "qwen3-next": (_qwen3_next, True),
    "qwen3.5": (_qwen3_5, True),
    "granite-4.0-h": (_granite_4_h, True),
    "falcon-h1": (_falcon_h1, True),
    "gemma-3": (_gemma_3, False),
    "gpt-oss": (_gpt_oss, False),
}
# vLLM's Qwen3.5 module imports its vision tower, which needs torchvision;
# without it vLLM cannot inspect the architecture (and retries for ~30 s).
ARCHITECTURES: tuple[str, ...] = tuple(
    name for name in _BUILDERS if name != "qwen3.5" or importlib.util.find_spec("torchvision") is not None
)


@st.composite
def _engine_models(draw: st.DrawFn, names: tuple[str, ...]) -> EngineDraw:
    # Mamba hybrids twice as often as sliding-window models: only they have
    # the sub-block hits the external-hit truncation branch is about.
    weighted = [n for n in names for _ in range(2 if _BUILDERS[n][1] else 1)]
    name = draw(st.sampled_from(weighted), label="architecture")
    builder, hybrid = _BUILDERS[name]
    cfg = draw(builder(), label=f"{name} config.json")
    # vLLM refuses float16 for Gemma-3 (numerical instability).
    dtypes = ("bfloat16", "float32") if name == "gemma-3" else ("bfloat16", "float16", "float32")
    dtype = draw(st.sampled_from(dtypes), label="--dtype")
    # --block-size: mostly the backend's choice; FlashAttention takes multiples of 16.
    block_size = draw(st.sampled_from((None, 16, None, 32, 64)), label="--block-size")
    # --prefix-match-unit: a finer hash unit (it must divide every block; all
    # blocks here are multiples of 16). Unset, the hash unit is the block and
    # no sub-block hit exists.
    unit = draw(st.sampled_from((4, 8, None, 2, 16, 1, 4)), label="--prefix-match-unit")
    mode, mamba_block = "none", None
    if hybrid:
        # "none" becomes "align" under prefix caching (MambaModelConfig).
        mode = draw(st.sampled_from(("none", "align")), label="--mamba-cache-mode")
        if block_size is not None and draw(st.integers(0, 3), label="set --mamba-block-size") == 1:
            mamba_block = block_size
    return EngineDraw.of(
        name,
        cfg,
        dtype=dtype,
        block_size=block_size,
        mamba_cache_mode=mode,
        mamba_block_size=mamba_block,
        prefix_match_unit=unit,
    )


@functools.cache
def engine_models(*, architectures: tuple[str, ...] = ARCHITECTURES) -> st.SearchStrategy[EngineDraw]:
    """Models of the named ``architectures`` (default: all of
    :data:`ARCHITECTURES`) with toy widths, a dtype and the cache flags.
    Shrinks to the first architecture, its fewest layers and default flags."""
    unknown = set(architectures) - set(_BUILDERS)
    if unknown or not architectures:
        raise ValueError(f"architectures={architectures}: need names from {tuple(_BUILDERS)}")
    return _engine_models(tuple(architectures))


# A configuration vLLM refused to plan: the scheduler build re-plans it and
# reports "config rejected" (counted in the share of built configurations).
_REFUSED = LayoutDraw((SpecDraw("FullAttentionSpec", 16),), hash_block_size=16, num_blocks=64)


def _layout_of(engine: EngineDraw, num_speculative_tokens: int = 0) -> LayoutDraw:
    plan = installed().plan_layout
    if plan is None:
        raise RuntimeError("no engine planner registered: import fuzz.adapter before drawing")
    return plan(engine, num_speculative_tokens) or _REFUSED


@functools.cache
def engine_scheduler_draws(
    *, architectures: tuple[str, ...] = ARCHITECTURES
) -> st.SearchStrategy[SchedulerDraw]:
    """Scheduler configurations whose layout vLLM's engine planned from an
    :func:`engine_models` draw (the scheduler flags as
    :func:`strategies.scheduler.scheduler_draws`, plus async scheduling for
    half and a prefill cadence for three in eight)."""
    models = engine_models(architectures=architectures)
    # Async scheduling (the engine's default) for half of them, drawn before
    # the model: drawn inside the flatmap, far fewer than half came out async
    # in the single-shot scenarios; drawn after the model (whose draws vary
    # in length), 20% of CI's 150 derandomized examples were async once
    # prompts drew decode lengths. Shrinks to sync. Three in eight hold local
    # prefills back to every 2nd-4th step (--prefill-schedule-interval);
    # shrinks to 1.
    cadences = st.sampled_from((1, 1, 2, 1, 3, 1, 4, 1))
    # One in four speculates with "ngram" (prompt lookup: no drafter layers,
    # so the planned layout only gains the Mamba layers' speculative state
    # blocks, which the planner builds as vLLM's MambaBase does). EAGLE is
    # not drawn here: its drafter's own attention layers are not planned.
    return st.tuples(st.booleans(), models, cadences).flatmap(
        lambda drawn: scheduler_draws(
            layouts=st.just(_layout_of(drawn[1])), speculative=True, drafters=("ngram",)
        ).map(lambda d: _engine_flags(d, drawn[1], drawn[0], drawn[2]))
    )


def _engine_flags(draw: SchedulerDraw, engine: EngineDraw, async_scheduling: bool, interval: int) -> SchedulerDraw:
    """``draw`` for ``engine``'s planned layout, with the async-scheduling
    and cadence flags drawn beside the model. A speculating draw takes the
    layout planned with its drafts (they change the Mamba state shapes, so
    the block sizes). vLLM refuses ngram with async scheduling on the V1
    runner: such a draw runs the V2 one."""
    runner = draw.model_runner
    if draw.speculative_method == "ngram" and async_scheduling and runner == "v1":
        runner = "v2"
    layout = draw.layout
    if draw.speculative_method is not None:
        layout = _layout_of(engine, draw.num_speculative_tokens)
    return dataclasses.replace(
        draw,
        layout=layout,
        engine=engine,
        async_scheduling=async_scheduling,
        prefill_schedule_interval=interval,
        model_runner=runner,
    )


def _fit_max_model_len(scenario: SingleShotScenario) -> SingleShotScenario:
    """``--max-model-len`` = the longest request of the scenario (vLLM refuses
    to start when the pool cannot hold one max_model_len request), and at
    least the long-prefill threshold (which vLLM caps by it)."""
    prompts = (*scenario.fills, scenario.replay, *((scenario.probe,) if scenario.probe else ()))
    longest = max(p.prefix + p.suffix + p.max_tokens for p in prompts)
    config = scenario.config
    layout = dataclasses.replace(config.layout, max_model_len=max(longest, config.long_prefill_token_threshold))
    return dataclasses.replace(scenario, config=dataclasses.replace(config, layout=layout))


@functools.cache
def engine_single_shot_scenarios(
    *, architectures: tuple[str, ...] = ARCHITECTURES
) -> st.SearchStrategy[SingleShotScenario]:
    """Single-shot scenarios (:func:`strategies.scheduler.single_shot_scenarios`,
    tail, inside and free flavours, over-reports allowed, no evict shortcut)
    over :func:`engine_scheduler_draws`, with ``--max-model-len`` set to the
    scenario's longest request."""
    return single_shot_scenarios(
        configs=engine_scheduler_draws(architectures=architectures),
        shortcut=False,
        flavours={"tail": 4, "inside": 1, "free": 1},
    ).map(_fit_max_model_len)


def named_engine_models() -> dict[str, EngineDraw]:
    """A handful of named real model shapes (layer pattern and flags of the
    published configs, toy widths), for pinned examples and the
    planning-equivalence test."""
    nemotron = dict(
        architectures=["NemotronHForCausalLM"], model_type="nemotron_h", num_hidden_layers=8,
        hybrid_override_pattern="M-M-M*-M", mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16,
        n_groups=1, conv_kernel=4, expand=1, chunk_size=64, intermediate_size=128,
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, **_COMMON,
    )
    jamba = dict(
        architectures=["JambaForCausalLM"], model_type="jamba", num_hidden_layers=8, attn_layer_period=8,
        attn_layer_offset=4, expert_layer_period=2, expert_layer_offset=1, num_experts=1, num_experts_per_tok=1,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8, intermediate_size=128,
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, **_COMMON,
    )
    qwen3_next = dict(
        architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], full_attention_interval=4,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, intermediate_size=128, num_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, decoder_sparse_step=1, norm_topk_prob=True,
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=64, **_COMMON,
    )
    gemma = dict(
        architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=6,
        layer_types=["sliding_attention"] * 5 + ["full_attention"], sliding_window=64, intermediate_size=128,
        query_pre_attn_scalar=32, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        **_COMMON,
    )
    gpt_oss = dict(
        architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=128, num_local_experts=2,
        num_experts_per_tok=1, intermediate_size=64, hidden_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, **_COMMON,
    )
    return {
        "nemotron-h (pattern M-M-M*-M, prefix caching)": EngineDraw.of("nemotron-h", nemotron),
        "nemotron-h --prefix-match-unit 8": EngineDraw.of("nemotron-h", nemotron, prefix_match_unit=8),
        "jamba (1 attention in 8)": EngineDraw.of("jamba", jamba),
        "qwen3-next (3 GDN : 1 full)": EngineDraw.of("qwen3-next", qwen3_next, prefix_match_unit=16),
        "gemma-3 (5 sliding : 1 full)": EngineDraw.of("gemma-3", gemma),
        "gpt-oss (alternating sliding 128)": EngineDraw.of("gpt-oss", gpt_oss, block_size=16),
    }
