"""The real vLLM ``Scheduler``, built offline the way the engine core builds it.

:class:`SchedulerHarness` turns a :class:`SchedulerDraw` (our description of
a configuration) into a real ``vllm.v1.core.sched.scheduler.Scheduler`` with
the scripted KV connector of :mod:`fuzz.adapter._connector`, then drives it a
step at a time (``schedule()`` plus a ``ModelRunnerOutput`` fed back through
``update_from_output``) and reports what happened as plain dataclasses.

Construction follows ``EngineCore`` (``vllm/v1/engine/core.py``):
``ModelConfig`` from a tiny ``config.json`` written locally (a real hybrid
``NemotronHForCausalLM`` for layouts with a Mamba group, ``LlamaForCausalLM``
otherwise; never the hub), ``VllmConfig`` with prefix caching, chunked prefill
and a ``KVTransferConfig`` naming the connector by module path, then the
engine's own post-profiling steps: ``num_gpu_blocks``, ``block_size`` = the
smallest prefix-cacheable group block, ``validate_block_size()``,
``resolve_kv_cache_block_sizes`` and the resolved hash size written back onto
the KV-cache config. ``ModelConfig`` and ``VllmConfig`` are built once per
process (per distinct settings) and reused.

Observation is by wrapping four calls on the scheduler *instance* (the class
is untouched, so planted bugs still apply): the local prefix lookup, the
manager's ``get_computed_blocks`` (to see the divergent-hit fallback),
``truncate_computed_blocks`` and ``allocate_slots``. The wrappers record
arguments and results and call through; they change nothing.

Planted scheduler bugs (:func:`planted_scheduler_bug`) recompile
``Scheduler.schedule`` from its own source with one small edit, so the suite
can show each invariant failing on the path the real bug lives on.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import inspect
import itertools
import json
import os
import shutil
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fuzz.adapter import _connector
from fuzz.adapter._kv import (
    spec_prefix_cacheable,
    InvalidLayout,
    VLLM_VERSION,
    _kv_cache_config,
    init_hashing,
    planted_truncate_bug,
    qualified_name,
)
from fuzz.model import GroupInfo, LayoutDraw, SpecDraw

import vllm.config.vllm as _vllm_config_mod  # noqa: E402
import vllm.v1.core.sched.scheduler as _sched_mod  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core import kv_cache_utils as _kcu  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402

_KVCO_HAS_FAILED = "failed_recving" in {f.name for f in dataclasses.fields(KVConnectorOutput)}


def _optional(max_cache_hit_length: int | None) -> tuple[int, ...]:
    """Forward ``max_cache_hit_length`` only when set: before vLLM 0.33 the
    lookups take no such argument."""
    return () if max_cache_hit_length is None else (max_cache_hit_length,)
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

__all__ = [
    "AdmissionObservation",
    "PLANTED_SCHEDULER_BUGS",
    "PoolObservation",
    "SchedulerDraw",
    "SchedulerHarness",
    "StepObservation",
    "planted_scheduler_bug",
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
}


@functools.cache
def _models_dir() -> str:
    path = tempfile.mkdtemp(prefix="kvtrunc-models-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def _model_config(kind: str) -> ModelConfig:
    directory = os.path.join(_models_dir(), kind)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(_MODEL_CONFIGS[kind], f)
    return ModelConfig(
        model=directory,
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=MAX_MODEL_LEN,
    )


# ---------------------------------------------------------------------------
# What a scenario draws
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SchedulerDraw:
    """A scheduler configuration: KV layout, budgets, connector capability."""

    layout: LayoutDraw
    max_num_batched_tokens: int = 64
    max_num_seqs: int = 8
    long_prefill_token_threshold: int = 0
    divergent_hits: bool = True
    kv_load_failure_policy: str = "fail"
    # Which model runner the scheduler serves ("v1", "v2"; None: the
    # release's own choice on this machine). It changes what SchedulerOutput
    # looks like: with V2, requests resumed after a preemption are reported
    # as new requests; with V1, among the cached ones.
    model_runner: str | None = None

    @property
    def model(self) -> str:
        """A hybrid (Mamba) model for layouts with a Mamba group, else plain."""
        return "hybrid" if any("Mamba" in g.kind for g in self.layout.groups) else "plain"

    def __repr__(self) -> str:
        return (
            f"Scheduler({self.model}, {self.layout!r}, "
            f"max_num_batched_tokens={self.max_num_batched_tokens}, "
            f"max_num_seqs={self.max_num_seqs}, "
            f"long_prefill_token_threshold={self.long_prefill_token_threshold}, "
            f"connector.supports_divergent_local_hybrid_hits={self.divergent_hits}, "
            f"kv_load_failure_policy={self.kv_load_failure_policy!r}"
            f"{'' if self.model_runner is None else f', model_runner={self.model_runner!r}'})"
        )


# ---------------------------------------------------------------------------
# What the harness reports
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AdmissionObservation:
    """One waiting request's trip through the prefix-cache branch of
    ``schedule()``: the local lookup, the connector's answer, the allocation.

    Block ids are per KV-cache group; ``null_block_id`` marks padding (skipped
    sliding-window blocks, Mamba interior states).
    """

    request_id: str
    step: int
    num_tokens: int
    groups: tuple[GroupInfo, ...]
    # Per group, the attention span parameter that lets it skip old tokens:
    # ("sliding_window", W), ("attention_chunk_size", C), or None.
    spans: tuple[tuple[str, int] | None, ...]
    scheduler_block_size: int
    hash_block_size: int
    null_block_id: int
    divergent_capable: bool  # the connector's supports_divergent_local_hybrid_hits
    # The scheduler's local lookup (what _get_local_prefix_cache_hit returned).
    local_hit: int
    local_blocks: tuple[tuple[int, ...], ...]
    hit_diverged: bool
    # Side lookups taken at the same instant (pure; nothing is touched).
    per_group_hits: tuple[int, ...]
    joint_hit: int
    joint_blocks: tuple[tuple[int, ...], ...]
    # The connector's side.
    asked_with: int | None = None
    reply: int | None = None
    reply_honest: bool = True
    reply_async: bool = False
    # What the scheduler handed to allocate_slots (None: never got that far).
    alloc_local_tokens: int | None = None
    alloc_local_blocks: tuple[tuple[int, ...], ...] | None = None
    alloc_external_tokens: int | None = None
    alloc_ok: bool = False
    alloc_raised: bool = False
    # The outcome.
    admitted: bool = False
    num_computed_tokens: int | None = None
    connector_external_tokens: int | None = None
    block_table: tuple[tuple[int, ...], ...] = ()
    cow_dst_ids: frozenset[int] = frozenset()
    # Admitted again after a preemption (reported among the cached requests).
    resumed: bool = False
    # Labels only (the invariants never trust these).
    truncated_at: int | None = None
    fell_back: bool = False

    @property
    def partial_tail(self) -> int:
        return self.local_hit % self.scheduler_block_size

    def describe(self) -> str:
        kinds = [g.spec_class.rsplit(".", 1)[-1] for g in self.groups]
        lines = [
            f"request {self.request_id} (num_tokens={self.num_tokens}) admitted at step {self.step}:",
            f"  groups {list(zip(kinds, (g.block_size for g in self.groups)))}, "
            f"scheduler block {self.scheduler_block_size}, hash block {self.hash_block_size}",
            f"  local lookup: hit={self.local_hit} (partial tail {self.partial_tail}), "
            f"hit_diverged={self.hit_diverged}, per-group hits={list(self.per_group_hits)}, "
            f"joint hit={self.joint_hit}",
            f"  connector: get_num_new_matched_tokens(req, {self.asked_with}) -> "
            f"({self.reply}, async={self.reply_async}){'' if self.reply_honest else ' [over-report]'}",
            f"  allocate_slots(num_new_computed_tokens={self.alloc_local_tokens}, "
            f"num_external_computed_tokens={self.alloc_external_tokens}) -> "
            f"{'blocks' if self.alloc_ok else 'raised' if self.alloc_raised else 'None'}",
            f"  outcome: admitted={self.admitted}, num_computed_tokens={self.num_computed_tokens}, "
            f"connector told external={self.connector_external_tokens}"
            f"{' (resumed after preemption)' if self.resumed else ''}",
            f"  lookup blocks={[list(g) for g in self.local_blocks]}",
            f"  adopted blocks={None if self.alloc_local_blocks is None else [list(g) for g in self.alloc_local_blocks]}",
            f"  block table={[list(g) for g in self.block_table]}, CoW destinations={sorted(self.cow_dst_ids)}",
        ]
        if self.truncated_at is not None:
            lines.append(f"  truncate_computed_blocks(blocks, {self.truncated_at}) was called")
        if self.fell_back:
            lines.append("  the divergent-hit fallback (get_computed_blocks) ran")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class StepObservation:
    """One ``schedule()`` + ``update_from_output()``."""

    step: int
    admissions: tuple[AdmissionObservation, ...]
    error: str | None  # "ExcType: message" from schedule()/update_from_output()
    error_type: str | None
    error_where: str | None  # "schedule" or "update_from_output"
    dishonest_replies: tuple[str, ...]  # request ids given an over-report this step
    num_scheduled: dict[str, int]
    # (request id, num_computed_tokens, num_tokens) for each request scheduled
    # for the first time, or again after an async load or a preemption.
    newly_scheduled: tuple[tuple[str, int, int], ...]
    preempted: frozenset[str]
    finished: frozenset[str]
    context: str = dataclasses.field(default="", compare=False)
    # The step's copy-on-write block copies, (source, destination), in the
    # order SchedulerOutput.kv_cache_block_copies lists them.
    copies: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        lines = [f"step {self.step} on vLLM {VLLM_VERSION}: scheduled {self.num_scheduled}"]
        if self.preempted:
            lines.append(f"  preempted: {sorted(self.preempted)}")
        if self.error:
            lines.append(f"  {self.error_where}() raised {self.error}")
        if self.copies:
            lines.append("  block copies (src->dst): " + ", ".join(f"{a}->{b}" for a, b in self.copies))
        lines += [a.describe() for a in self.admissions]
        if self.context:
            lines.append(f"  scenario: {self.context}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class PoolObservation:
    """The block pool once no request holds blocks."""

    num_blocks: int
    num_free: int
    referenced: tuple[tuple[int, int], ...]  # (block_id, ref_cnt) with ref_cnt != 0
    live_requests: tuple[str, ...]
    context: str = dataclasses.field(default="", compare=False)


# ---------------------------------------------------------------------------
# Configuration caches
# ---------------------------------------------------------------------------

_VLLM_CONFIGS: dict[tuple[Any, ...], VllmConfig] = {}


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
    )
    config = _VLLM_CONFIGS.get(key)
    if config is None:
        config = VllmConfig(
            model_config=_model_config(draw.model),
            scheduler_config=SchedulerConfig(
                max_num_seqs=draw.max_num_seqs,
                max_num_batched_tokens=draw.max_num_batched_tokens,
                max_model_len=MAX_MODEL_LEN,
                long_prefill_token_threshold=draw.long_prefill_token_threshold,
                enable_chunked_prefill=True,
                is_encoder_decoder=False,
            ),
            cache_config=CacheConfig(
                block_size=block_size,
                enable_prefix_caching=True,
                mamba_cache_mode="align",
                prefix_match_unit=prefix_match_unit,
                cache_dtype="auto",
            ),
            kv_transfer_config=KVTransferConfig(
                kv_connector=_connector.CONNECTOR_NAME,
                kv_connector_module_path=_connector.CONNECTOR_MODULE,
                kv_role="kv_both",
                kv_load_failure_policy=draw.kv_load_failure_policy,
            ),
            device_config=DeviceConfig(device="cpu"),
        )
        # The lean CPU install has no vLLM platform, so VllmConfig turns the
        # hybrid KV-cache manager off; the deployments this suite models (GPU)
        # run with it on, and the scheduler config we hand over is hybrid.
        config.scheduler_config.disable_hybrid_kv_cache_manager = False
        if len(_VLLM_CONFIGS) > 256:
            _VLLM_CONFIGS.clear()
        _VLLM_CONFIGS[key] = config
    return config


def scheduler_tier_unsupported() -> str | None:
    """Why the installed vLLM cannot host the scheduler tier (None: it can).

    The harness observes the admission path through
    ``Scheduler._get_local_prefix_cache_hit`` (the local lookup the
    external-hit branch truncates), which vLLM 0.28.0 introduced.
    """
    if not hasattr(Scheduler, "_get_local_prefix_cache_hit"):
        return (
            f"vLLM {VLLM_VERSION} has no Scheduler._get_local_prefix_cache_hit "
            "(added in 0.28.0), which the scheduler tier observes"
        )
    return None


@contextlib.contextmanager
def _model_runner(choice: str | None) -> Iterator[None]:
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


def _span(group: SpecDraw) -> tuple[str, int] | None:
    for name in _SPAN_PARAMS:
        value = group.param(name)
        if value is not None:
            return (name, value)
    return None


_SPAN_PARAMS = ("sliding_window", "attention_chunk_size")


def _block_ids(blocks: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(b.block_id for b in group) for group in blocks.blocks)


# ---------------------------------------------------------------------------
# The harness
# ---------------------------------------------------------------------------


class SchedulerHarness:
    """A real ``Scheduler`` for one :class:`SchedulerDraw`, driven step by step.

    Raises :class:`InvalidLayout` when vLLM refuses the configuration (its
    config validation, block-size resolver or constructors).
    """

    def __init__(self, draw: SchedulerDraw) -> None:
        init_hashing()
        self._next_id = itertools.count()
        self.draw = draw
        layout = draw.layout
        self.kv_cache_config = kv_config = _kv_cache_config(layout)
        groups = kv_config.kv_cache_groups
        participating = [g.kv_cache_spec.block_size for g in groups if spec_prefix_cacheable(g.kv_cache_spec)]
        block_size = min(participating or [g.kv_cache_spec.block_size for g in groups])
        prefix_match_unit = None if len(layout.groups) == 1 else layout.hash_block_size
        try:
            with _model_runner(draw.model_runner):
                vllm_config = _vllm_config(draw, block_size, prefix_match_unit)
                # EngineCore._initialize_kv_caches, after profiling:
                vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
                vllm_config.cache_config.block_size = block_size
                vllm_config.validate_block_size()
                # vLLM's KV-cache planning copies the cache config's retention
                # interval onto the KV-cache config (default 0: only semantic
                # Mamba / sliding-window checkpoints are kept); the dataclass
                # default (None) would keep one at every block.
                if hasattr(kv_config, "prefix_cache_retention_interval") and hasattr(
                    vllm_config.cache_config, "prefix_cache_retention_interval"
                ):
                    kv_config.prefix_cache_retention_interval = (
                        vllm_config.cache_config.prefix_cache_retention_interval
                    )
                sched_bs, hash_bs = _kcu.resolve_kv_cache_block_sizes(kv_config, vllm_config)
                # vLLM 0.32+ records both on the config (older releases derive them).
                if hasattr(kv_config, "hash_block_size"):
                    kv_config.hash_block_size = hash_bs
                if hasattr(_kcu, "resolve_cache_hit_alignment_tokens"):
                    kv_config.cache_hit_alignment_tokens = _kcu.resolve_cache_hit_alignment_tokens(
                        kv_config, vllm_config, sched_bs, hash_bs
                    )
                _connector.SCRIPT.reset(divergent_hits=draw.divergent_hits)
                self.scheduler = Scheduler(
                    vllm_config=vllm_config,
                    kv_cache_config=kv_config,
                    structured_output_manager=StructuredOutputManager(vllm_config),
                    block_size=sched_bs,
                    hash_block_size=hash_bs,
                    log_stats=False,
                )
        except (AssertionError, TypeError, ValueError, NotImplementedError) as exc:
            raise InvalidLayout(f"{type(exc).__name__}: {exc}") from exc
        self.script = _connector.SCRIPT
        self.scheduler_block_size = sched_bs
        self.hash_block_size = hash_bs
        self.manager: KVCacheManager = self.scheduler.kv_cache_manager
        self.pool = self.manager.block_pool
        self.null_block_id = self.pool.null_block.block_id
        self.num_blocks = kv_config.num_blocks
        self.groups = tuple(
            GroupInfo(
                index=i,
                spec_class=qualified_name(type(g.kv_cache_spec)),
                inner_classes=(),
                block_size=mgr.block_size,
                prefix_cacheable=spec_prefix_cacheable(g.kv_cache_spec),
            )
            for i, (g, mgr) in enumerate(zip(groups, self.manager.coordinator.single_type_managers))
        )
        self.spans = tuple(_span(g) for g in layout.groups)
        self.step_index = 0
        self.vllm_seconds = 0.0  # inside schedule() and update_from_output()
        self.broken: str | None = None
        self.shortcut_evictions = 0
        self._requests: dict[str, Request] = {}
        self._pending: dict[str, dict[str, Any]] = {}  # admissions in progress
        self._preempted: set[str] = set()  # every request preempted so far
        self._current: str | None = None
        self._in_lookup = False
        self._load_failures: set[str] = set()
        self._fail_sync_loads = False
        self.invalid_blocks_reported: list[tuple[str, tuple[int, ...]]] = []
        self._install_spies()

    # -- properties ---------------------------------------------------------
    @property
    def partial_hits_enabled(self) -> bool:
        return bool(getattr(self.manager.coordinator, "enable_partial_hash_hits", False))

    @property
    def live_request_ids(self) -> tuple[str, ...]:
        return tuple(self.scheduler.requests)

    def status_of(self, request_id: str) -> str | None:
        req = self.scheduler.requests.get(request_id)
        return None if req is None else req.status.name

    def is_idle(self) -> bool:
        return not self.scheduler.requests

    # -- spies ---------------------------------------------------------------
    def _install_spies(self) -> None:
        sched, mgr = self.scheduler, self.manager
        lookup = type(sched)._get_local_prefix_cache_hit

        def local_hit(request: Request, max_cache_hit_length: int | None = None) -> Any:
            per_group, joint_hit, joint_blocks = self._side_lookups(request, max_cache_hit_length)
            self._in_lookup = True
            try:
                result = lookup(sched, request, *_optional(max_cache_hit_length))
            finally:
                self._in_lookup = False
            blocks, num_local, _boundary, diverged = result
            self._current = request.request_id
            self._pending[request.request_id] = dict(
                local_hit=num_local,
                local_blocks=_block_ids(blocks),
                hit_diverged=bool(diverged),
                per_group_hits=per_group,
                joint_hit=joint_hit,
                joint_blocks=joint_blocks,
            )
            return result

        def current() -> dict[str, Any] | None:
            # Between a request's lookup and its allocation, the scheduler
            # works on that request alone.
            pending = self._pending.get(self._current or "")
            if pending is None or self._in_lookup or "alloc_ok" in pending or "alloc_raised" in pending:
                return None
            return pending

        def get_computed_blocks(request: Request, max_cache_hit_length: int | None = None) -> Any:
            pending = current()
            if pending is not None and request.request_id == self._current:
                pending["fell_back"] = True
            return type(mgr).get_computed_blocks(mgr, request, *_optional(max_cache_hit_length))

        def truncate(blocks: Any, num_computed_tokens: int) -> Any:
            pending = current()
            if pending is not None:
                pending["truncated_at"] = num_computed_tokens
            return type(mgr).truncate_computed_blocks(mgr, blocks, num_computed_tokens)

        def allocate_slots(request: Request, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
            pending = self._pending.get(request.request_id)
            first = pending is not None and "alloc_ok" not in pending
            if first:
                new_blocks = kwargs.get("new_computed_blocks")
                pending["alloc_local_tokens"] = kwargs.get("num_new_computed_tokens", 0)
                pending["alloc_external_tokens"] = kwargs.get("num_external_computed_tokens", 0)
                pending["alloc_local_blocks"] = (
                    tuple(() for _ in self.groups) if new_blocks is None else _block_ids(new_blocks)
                )
            try:
                result = type(mgr).allocate_slots(mgr, request, num_new_tokens, *args, **kwargs)
            except Exception:
                if first:
                    pending["alloc_raised"] = True
                raise
            if first:
                pending["alloc_ok"] = result is not None
            return result

        sched._get_local_prefix_cache_hit = local_hit
        mgr.get_computed_blocks = get_computed_blocks
        mgr.truncate_computed_blocks = truncate
        mgr.allocate_slots = allocate_slots

    def _side_lookups(
        self, request: Request, max_cache_hit_length: int | None
    ) -> tuple[tuple[int, ...], int, tuple[tuple[int, ...], ...]]:
        mgr = self.manager
        limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        coord = mgr.coordinator
        joint_blocks, joint_hit, _ = type(mgr).get_computed_blocks(mgr, request, *_optional(max_cache_hit_length))
        if hasattr(coord, "find_longest_cache_hit_per_group"):
            _, hits = coord.find_longest_cache_hit_per_group(request.block_hashes, limit)
            per_group = tuple(hits)
        else:
            per_group = tuple(joint_hit for _ in self.groups)
        return per_group, joint_hit, _block_ids(joint_blocks)

    # -- requests ------------------------------------------------------------
    def add_request(
        self,
        tokens: Sequence[int],
        *,
        max_tokens: int = 1,
        reply: _connector.ExternalReply | None = None,
        request_id: str | None = None,
    ) -> str:
        rid = request_id or f"r{next(self._next_id)}"
        req = Request(
            request_id=rid,
            prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            pooling_params=None,
            block_hasher=_kcu.get_request_block_hasher(self.hash_block_size, sha256),
        )
        if reply is not None:
            self.script.replies[rid] = reply
        self._requests[rid] = req
        self.scheduler.add_request(req)
        return rid

    def abort(self, request_id: str) -> None:
        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)

    def fail_async_load(self, request_id: str) -> None:
        """Report the in-flight async load of ``request_id`` as failed (the
        connector's ``failed_recving`` path) at the next step."""
        self._load_failures.add(request_id)

    @property
    def can_report_invalid_blocks(self) -> bool:
        """vLLM maps block-level load failures back to requests only for one
        KV-cache group (block ids are unique per group); with several it
        raises, and connectors must use ``failed_recving`` instead."""
        return len(self.groups) == 1

    def fail_next_sync_loads(self) -> None:
        """At the next step, report every synchronous external load admitted
        in it as failed, block by block (``invalid_block_ids``): the scheduler
        then recomputes, or with ``kv_load_failure_policy="fail"`` evicts the
        invalid blocks and their dependents and fails the request."""
        if not self.can_report_invalid_blocks:
            raise ValueError("invalid_block_ids need a single KV-cache group (vLLM raises otherwise)")
        self._fail_sync_loads = True

    def loads_in_flight(self) -> tuple[str, ...]:
        return tuple(sorted(self.script.loads_in_flight))

    # -- one engine step -----------------------------------------------------
    def step(self, context: str = "") -> StepObservation:
        """``schedule()``, then feed back what a model runner would return:
        one sampled token for each request whose prefill completes (none for
        a non-final chunk), and the connector's finished/failed async loads."""
        if self.broken:
            raise RuntimeError(f"the scheduler is unusable after an earlier failure: {self.broken}")
        self.step_index += 1
        self._pending.clear()
        asked_before = len(self.script.queries)
        allocs_before = len(self.script.allocs)
        error = error_type = where = None
        out = None
        t0 = time.perf_counter()
        try:
            out = self.scheduler.schedule()
        except Exception as exc:  # noqa: BLE001 - every failure is an observation
            error, error_type, where = f"{type(exc).__name__}: {exc}", type(exc).__name__, "schedule"
        self.vllm_seconds += time.perf_counter() - t0
        queries = self.script.queries[asked_before:]
        allocs = self.script.allocs[allocs_before:]
        dishonest = tuple(
            q.request_id for q in queries if not self.script.reply_for(q.request_id).honest
        )
        admissions = self._admissions(out, queries, allocs)
        if out is not None:
            self._preempted.update(out.preempted_req_ids or ())
        newly = self._newly_scheduled(out)
        invalid = self._invalid_blocks(admissions) if self._fail_sync_loads else set()
        self._fail_sync_loads = False
        finished: frozenset[str] = frozenset()
        if out is not None:
            try:
                finished = self._feed_back(out, invalid)
            except Exception as exc:  # noqa: BLE001
                error, error_type, where = (
                    f"{type(exc).__name__}: {exc}",
                    type(exc).__name__,
                    "update_from_output",
                )
        if error:
            self.broken = error
        return StepObservation(
            step=self.step_index,
            admissions=admissions,
            error=error,
            error_type=error_type,
            error_where=where,
            dishonest_replies=dishonest,
            num_scheduled=dict(out.num_scheduled_tokens) if out is not None else {},
            copies=tuple((c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or ())
            if out is not None
            else (),
            newly_scheduled=newly,
            preempted=frozenset(out.preempted_req_ids or ()) if out is not None else frozenset(),
            finished=finished,
            context=context,
        )

    def _admissions(self, out: Any, queries: list[Any], allocs: list[Any]) -> tuple[AdmissionObservation, ...]:
        new_computed = {}
        cow_dst: frozenset[int] = frozenset()
        if out is not None:
            # What the scheduler hands the model runner, before this step's
            # tokens are added. A request resumed after preemption is admitted
            # through the same waiting-queue branch but reported among the
            # cached requests; reading its live num_computed_tokens instead
            # would already include this step's scheduled tokens.
            new_computed = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
            cached = out.scheduled_cached_reqs
            for i, rid in enumerate(cached.req_ids):
                new_computed.setdefault(rid, cached.num_computed_tokens[i])
            cow_dst = frozenset(c.dst_block_id for c in out.kv_cache_block_copies or ())
        last_query = {q.request_id: q for q in queries}
        last_alloc = {a.request_id: a for a in allocs}
        result = []
        for rid, pending in self._pending.items():
            query = last_query.get(rid)
            alloc = last_alloc.get(rid)
            req = self._requests[rid]
            if query is not None:
                pending.setdefault("asked_with", query.num_computed_tokens)
                pending["reply"] = query.reply
                pending["reply_async"] = query.load_async
                pending["reply_honest"] = self.script.reply_for(rid).honest
            admitted = alloc is not None
            num_computed = None
            if admitted:
                num_computed = new_computed.get(rid, req.num_computed_tokens)
            table: tuple[tuple[int, ...], ...] = ()
            if admitted and rid in self.scheduler.requests:
                table = tuple(tuple(g) for g in self.manager.get_block_ids(rid))
            result.append(
                AdmissionObservation(
                    request_id=rid,
                    step=self.step_index,
                    num_tokens=req.num_tokens,
                    groups=self.groups,
                    spans=self.spans,
                    scheduler_block_size=self.scheduler_block_size,
                    hash_block_size=self.hash_block_size,
                    null_block_id=self.null_block_id,
                    divergent_capable=self.draw.divergent_hits,
                    admitted=admitted,
                    num_computed_tokens=num_computed,
                    connector_external_tokens=None if alloc is None else alloc.num_external_tokens,
                    block_table=table,
                    cow_dst_ids=cow_dst,
                    resumed=admitted and rid in self._preempted,
                    **{k: v for k, v in pending.items() if k != "alloc_ok"},
                    alloc_ok=bool(pending.get("alloc_ok")),
                )
            )
        return tuple(result)

    def _newly_scheduled(self, out: Any) -> tuple[tuple[str, int, int], ...]:
        if out is None:
            return ()
        rows = [
            (n.req_id, n.num_computed_tokens, self._requests[n.req_id].num_tokens)
            for n in out.scheduled_new_reqs
        ]
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid in cached.resumed_req_ids:
                rows.append((rid, cached.num_computed_tokens[i], self._requests[rid].num_tokens))
        return tuple(rows)

    def _invalid_blocks(self, admissions: tuple[AdmissionObservation, ...]) -> set[int]:
        invalid: set[int] = set()
        for adm in admissions:
            if not adm.admitted or adm.reply_async or not adm.connector_external_tokens or not adm.block_table:
                continue
            local = (adm.num_computed_tokens or 0) - adm.connector_external_tokens
            (table,) = adm.block_table
            b = self.groups[0].block_size
            first, end = local // b, -(-(adm.num_computed_tokens or 0) // b)
            ids = tuple(i for i in table[first:end] if i != self.null_block_id)
            if ids:
                self.invalid_blocks_reported.append((adm.request_id, ids))
                invalid.update(ids)
        return invalid

    def _feed_back(self, out: Any, invalid_block_ids: set[int] = frozenset()) -> frozenset[str]:  # type: ignore[assignment]
        sched = self.scheduler
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = sched.requests[rid]
            # num_computed_tokens already includes this step's tokens.
            done_prefill = req.num_computed_tokens >= req.num_tokens
            sampled.append([1000 + self.step_index % 24] if done_prefill else [])
        recving = {r for r in self.script.loads_in_flight if r in sched.requests}
        failed = recving & self._load_failures
        self.script.loads_in_flight.difference_update(recving)
        self._load_failures.difference_update(recving)
        # failed_recving exists from vLLM 0.30; older releases cannot be told
        # an async load failed, so there the load simply completes.
        failure_kw = {"failed_recving": failed} if _KVCO_HAS_FAILED else {}
        connector_output = (
            KVConnectorOutput(
                finished_recving=recving, invalid_block_ids=set(invalid_block_ids), **failure_kw
            )
            if recving or invalid_block_ids
            else None
        )
        output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=connector_output,
        )
        before = set(sched.requests)
        t0 = time.perf_counter()
        try:
            sched.update_from_output(out, output)
        finally:
            self.vllm_seconds += time.perf_counter() - t0
        return frozenset(before - set(sched.requests))

    def drain(self, max_steps: int = 64, context: str = "") -> list[StepObservation]:
        """Step until no request is left (or ``max_steps``)."""
        steps = []
        while self.scheduler.requests and len(steps) < max_steps and not self.broken:
            steps.append(self.step(context))
        return steps

    # -- pool ----------------------------------------------------------------
    def pool_observation(self, context: str = "") -> PoolObservation:
        referenced = tuple(
            (b.block_id, b.ref_cnt) for b in self.pool.blocks if b.ref_cnt != 0 and not b.is_null
        )
        return PoolObservation(
            num_blocks=self.num_blocks,
            num_free=self.pool.get_num_free_blocks(),
            referenced=referenced,
            live_requests=tuple(self.scheduler.requests),
            context=context,
        )

    def per_group_cached_block_ids(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Per group, the non-null blocks a per-group lookup of ``tokens`` finds."""
        req = Request(
            request_id="probe",
            prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            block_hasher=_kcu.get_request_block_hasher(self.hash_block_size, sha256),
        )
        coord = self.manager.coordinator
        limit = req.num_tokens - 1
        if hasattr(coord, "find_longest_cache_hit_per_group"):
            raw, _ = coord.find_longest_cache_hit_per_group(req.block_hashes, limit)
        else:
            raw, *_ = coord.find_longest_cache_hit(req.block_hashes, limit)
        return tuple(tuple(b.block_id for b in g if not b.is_null) for g in raw)

    def evict_shortcut(self, block_ids: set[int]) -> None:
        """Drop hand-picked blocks from the prefix cache (a search shortcut:
        a failure reached this way must be re-derived through a real path)."""
        if block_ids:
            self.shortcut_evictions += 1
            self.manager.evict_blocks(set(block_ids))


# ---------------------------------------------------------------------------
# Planted scheduler bugs
# ---------------------------------------------------------------------------

# name: (description, ((exact text in Scheduler.schedule, replacement), ...))
_SCHEDULE_EDITS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "no_divergent_fallback": (
        "drops the divergent-hit fallback: a deeper full-attention hit is kept "
        "with no external tokens behind its Mamba state",
        (("if hit_diverged and num_external_computed_tokens == 0:", "if False and hit_diverged:"),),
    ),
    "fallback_discards_hit": (
        "the divergent-hit fallback drops the whole local hit instead of "
        "reconciling to the boundary every group agrees on",
        (
            (
                "request.shared_prefix_boundary,\n"
                "                            ) = self.kv_cache_manager.get_computed_blocks(\n"
                "                                request, max_cache_hit_length\n"
                "                            )",
                "request.shared_prefix_boundary,\n"
                "                            ) = (self.kv_cache_manager.empty_kv_cache_blocks, 0, 0)",
            ),
        ),
    ),
    "skip_truncation": (
        "skips truncate_computed_blocks: the sub-block tail stays in the adopted "
        "blocks although the local count is cut to the aligned boundary",
        (("self.kv_cache_manager.truncate_computed_blocks(", "(lambda blocks, _n: blocks)("),),
    ),
    "truncation_one_block_short": (
        "truncates the adopted blocks one scheduler block below the aligned "
        "local boundary it reports",
        (
            (
                "new_computed_blocks, block_aligned_local\n",
                "new_computed_blocks, max(0, block_aligned_local - self.block_size)\n",
            ),
        ),
    ),
    "reports_external_twice": (
        "hands the model runner num_computed_tokens with the external tokens "
        "counted twice (the allocation itself is right)",
        (
            (
                "request.num_computed_tokens = num_computed_tokens\n"
                "                self._set_kv_fetch_stage(request, None)\n",
                "request.num_computed_tokens = num_computed_tokens + num_external_computed_tokens\n"
                "                self._set_kv_fetch_stage(request, None)\n",
            ),
        ),
    ),
}

PLANTED_SCHEDULER_BUGS: dict[str, str] = {
    **{name: desc for name, (desc, _) in _SCHEDULE_EDITS.items()},
    "pre_fix_assert_all": (
        "truncate_computed_blocks as before vLLM PR 51468: every group, Mamba "
        "included, asserts it covers the endpoint"
    ),
    "truncate_touches_refcounts": (
        "truncate_computed_blocks bumps the kept blocks' ref_cnt, so they never "
        "return to the pool"
    ),
}

_TRUNCATE_BUG_FOR = {
    "pre_fix_assert_all": "pre_fix_assert_all",
    "truncate_touches_refcounts": "touches_refcounts",
}


@functools.cache
def _patched_schedule(name: str) -> Callable[..., Any]:
    _, edits = _SCHEDULE_EDITS[name]
    source = inspect.getsource(Scheduler.schedule)  # as indented in the class
    for old, new in edits:
        if source.count(old) != 1:
            raise RuntimeError(
                f"planted bug {name!r}: its anchor {old!r} occurs {source.count(old)} times in "
                f"Scheduler.schedule of vLLM {VLLM_VERSION} (expected once); update _SCHEDULE_EDITS"
            )
        source = source.replace(old, new)
    namespace = dict(vars(_sched_mod))
    exec(compile(textwrap.dedent(source), f"<planted scheduler bug {name}>", "exec"), namespace)  # noqa: S102
    return namespace["schedule"]


@contextlib.contextmanager
def planted_scheduler_bug(name: str) -> Iterator[None]:
    """Run the enclosed code against a deliberately broken scheduler path."""
    if name not in PLANTED_SCHEDULER_BUGS:
        raise KeyError(f"unknown planted bug {name!r}; known: {sorted(PLANTED_SCHEDULER_BUGS)}")
    if name in _TRUNCATE_BUG_FOR:
        with planted_truncate_bug(_TRUNCATE_BUG_FOR[name]):
            yield
        return
    original = Scheduler.schedule
    Scheduler.schedule = _patched_schedule(name)
    try:
        yield
    finally:
        Scheduler.schedule = original

