"""The scheduler a standalone repro drives, built in vLLM's tests/v1/core idiom.

Everything drawn is data (:mod:`fuzz.kit._params`): the groups, the pool,
the scheduler's budgets and prefill cadence, async scheduling, speculative
decoding and the connector's role.
"""

from __future__ import annotations

import json

import torch

from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVEventsConfig,
    ObservabilityConfig,
    KVTransferConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager
from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, get_request_block_hasher
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from fuzz.adapter._contents import lora_identity, prompt_embedding_rows
from fuzz.kit._params import (
    ASYNC_SCHEDULING,
    BLOCK_SIZE,
    CACHE_SALTS,
    CONNECTOR,
    DRAFT_MODEL_CONFIG,
    ENGINE_METRICS,
    FINISHED_SETS,
    HASH_BLOCK_SIZE,
    KV_CONFIG_FIELDS,
    KV_EVENTS,
    KV_LOAD_FAILURE_POLICY,
    KV_ROLE,
    LONG_PREFILL_TOKEN_THRESHOLD,
    MAX_LORAS,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    MODEL_CONFIG,
    MULTIMODAL,
    NUM_BLOCKS,
    NUM_SPECULATIVE_TOKENS,
    PREFILL_SCHEDULE_INTERVAL,
    PREFIX_MATCH_UNIT,
    PROMPT_EMBEDS,
    ROLES,
    SCHEDULER_BLOCK_SIZE,
    SKIPS_PREFIX_CACHE,
    SPECS,
    SPECULATIVE_METHOD,
)


def _make_model_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return ModelConfig(
        model=str(tmp_path),
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=MAX_MODEL_LEN,
    )


def _make_kv_cache_config():
    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"g{i}.layer"], spec) for i, spec in enumerate(SPECS)],
    )
    config = generate_scheduler_kv_cache_config([config])
    for name, value in KV_CONFIG_FIELDS.items():
        setattr(config, name, value)
    return config


def _speculative_config(tmp_path, model_config):
    """SpeculativeConfig as EngineArgs.create_speculative_config builds it."""
    parallel_config = ParallelConfig()
    draft = {}
    if SPECULATIVE_METHOD == "eagle":
        (tmp_path / "draft").mkdir()
        (tmp_path / "draft" / "config.json").write_text(json.dumps(DRAFT_MODEL_CONFIG))
        draft["model"] = str(tmp_path / "draft")
    return {
        "parallel_config": parallel_config,
        "speculative_config": SpeculativeConfig(
            method=SPECULATIVE_METHOD,
            num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
            target_model_config=model_config,
            target_parallel_config=parallel_config,
            **draft,
        ),
    }


def _make_scheduler(tmp_path):
    model_config = _make_model_config(tmp_path)
    speculation = {}
    if SPECULATIVE_METHOD is not None:
        speculation = _speculative_config(tmp_path, model_config)
    cache = {}
    if PREFIX_MATCH_UNIT is not None:  # --prefix-match-unit: prefix-cache keys every PREFIX_MATCH_UNIT tokens
        cache["prefix_match_unit"] = PREFIX_MATCH_UNIT
    transfer = {}
    if CONNECTOR:
        transfer = {
            "kv_transfer_config": KVTransferConfig(
                kv_connector="ScriptedConnector",
                kv_connector_module_path=__name__,  # this file
                kv_role=KV_ROLE,
                kv_load_failure_policy=KV_LOAD_FAILURE_POLICY,
            ),
        }
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            max_model_len=MAX_MODEL_LEN,
            long_prefill_token_threshold=LONG_PREFILL_TOKEN_THRESHOLD,
            prefill_schedule_interval=PREFILL_SCHEDULE_INTERVAL,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            async_scheduling=ASYNC_SCHEDULING,  # False: --no-async-scheduling, one batch in flight
        ),
        cache_config=CacheConfig(
            block_size=BLOCK_SIZE,
            enable_prefix_caching=True,
            mamba_cache_mode="align",
            cache_dtype="auto",
            **cache,
        ),
        device_config=DeviceConfig(device="cpu"),
        **speculation,
        **transfer,
    )
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False  # as on GPU (a CPU install turns it off)
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    if MAX_LORAS:
        # --enable-lora: the scheduler batches requests of at most MAX_LORAS adapters.
        vllm_config.lora_config = LoRAConfig(max_loras=MAX_LORAS)
    if KV_EVENTS:
        # --kv-events-config: the block pool queues KV events and
        # update_from_output() hands each step's batch to the publisher.
        vllm_config.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    if ENGINE_METRICS:
        # --kv-cache-metrics (every block sampled); per-request spec-decode
        # metrics only with a speculative config (vLLM refuses them without).
        metrics = {"per_request_spec_decode_metrics": "detailed"} if SPECULATIVE_METHOD is not None else {}
        vllm_config.observability_config = ObservabilityConfig(
            kv_cache_metrics=True, kv_cache_metrics_sample=1.0, **metrics
        )
    scheduler = vllm_config.scheduler_config.get_scheduler_cls()(  # as EngineCore: AsyncScheduler if async
        vllm_config=vllm_config,
        kv_cache_config=_make_kv_cache_config(),
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZE,
        log_stats=ENGINE_METRICS,  # True: stats returned as the engine without --disable-log-stats
        include_finished_set=FINISHED_SETS,
    )
    if MULTIMODAL:
        # A multimodal model's encoder budget and cache (a text model's
        # scheduler has none): at least the batch's tokens or one item, as
        # vLLM's MultiModalBudget sizes them.
        size = max(MAX_NUM_BATCHED_TOKENS, MULTIMODAL)
        scheduler.max_num_encoder_input_tokens = size
        scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=size)
    return scheduler


def _make_request(request_id, token_ids, max_tokens, **options):
    """A request decoding ``max_tokens`` tokens after ``token_ids``.

    Its options, each built only where the file's program uses it:
    skip_reading_prefix_cache, cache_salt, lora, embeds, mm."""
    sampling = {}  # SamplingParams' options
    extra = {}  # Request's
    if SKIPS_PREFIX_CACHE:
        # skip_reading_prefix_cache=True: the request must read no cached tokens.
        if options.get("skip_reading_prefix_cache"):
            sampling["skip_reading_prefix_cache"] = True
    if CACHE_SALTS:
        # cache_salt: its tenant's; vLLM folds it into the first block's hash.
        extra["cache_salt"] = options.get("cache_salt")
    if MAX_LORAS:
        # lora: the adapter it runs under; vLLM folds its name and path into every block's hash.
        if options.get("lora") is not None:
            extra["lora_request"] = LoRARequest(*lora_identity(options["lora"]))
    if MULTIMODAL:
        # mm: its images, (identifier, placeholder offset, placeholder length)
        # each; vLLM folds each identifier into every block its placeholder overlaps.
        extra["mm_features"] = [
            MultiModalFeatureSpec(data=None, modality="image", identifier=name,
                                  mm_position=PlaceholderRange(offset=offset, length=length))
            for name, offset, length in options.get("mm", ())
        ]
    if PROMPT_EMBEDS:
        # embeds: the tag of the prompt embeddings it sends instead of token ids
        # (token_ids then only count them); vLLM hashes each block's slice.
        if options.get("embeds") is not None:
            rows = torch.tensor(prompt_embedding_rows(options["embeds"], len(token_ids)), dtype=torch.float32)
            return Request(
                request_id=request_id, prompt_token_ids=None, prompt_embeds=rows,
                sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True), pooling_params=None,
                block_hasher=get_request_block_hasher(HASH_BLOCK_SIZE, sha256), **extra,
            )
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling),
        pooling_params=None,
        block_hasher=get_request_block_hasher(HASH_BLOCK_SIZE, sha256),
        **extra,
    )


def _ids(blocks):
    return [[b.block_id for b in group] for group in blocks.blocks]



def _describe_groups():
    return ", ".join(
        f"group {i} {type(s).__name__} (block_size={s.block_size}, {r})" for i, (s, r) in enumerate(zip(SPECS, ROLES))
    )
