"""The one place that calls vLLM constructors and internals.

Everything else in the suite speaks in :mod:`fuzz.model` dataclasses. When
vLLM's internal API moves between releases (keyword arguments appear,
signatures change), this module absorbs it.

Public surface (``__all__``): the version string, spec-class discovery, spec
and layout building, the block-size judge, :class:`ManagerHarness` (a real
``KVCacheManager`` with the operations scenarios need), and the planted
truncation bugs used by the suite's self-tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

# vLLM writes model-info caches under $HOME and may try the hub: keep it local.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
_CACHE_ROOT = os.path.join(tempfile.gettempdir(), "kvtrunc-fuzz-cache")
os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(_CACHE_ROOT, "vllm"))
os.environ.setdefault("HF_HOME", os.path.join(_CACHE_ROOT, "hf"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

with warnings.catch_warnings():
    # A vLLM source checkout that was never built has no vllm/_version.py
    # (setuptools-scm writes it at build time): vLLM warns and calls itself
    # "dev". That is expected for --vllm-src, not an error.
    warnings.filterwarnings("ignore", "Failed to read commit hash", RuntimeWarning)
    import vllm  # noqa: E402
import vllm.v1.kv_cache_interface as _ki  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core import kv_cache_utils as _kcu  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from fuzz.model import (  # noqa: E402
    BlockRef,
    GroupInfo,
    GroupTruncation,
    LayoutDraw,
    SpecDraw,
    TruncationObservation,
)

__all__ = [  # re-exported by fuzz.adapter
    "VLLM_VERSION",
    "ManagerHarness",
    "PLANTED_TRUNCATE_BUGS",
    "InvalidLayout",
    "SpecFacts",
    "spec_facts",
    "build_spec",
    "init_hashing",
    "planted_truncate_bug",
    "qualified_name",
    "resolve_block_sizes",
    "spec_base_class",
    "spec_classes",
    "spec_class_by_name",
    "spec_prefix_cacheable",
]



def _vllm_version() -> str:
    """vLLM's version; for an unbuilt source checkout, "dev" plus where it is
    and, in a git clone, the commit (``git describe``)."""
    if vllm.__version__ != "dev":
        return vllm.__version__
    root = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        described = subprocess.run(
            ["git", "-C", root, "describe", "--tags", "--always", "--dirty"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        if described:
            return f"dev {described} (source checkout {root})"
    return f"dev (source checkout {root})"


VLLM_VERSION: str = _vllm_version()
_DTYPE = torch.float32
_hashing_ready = False


def init_hashing() -> None:
    """Initialise vLLM's block-hash seed once per process (vLLM's tests do the same)."""
    global _hashing_ready
    if not _hashing_ready:
        _kcu.init_none_hash(sha256)
        _hashing_ready = True


def spec_prefix_cacheable(spec: Any) -> bool:
    """Whether vLLM lets ``spec``'s group take part in prefix caching.

    ``KVCacheSpec.prefix_cacheable`` arrived in vLLM 0.29; before it every
    group with a manager was prefix-cacheable, which is what the default says.
    """
    return bool(getattr(spec, "prefix_cacheable", True))


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def spec_base_class() -> type:
    return _ki.KVCacheSpec


def spec_classes() -> list[type]:
    """Every ``KVCacheSpec`` subclass reachable in the installed vLLM.

    Walks ``__subclasses__`` transitively (so classes defined anywhere that is
    imported, tests included, are seen) and adds whatever vLLM's spec registry
    knows, when the installed vLLM has one.
    """
    found: dict[str, type] = {}

    def walk(cls: type) -> None:
        for sub in cls.__subclasses__():
            if qualified_name(sub) not in found:
                found[qualified_name(sub)] = sub
                walk(sub)

    walk(_ki.KVCacheSpec)
    for qual, cls in list(found.items()):
        if id(cls) in _RETIRED_SPEC_CLASSES:
            del found[qual]
    with contextlib.suppress(ImportError, AttributeError):
        from vllm.v1 import kv_cache_spec_registry as reg

        reg.KVCacheSpecRegistry._ensure_registered()
        for cls in getattr(reg, "_REGISTRY_KVCACHESPEC_LIST", {}):
            found.setdefault(qualified_name(cls), cls)
    return sorted(found.values(), key=qualified_name)


def spec_class_by_name(kind: str) -> type:
    cls = getattr(_ki, kind, None)
    if cls is None:
        for candidate in spec_classes():
            if candidate.__name__ == kind:
                return candidate
        raise KeyError(f"vLLM {VLLM_VERSION} has no KV-cache spec class {kind!r}")
    return cls


# Extra constructor fields per spec class, beyond block size; values come from
# SpecDraw.params. Attention specs share the tiny head geometry: the manager
# never reads tensor shapes, only block bookkeeping.
_ATTENTION_FIELDS = dict(num_kv_heads=1, head_size=1, dtype=_DTYPE)


def build_spec(draw: SpecDraw) -> Any:
    """Build the real vLLM spec object for ``draw``."""
    return _build_with_class(spec_class_by_name(draw.kind), draw)


def _build_with_class(cls: type, draw: SpecDraw) -> Any:
    params = dict(draw.params)
    if draw.kind == "UniformTypeKVCacheSpecs":
        inner = {f"layer{i}": build_spec(s) for i, s in enumerate(draw.inner)}
        return cls(block_size=draw.block_size, kv_cache_specs=inner)
    if issubclass(cls, _ki.MambaSpec):
        return cls(
            block_size=draw.block_size,
            shapes=((1,), (1,)),
            dtypes=(_DTYPE, _DTYPE),
            mamba_cache_mode="align",
            **params,
        )
    if draw.kind == "HiSparseHotSpec":
        return cls(block_size=draw.block_size, page_size=64, blocks_per_request=4, **params)
    if draw.kind == "HiSparseResidentSpec":
        return cls(block_size=draw.block_size, page_size=64, **params)
    if issubclass(cls, _ki.AttentionSpec):
        return cls(block_size=draw.block_size, **_ATTENTION_FIELDS, **params)
    # A spec class this adapter has never seen: try the bare block size, and let
    # the caller record the exact error.
    return cls(block_size=draw.block_size, **params)


def _kv_cache_config(layout: LayoutDraw) -> Any:
    groups = [
        _ki.KVCacheGroupSpec([f"g{i}.layer"], build_spec(g))
        for i, g in enumerate(layout.groups)
    ]
    config = _ki.KVCacheConfig(
        num_blocks=layout.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    # The engine core hands the scheduler this derived config (it unwraps the
    # worker-side uniform-type wrapper into its per-layer spec): do the same.
    return _kcu.generate_scheduler_kv_cache_config([config])


@dataclasses.dataclass(frozen=True)
class SpecFacts:
    """What the installed vLLM itself declares about a spec class."""

    qualname: str
    prefix_cacheable: bool | None  # None when no sample instance could be built
    kind: str | None  # vLLM's get_kv_cache_spec_kind(), when it has one
    manager: str | None  # the registry's manager class, when it has one
    is_mamba_subclass: bool
    is_attention_subclass: bool
    build_error: str | None


# Integer fields a sample instance needs, for classes that require them.
_SAMPLE_PARAMS = {
    "sliding_window": 8,
    "attention_chunk_size": 8,
    "rswa_window": 8,
    "sink_len": 4,
}


def spec_facts(cls: type) -> SpecFacts:
    """Build a sample of ``cls`` and ask vLLM what it says about it."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    params = tuple((k, v) for k, v in _SAMPLE_PARAMS.items() if k in fields)
    sample = None
    error = None
    try:
        if cls is _ki.UniformTypeKVCacheSpecs:
            inner = (SpecDraw("FullAttentionSpec", 4),)
            sample = build_spec(SpecDraw(cls.__name__, 4, (), inner))
        else:
            sample = _build_with_class(cls, SpecDraw(cls.__name__, 4, params))
    except Exception as exc:  # noqa: BLE001 - recorded, not hidden
        error = f"{type(exc).__name__}: {exc}"
    kind = manager = None
    if sample is not None:
        with contextlib.suppress(Exception):
            kind = _ki.get_kv_cache_spec_kind(sample).value
        with contextlib.suppress(Exception):
            from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

            found = KVCacheSpecRegistry.get_manager_class(sample)
            manager = None if found is None else found.__name__
    return SpecFacts(
        qualname=qualified_name(cls),
        prefix_cacheable=None if sample is None else spec_prefix_cacheable(sample),
        kind=kind,
        manager=manager,
        is_mamba_subclass=issubclass(cls, _ki.MambaSpec),
        is_attention_subclass=issubclass(cls, _ki.AttentionSpec),
        build_error=error,
    )


class InvalidLayout(ValueError):
    """vLLM's own resolver or constructors rejected a layout."""


def resolve_block_sizes(layout: LayoutDraw) -> tuple[int, int]:
    """Ask vLLM's resolver for (scheduler_block_size, hash_block_size).

    vLLM is the judge of validity: a ``ValueError`` from the resolver becomes
    :class:`InvalidLayout`. Prefix caching is on and ``prefix_match_unit`` is
    the layout's hash block size (left unset for one group, where vLLM forbids
    anything but the block size).
    """
    config = _kv_cache_config(layout)
    single = len(layout.groups) == 1
    fake_vllm_config = SimpleNamespace(
        cache_config=SimpleNamespace(
            block_size=layout.groups[0].block_size,
            enable_prefix_caching=True,
            prefix_match_unit=None if single else layout.hash_block_size,
            mamba_cache_mode="align",
        ),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        kv_transfer_config=None,
    )
    try:
        return _kcu.resolve_kv_cache_block_sizes(config, fake_vllm_config)
    except ValueError as exc:
        raise InvalidLayout(str(exc)) from exc


def _snapshot(blocks: Sequence[Any]) -> tuple[BlockRef, ...]:
    return tuple(
        BlockRef(
            obj_id=id(b),
            block_id=b.block_id,
            ref_cnt=b.ref_cnt,
            block_hash=None if b.block_hash is None else bytes(b.block_hash),
            is_null=bool(b.is_null),
        )
        for b in blocks
    )


@dataclasses.dataclass
class Lookup:
    """A real lookup result, held for truncation. ``hits`` is per group."""

    blocks: Any  # vLLM KVCacheBlocks
    num_tokens: int  # the joint hit length vLLM reported (per-group: FA-style max)
    hits: tuple[int, ...]
    mode: str


class ManagerHarness:
    """A real ``KVCacheManager`` for one layout, with scenario operations.

    Raises :class:`InvalidLayout` when vLLM refuses the layout.
    """

    _ids = itertools.count()

    def __init__(self, layout: LayoutDraw) -> None:
        init_hashing()
        self.layout = layout
        sched, hash_bs = resolve_block_sizes(layout)
        self.scheduler_block_size = sched
        self.hash_block_size = hash_bs
        self.config = _kv_cache_config(layout)
        try:
            self.manager = KVCacheManager(
                self.config,
                max_model_len=layout.max_model_len,
                scheduler_block_size=sched,
                hash_block_size=hash_bs,
                enable_caching=True,
            )
        except (AssertionError, TypeError, ValueError, NotImplementedError) as exc:
            raise InvalidLayout(f"{type(exc).__name__}: {exc}") from exc
        self.groups = tuple(
            GroupInfo(
                index=i,
                spec_class=qualified_name(type(g.kv_cache_spec)),
                inner_classes=tuple(
                    qualified_name(type(s))
                    for s in getattr(g.kv_cache_spec, "kv_cache_specs", {}).values()
                ),
                block_size=mgr.block_size,
                prefix_cacheable=spec_prefix_cacheable(g.kv_cache_spec),
            )
            for i, (g, mgr) in enumerate(
                zip(self.config.kv_cache_groups, self.manager.coordinator.single_type_managers)
            )
        )

    # -- requests ---------------------------------------------------------
    def _request(self, tokens: Sequence[int]) -> Request:
        return Request(
            request_id=f"r{next(self._ids)}",
            prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            block_hasher=_kcu.get_request_block_hasher(self.hash_block_size, sha256),
        )

    @property
    def num_free_blocks(self) -> int:
        return self.manager.block_pool.get_num_free_blocks()

    @property
    def partial_hits_enabled(self) -> bool:
        return bool(getattr(self.manager.coordinator, "enable_partial_hash_hits", False))

    def prefill(self, tokens: Sequence[int], chunk: int | None = None) -> bool:
        """Run one request's whole prefill (in chunks), then free it.

        This is the real path by which blocks get cached. Returns False when
        the pool could not hold the request (it is then freed unfinished).
        """
        req = self._request(tokens)
        blocks, num_hit, _ = self.manager.get_computed_blocks(req)
        computed = num_hit
        step = chunk or req.num_tokens
        first = True
        ok = True
        while computed < req.num_tokens:
            n_new = min(step, req.num_tokens - computed)
            allocated = self.manager.allocate_slots(
                req,
                n_new,
                num_hit if first else 0,
                blocks if first else None,
            )
            if allocated is None:
                ok = False
                break
            first = False
            computed += n_new
            req.num_computed_tokens = computed
            self.manager.new_step_starts()
        self.manager.free(req)
        self.manager.new_step_starts()
        return ok

    def lookup(self, tokens: Sequence[int], mode: str) -> Lookup:
        """Look ``tokens`` up the way a scheduler would.

        ``mode``: ``"joint"`` (``get_computed_blocks``: the boundary every group
        agrees on), ``"per_group"`` (``find_longest_cache_hit_per_group``: hits
        may diverge), or ``"connector"`` (``get_computed_blocks_for_connector``).
        """
        req = self._request(tokens)
        limit = req.num_tokens - 1
        coord = self.manager.coordinator
        if mode == "joint":
            blocks, n, _ = self.manager.get_computed_blocks(req)
            hits = tuple(n for _ in self.groups)
        elif mode == "per_group":
            if hasattr(coord, "find_longest_cache_hit_per_group"):
                raw, hits = coord.find_longest_cache_hit_per_group(req.block_hashes, limit)
            else:  # one group (unitary coordinator): per-group is the joint hit
                raw, n, *_ = coord.find_longest_cache_hit(req.block_hashes, limit)
                hits = tuple(n for _ in self.groups)
            blocks = self.manager.create_kv_cache_blocks(tuple(raw))
            n = max(hits, default=0)
        elif mode == "connector":
            blocks, n, _, _diverged = self.manager.get_computed_blocks_for_connector(req)
            hits = tuple(n for _ in self.groups)
        else:
            raise ValueError(f"unknown lookup mode {mode!r}")
        return Lookup(blocks=blocks, num_tokens=n, hits=tuple(hits), mode=mode)

    def per_group_cached_block_ids(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Per group, the ids of the non-null blocks a per-group lookup finds."""
        found = self.lookup(tokens, "per_group")
        return tuple(
            tuple(b.block_id for b in group if not b.is_null) for group in found.blocks.blocks
        )

    def evict(self, block_ids: set[int]) -> None:
        """Drop blocks from the prefix cache (the connector-load-failure path's call)."""
        self.manager.evict_blocks(set(block_ids))

    # -- truncation -------------------------------------------------------
    def observe_truncate(
        self, found: Lookup, endpoint: int, context: str = ""
    ) -> TruncationObservation:
        """Call the real ``truncate_computed_blocks`` and record everything."""
        blocks = found.blocks
        tuple_id_before = id(blocks.blocks)
        lists_before = [id(g) for g in blocks.blocks]
        before = [_snapshot(g) for g in blocks.blocks]
        free_before = self.num_free_blocks
        error: str | None = None
        out_groups: Sequence[Sequence[Any]] | None = None
        try:
            result = self.manager.truncate_computed_blocks(blocks, endpoint)
            out_groups = result.blocks
        except Exception as exc:  # noqa: BLE001 - every failure is an observation
            error = f"{type(exc).__name__}: {exc}"
        groups = tuple(
            GroupTruncation(
                info=info,
                list_obj_id_before=lists_before[i],
                list_obj_id_after=id(blocks.blocks[i]),
                input_before=before[i],
                input_after=_snapshot(blocks.blocks[i]),
                output=None if out_groups is None else _snapshot(out_groups[i]),
            )
            for i, info in enumerate(self.groups)
        )
        return TruncationObservation(
            endpoint=endpoint,
            groups=groups,
            error=error,
            tuple_obj_id_before=tuple_id_before,
            tuple_obj_id_after=id(blocks.blocks),
            free_blocks_before=free_before,
            free_blocks_after=self.num_free_blocks,
            vllm_version=VLLM_VERSION,
            context=context,
        )


# Temporary test classes, hidden from discovery once their block ends (Python
# keeps subclasses alive in __subclasses__ for as long as anything refers to them).
_RETIRED_SPEC_CLASSES: set[int] = set()


@contextlib.contextmanager
def temporary_spec_subclass(base_kind: str, name: str) -> Iterator[type]:
    """Define a new frozen-dataclass ``KVCacheSpec`` subclass of ``base_kind``
    for the duration (what a vLLM contributor adding a spec type does); after
    the block, :func:`spec_classes` no longer reports it."""
    base = spec_class_by_name(base_kind)
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(
        type(name, (base,), {"__module__": "tests.planted_specs", "__qualname__": name})
    )
    try:
        yield cls
    finally:
        _RETIRED_SPEC_CLASSES.add(id(cls))


# ---------------------------------------------------------------------------
# Planted bugs: wrong variants of truncate_computed_blocks, swapped in for the
# duration of a self-test or benchmark to prove the invariants can fail.
# ---------------------------------------------------------------------------


def _variant(
    *,
    clamp: str = "mamba",  # "mamba" (the fix), "none" (pre-fix), "all" (blanket min)
    check_alignment: bool = True,
    mutate_input: bool = False,
    touch_refcounts: bool = False,
    mamba_keeps_all: bool = False,
    shifted: bool = False,
    scratch_gets_null: bool = False,
    leaks_block: bool = False,
) -> Callable[[KVCacheManager, KVCacheBlocks, int], KVCacheBlocks]:
    def truncate(self: KVCacheManager, blocks: KVCacheBlocks, n: int) -> KVCacheBlocks:
        out: list[list[Any]] = []
        for group_blocks, mgr, group in zip(
            blocks.blocks,
            self.coordinator.single_type_managers,
            self.kv_cache_config.kv_cache_groups,
            strict=True,
        ):
            spec = group.kv_cache_spec
            if not spec_prefix_cacheable(spec):
                out.append([self.block_pool.null_block] if scratch_gets_null else [])
                continue
            if check_alignment:
                assert n % mgr.block_size == 0
            keep = n // mgr.block_size
            is_mamba = isinstance(spec, _ki.MambaSpec)
            if clamp == "all" or (clamp == "mamba" and is_mamba):
                keep = min(keep, len(group_blocks))
            else:
                assert keep <= len(group_blocks)
            if is_mamba and mamba_keeps_all:
                keep = len(group_blocks)
            view = list(group_blocks[1 : keep + 1] if shifted else group_blocks[:keep])
            if shifted and len(view) < keep:
                view = list(group_blocks[:keep])[::-1]
            if mutate_input and isinstance(group_blocks, list):
                del group_blocks[keep:]
            if touch_refcounts:
                for b in view:
                    if not b.is_null:
                        b.ref_cnt += 1
            out.append(view)
        if leaks_block and self.block_pool.get_num_free_blocks() > 0:
            self.block_pool.get_new_blocks(1)
        return self.create_kv_cache_blocks(tuple(out))

    return truncate


PLANTED_TRUNCATE_BUGS: dict[str, tuple[str, Callable[..., Any]]] = {
    "pre_fix_assert_all": (
        "vLLM before PR 51468: every group asserts it covers the endpoint, so a "
        "short Mamba group crashes the call",
        _variant(clamp="none"),
    ),
    "blanket_min": (
        "min() on every group: a short attention group is silently truncated",
        _variant(clamp="all"),
    ),
    "mutates_input": (
        "slices correctly but also deletes the tail of the caller's lists",
        _variant(mutate_input=True),
    ),
    "touches_refcounts": (
        "slices correctly but increments the kept blocks' ref_cnt",
        _variant(touch_refcounts=True),
    ),
    "no_alignment_check": (
        "floors a misaligned endpoint instead of rejecting it",
        _variant(check_alignment=False),
    ),
    "mamba_keeps_all": (
        "Mamba groups keep every input block, even past the endpoint",
        _variant(mamba_keeps_all=True),
    ),
    "shifted_view": (
        "returns a view that is the right length but not a prefix of the input",
        _variant(shifted=True),
    ),
    "scratch_gets_null": (
        "non-prefix-cacheable groups come back holding the null block",
        _variant(scratch_gets_null=True),
    ),
    "leaks_block": (
        "slices correctly but takes a block from the free pool and never returns it",
        _variant(leaks_block=True),
    ),
}


@contextlib.contextmanager
def planted_truncate_bug(name: str) -> Iterator[None]:
    """Swap ``KVCacheManager.truncate_computed_blocks`` for a planted variant."""
    if name not in PLANTED_TRUNCATE_BUGS:
        raise KeyError(f"unknown planted bug {name!r}; known: {sorted(PLANTED_TRUNCATE_BUGS)}")
    original = KVCacheManager.truncate_computed_blocks
    KVCacheManager.truncate_computed_blocks = PLANTED_TRUNCATE_BUGS[name][1]
    try:
        yield
    finally:
        KVCacheManager.truncate_computed_blocks = original
