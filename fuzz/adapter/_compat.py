"""Every difference between the vLLM releases this suite supports (0.28-0.33).

The harnesses and the repro writer ask here, never ``hasattr`` inline: a new
vLLM release that moves an API is one edit in this file. Each entry says
which releases differ and how.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

from fuzz.adapter._env import VLLM_VERSION, sha256

import vllm.config.vllm as _vllm_config_mod  # noqa: E402
from vllm.v1.core import kv_cache_coordinator as _coordinators  # noqa: E402
from vllm.v1.core import kv_cache_utils as _kcu  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402

__all__ = [
    "CAPABILITIES",
    "Capability",
    "HAS_FAILED_RECVING",
    "HAS_SKIP_READING_PREFIX_CACHE",
    "missing_capabilities",
    "HAS_SPEC_REGISTRY",
    "cache_hit_limit",
    "declared_defaults",
    "lora_kw",
    "prompt_embeds",
    "request_lora_kw",
    "request_mm_kw",
    "grant_encoder_budget",
    "eagle_drop_group_ids",
    "eagle_manager_kwargs",
    "flag_draft_groups",
    "hand_off_clipped",
    "has_sync_kv_loads",
    "has_per_group_lookup",
    "inspect_models_in_process",
    "model_runner",
    "partial_hits_enabled",
    "prefix_cacheable",
    "record_resolved_sizes",
    "resolver_config",
    "spec_registry",
]

@dataclasses.dataclass(frozen=True)
class Capability:
    """A vLLM API a target cannot run without: checked once, up front."""

    api: str  # what the suite calls, for the one-line message
    since: str  # the first release known to have it
    owner: Any
    attribute: str

    def present(self) -> bool:
        return hasattr(self.owner, self.attribute)


try:
    from vllm.v1.core import kv_cache_planning as _planning
except ImportError:  # releases that plan KV caches in kv_cache_utils only
    _planning = None

CAPABILITIES: dict[str, Capability] = {
    "truncate": Capability(
        "KVCacheManager.truncate_computed_blocks", "0.27.1", KVCacheManager, "truncate_computed_blocks"
    ),
    "connector-lookup": Capability(
        "KVCacheManager.get_computed_blocks_for_connector",
        "0.27.1",
        KVCacheManager,
        "get_computed_blocks_for_connector",
    ),
    "per-group-lookup": Capability(
        "HybridKVCacheCoordinator.find_longest_cache_hit_per_group",
        "0.27.1",
        getattr(_coordinators, "HybridKVCacheCoordinator", None),
        "find_longest_cache_hit_per_group",
    ),
    "local-prefix-hit": Capability(
        "Scheduler._get_local_prefix_cache_hit", "0.28.0", Scheduler, "_get_local_prefix_cache_hit"
    ),
    # The engine-reachable target plans configs with the engine's own code
    # (fuzz/adapter/_engine_plan.py), written against 0.33.0's planning module.
    "engine-planning": Capability(
        "vllm.v1.core.kv_cache_planning.get_kv_cache_configs", "0.33.0", _planning, "get_kv_cache_configs"
    ),
}


def missing_capabilities(needs: tuple[str, ...]) -> list[str]:
    """One line for each of ``needs`` the installed vLLM lacks."""
    unknown = [n for n in needs if n not in CAPABILITIES]
    if unknown:
        raise KeyError(f"unknown capabilities {unknown}; known: {sorted(CAPABILITIES)}")
    return [
        f"vLLM {VLLM_VERSION} has no {CAPABILITIES[n].api} (present from {CAPABILITIES[n].since})"
        for n in needs
        if not CAPABILITIES[n].present()
    ]


# 0.30+: KVConnectorOutput.failed_recving (older releases cannot be told an
# async load failed; there the load simply completes).
HAS_FAILED_RECVING = "failed_recving" in {f.name for f in dataclasses.fields(KVConnectorOutput)}


# KVCacheManager.get_block_ids_for_computed_tokens: request_finished is handed,
# per attention group, the blocks that cover num_computed_tokens (every other
# group its whole table). A release without it is not held to that contract
# (fuzz/adapter/_handoff.py records no hand-off there).
def hand_off_clipped(spec: Any) -> bool | None:
    """Whether ``_connector_finished`` clips a group of ``spec`` to the
    computed tokens (None: the release states no such contract)."""
    if not hasattr(KVCacheManager, "get_block_ids_for_computed_tokens"):
        return None
    from vllm.v1.kv_cache_interface import AttentionSpec, CrossAttentionSpec, EncoderOnlyAttentionSpec

    return isinstance(spec, AttentionSpec) and not isinstance(spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec))


# SamplingParams.skip_reading_prefix_cache: a release without it cannot be
# asked to skip the prefix cache, so the harness builds such requests plain
# (and records them so: no check then expects a skip).
HAS_SKIP_READING_PREFIX_CACHE = "skip_reading_prefix_cache" in getattr(SamplingParams, "__struct_fields__", ())


# SchedulerConfig.prefill_schedule_interval (the local prefill cadence): a
# release without it admits prefills every step, so a drawn cadence is built
# as the default there.
def prefill_cadence_kw(interval: int) -> dict[str, int]:
    from vllm.config import SchedulerConfig

    known = {f.name for f in dataclasses.fields(SchedulerConfig)} if dataclasses.is_dataclass(SchedulerConfig) else set()
    return {"prefill_schedule_interval": interval} if interval > 1 and "prefill_schedule_interval" in known else {}


def has_sync_kv_loads(scheduler_output: Any) -> bool | None:
    """``SchedulerOutput.has_sync_kv_loads`` (0.29+); None on 0.28, which
    has no such field."""
    return getattr(scheduler_output, "has_sync_kv_loads", None)


def spec_registry() -> Any | None:
    """vLLM's KV-cache spec registry module (0.32+), else None."""
    try:
        from vllm.v1 import kv_cache_spec_registry
    except ImportError:
        return None
    return kv_cache_spec_registry


HAS_SPEC_REGISTRY = spec_registry() is not None


def prefix_cacheable(spec: Any) -> bool:
    """``KVCacheSpec.prefix_cacheable`` arrived in 0.29; before it every group
    with a manager was prefix-cacheable."""
    return bool(getattr(spec, "prefix_cacheable", True))


def cache_hit_limit(max_cache_hit_length: int | None) -> tuple[int, ...]:
    """The lookups take ``max_cache_hit_length`` from 0.33 on: forward it only
    when set (the scheduler passes None on older releases' paths)."""
    return () if max_cache_hit_length is None else (max_cache_hit_length,)


def has_per_group_lookup(coordinator: Any) -> bool:
    """Hybrid coordinators have ``find_longest_cache_hit_per_group``; the
    unitary coordinator (one group) does not: its joint hit is per group."""
    return hasattr(coordinator, "find_longest_cache_hit_per_group")


def partial_hits_enabled(coordinator: Any) -> bool:
    """Sub-block ("partial") hash hits: a coordinator flag from 0.32 on."""
    return bool(getattr(coordinator, "enable_partial_hash_hits", False))


def flag_draft_groups(kv_config: Any, group_ids: tuple[int, ...]) -> None:
    """Mark the groups holding draft layers, as the engine's KV-cache planning
    does when the drafter takes the EAGLE block drop. ``is_eagle_group`` is a
    0.33 field; older releases have no per-group flag (their coordinators
    apply ``use_eagle`` to every group), so there is nothing to mark."""
    for i, group in enumerate(kv_config.kv_cache_groups):
        if hasattr(group, "is_eagle_group"):
            group.is_eagle_group = i in group_ids


_MANAGER_PARAMS = frozenset(inspect.signature(KVCacheManager.__init__).parameters)


def eagle_manager_kwargs(use_eagle: bool) -> dict[str, Any]:
    """What the scheduler passes the ``KVCacheManager`` for an EAGLE-style
    drafter: ``use_eagle`` (every supported release) and one prefill lookahead
    token (``num_prefill_lookahead``, on releases whose manager takes it)."""
    if not use_eagle:
        return {}
    kwargs: dict[str, Any] = {"use_eagle": True}
    if "num_prefill_lookahead" in _MANAGER_PARAMS:
        kwargs["num_prefill_lookahead"] = 1
    return kwargs


def eagle_drop_group_ids(coordinator: Any) -> frozenset[int]:
    """The groups whose lookups take the EAGLE last-block drop: the
    coordinator's ``drop_eagle_group_ids`` (0.33); on older releases every
    group when ``use_eagle`` is on."""
    ids = getattr(coordinator, "drop_eagle_group_ids", None)
    if ids is not None:
        return frozenset(ids)
    if getattr(coordinator, "use_eagle", False):
        return frozenset(range(len(coordinator.kv_cache_config.kv_cache_groups)))
    return frozenset()


def resolver_config(*, block_size: int, prefix_match_unit: int | None) -> Any:
    """The part of a ``VllmConfig`` that ``resolve_kv_cache_block_sizes``
    reads (every supported release reads these fields and no others), so the
    truncation tier can ask the resolver without building a model config."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(
            block_size=block_size,
            enable_prefix_caching=True,
            prefix_match_unit=prefix_match_unit,
            mamba_cache_mode="align",
        ),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        kv_transfer_config=None,
    )


def record_resolved_sizes(kv_config: Any, vllm_config: Any) -> tuple[int, int]:
    """What the engine's KV-cache planning writes onto the KV-cache config,
    release by release; returns (scheduler block size, hash block size).

    * the cache config's retention interval (0.29+; default 0: only semantic
      Mamba / sliding-window checkpoints are kept); the dataclass default
      None would keep one at every block;
    * ``hash_block_size`` (0.32+; older releases derive it);
    * ``cache_hit_alignment_tokens`` (releases with its resolver).
    """
    if hasattr(kv_config, "prefix_cache_retention_interval") and hasattr(
        vllm_config.cache_config, "prefix_cache_retention_interval"
    ):
        kv_config.prefix_cache_retention_interval = vllm_config.cache_config.prefix_cache_retention_interval
    sched_bs, hash_bs = _kcu.resolve_kv_cache_block_sizes(kv_config, vllm_config)
    if hasattr(kv_config, "hash_block_size"):
        kv_config.hash_block_size = hash_bs
    if hasattr(_kcu, "resolve_cache_hit_alignment_tokens"):
        kv_config.cache_hit_alignment_tokens = _kcu.resolve_cache_hit_alignment_tokens(
            kv_config, vllm_config, sched_bs, hash_bs
        )
    return sched_bs, hash_bs


@contextlib.contextmanager
def model_runner(choice: str | None) -> Iterator[None]:
    """vLLM reads the model-runner choice from ``VLLM_USE_V2_MODEL_RUNNER``
    (every supported release) while it builds the config and the scheduler;
    set it for that long only.

    For V2, releases up to 0.32 also refuse the config when Triton is
    missing (``_validate_v2_model_runner``); the lean CPU install has no
    Triton, the GPU deployments this suite models do, and the scheduler never
    touches it, so the flag reads True for that long too. vLLM's other V2
    refusals (unsupported features) stand.
    """
    if choice is None:
        yield
        return
    if choice not in ("v1", "v2"):
        raise ValueError(f"model_runner must be 'v1', 'v2' or None, not {choice!r}")
    name = "VLLM_USE_V2_MODEL_RUNNER"
    saved = os.environ.get(name)
    saved_triton = getattr(_vllm_config_mod, "HAS_TRITON", None)
    os.environ[name] = "1" if choice == "v2" else "0"
    if choice == "v2" and saved_triton is False:
        _vllm_config_mod.HAS_TRITON = True
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
        if saved_triton is not None:
            _vllm_config_mod.HAS_TRITON = saved_triton


def prefix_cache_map(block_pool: Any) -> Any | None:
    """The block pool's prefix-cache map (key -> block, or block id ->
    block), None where a release keeps it otherwise."""
    cached = getattr(block_pool, "cached_block_hash_to_block", None)
    inner = getattr(cached, "_cache", cached)
    return inner if isinstance(inner, dict) else None


def hash_lookahead(scheduler: Any) -> int:
    """Tokens after each block its hash covers on ``scheduler``'s engine
    (``VllmConfig.num_hash_lookahead_tokens``: an EAGLE drafter without a KV
    connector, from 0.33.0); 0 where a release hashes blocks alone."""
    return int(getattr(scheduler, "num_hash_lookahead_tokens", 0) or 0)


def request_block_hasher(hash_block_size: int, lookahead: int = 0) -> Any:
    """A request's block hasher as ``EngineCore`` builds it for the engine's
    hash block size and hash lookahead (the suite's hash function)."""
    if lookahead:
        return _kcu.get_request_block_hasher(hash_block_size, sha256, lookahead)
    return _kcu.get_request_block_hasher(hash_block_size, sha256)


def group_of_key(key: Any) -> int:
    """The KV-cache group a prefix-cache key belongs to."""
    return int(_get_group_id(key))


from vllm.v1.core.kv_cache_utils import get_group_id as _get_group_id  # noqa: E402


def hash_of_key(key: Any) -> Any:
    """A prefix-cache key's block hash (its group id stripped)."""
    return _kcu.get_block_hash(key)


def external_hash(block_hash: Any) -> Any:
    """A block hash as KV events spell it (``BlockStored.block_hashes``)."""
    return _kcu.maybe_convert_block_hash(block_hash)


def event_key(key: Any) -> tuple[int, Any]:
    """A prefix-cache key as KV events spell it: (group, the external form of
    its hash that ``BlockStored`` / ``BlockRemoved`` carry)."""
    return int(_get_group_id(key)), _kcu.maybe_convert_block_hash(_kcu.get_block_hash(key))


def lora_kw(max_loras: int) -> dict[str, Any]:
    """``VllmConfig`` keywords of ``--enable-lora --max-loras N`` (0: none)."""
    if not max_loras:
        return {}
    from vllm.config import LoRAConfig

    return {"lora_config": LoRAConfig(max_loras=max_loras)}


def prompt_embeds(tag: str, num_tokens: int) -> Any:
    """The prompt-embeddings tensor of a request tagged ``tag``
    (:func:`fuzz.adapter._contents.prompt_embedding_rows`)."""
    import torch

    from fuzz.adapter._contents import prompt_embedding_rows

    return torch.tensor(prompt_embedding_rows(tag, num_tokens), dtype=torch.float32)


def request_mm_kw(items: Sequence[tuple[str, int, int]]) -> dict[str, Any]:
    """``Request`` keywords for a prompt carrying the multimodal ``items``
    ((identifier, placeholder offset, placeholder length) each; none: no
    keywords): one ``MultiModalFeatureSpec`` per item, with no data (the
    scheduler reads only the identifier and the placeholder)."""
    if not items:
        return {}
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return {"mm_features": [
        MultiModalFeatureSpec(data=None, modality="image", identifier=name,
                              mm_position=PlaceholderRange(offset=offset, length=length))
        for name, offset, length in items
    ]}


def grant_encoder_budget(scheduler: Any, item_tokens: int) -> None:
    """Give ``scheduler`` the encoder budget a multimodal model's has, for
    items of up to ``item_tokens`` placeholder tokens: vLLM's
    ``MultiModalBudget`` sizes both the per-step encoder compute budget and
    the encoder cache at no less than the batch's token budget or one item.
    A text model's scheduler has none (no request could reach its first
    placeholder); it is granted before the first multimodal request, while
    the encoder cache is still unused, which is the state construction
    leaves. Idempotent."""
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

    size = max(scheduler.scheduler_config.max_num_batched_tokens, item_tokens)
    if getattr(scheduler, "max_num_encoder_input_tokens", 0) < size:
        scheduler.max_num_encoder_input_tokens = size
        scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=size)


def request_lora_kw(name: str | None) -> dict[str, Any]:
    """``Request`` keywords for a request under the LoRA adapter ``name``
    (None: none): its ``LoRARequest``, with an id and a path of its own
    (vLLM hashes both name and path into every block)."""
    if name is None:
        return {}
    from vllm.lora.request import LoRARequest

    from fuzz.adapter._contents import lora_identity

    return {"lora_request": LoRARequest(*lora_identity(name))}


def kv_events_kw(enabled: bool) -> dict[str, Any]:
    """``VllmConfig`` keywords that turn vLLM's KV-cache events on: the
    scheduler's block pool queues them and ``update_from_output()`` hands
    each step's batch to the publisher (the harness stands in for it)."""
    if not enabled:
        return {}
    from vllm.config import KVEventsConfig

    return {"kv_events_config": KVEventsConfig(enable_kv_cache_events=True, publisher="null")}


def observability_kw(metrics: bool, speculative: bool) -> dict[str, Any]:
    """``VllmConfig`` keywords of the metrics a serving deployment asks for:
    ``--kv-cache-metrics`` with every block sampled (the block pool reports
    allocations, hits and evictions to the collector) and, with speculative
    decoding (vLLM refuses them without) and where the release has them,
    per-request speculative-decoding metrics."""
    if not metrics:
        return {}
    from vllm.config import ObservabilityConfig

    wanted: dict[str, Any] = {"kv_cache_metrics": True, "kv_cache_metrics_sample": 1.0}
    if speculative:
        wanted["per_request_spec_decode_metrics"] = "detailed"
    known = {f.name for f in dataclasses.fields(ObservabilityConfig)}
    return {"observability_config": ObservabilityConfig(**{k: v for k, v in wanted.items() if k in known})}


def declared_defaults(qualified_names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per vLLM dataclass named (``"vllm.config.CacheConfig"``), keyed by its
    class name, the default each field declares (a pydantic ``Field``'s own
    default; fields with none or a factory left out): what a repro file may
    leave unsaid. All releases."""
    import importlib

    out: dict[str, dict[str, Any]] = {}
    for qualified in qualified_names:
        module, _, name = qualified.rpartition(".")
        declared = {}
        for f in dataclasses.fields(getattr(importlib.import_module(module), name)):
            default = getattr(f.default, "default", f.default)  # FieldInfo(default=...) or the value itself
            if default is not dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                if type(default).__module__ != "pydantic_core":  # PydanticUndefined: none declared
                    declared[f.name] = default
        out[name] = declared
    return out


_INSPECTED: set[str] = set()  # architectures inspect_models_in_process has seen to


def inspect_models_in_process(model_dir: str) -> None:
    """Let vLLM learn about the model classes a local ``config.json`` names
    in this process, before ``ModelConfig`` asks.

    vLLM's registry inspects a lazily registered model class in a fresh
    subprocess that imports vLLM again (so that a GPU worker never
    initialises CUDA early), and caches the answer in ``VLLM_CACHE_ROOT``:
    on a fresh machine every architecture a worker meets first costs about
    6 s here, which took 13 of a default 60 s campaign's seconds (a quarter
    of the budget, all charged to the first scheduler targets). The suite
    never touches CUDA, and importing the class here costs 0.2-0.4 s for all
    of them. ``ModelRegistry.register_model(arch, cls)`` is vLLM's public
    hook for a class already imported; it computes the same ``_ModelInfo``
    the subprocess would. All releases."""
    import json

    from vllm.model_executor.models.registry import ModelRegistry

    with open(os.path.join(model_dir, "config.json")) as f:
        architectures = json.load(f).get("architectures") or ()
    for arch in architectures:
        if arch in _INSPECTED or arch not in ModelRegistry.models:
            continue  # unknown architectures: ModelConfig says so itself
        entry = ModelRegistry.models[arch]
        load = getattr(entry, "load_model_cls", None)
        if load is not None and not hasattr(entry, "model_cls"):  # lazily registered
            ModelRegistry.register_model(arch, load())
        _INSPECTED.add(arch)

