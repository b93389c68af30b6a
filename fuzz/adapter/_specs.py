"""KV-cache spec classes and layouts: discovery, construction, vLLM's verdicts.

Which arguments a spec class takes beyond its family's defaults is a column
of the classification table (:mod:`fuzz.model._classification`); the family
(attention, Mamba, other) is vLLM's class hierarchy. :func:`spec_constructor`
is the one place that turns a :class:`fuzz.model.SpecDraw` into constructor
arguments: :func:`build_spec` calls it, and the repro writer prints it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from fuzz.adapter import _compat
from fuzz.adapter._env import VLLM_VERSION

import torch  # noqa: E402
import vllm.v1.kv_cache_interface as _ki  # noqa: E402
from vllm.v1.core import kv_cache_utils as _kcu  # noqa: E402

from fuzz.model import Installed, LayoutDraw, SpecDraw, register_installed  # noqa: E402
from fuzz.outcomes import ConfigRejected, construction_failure  # noqa: E402
from fuzz.model import CLASSIFIED, EXEMPT  # noqa: E402

__all__ = [
    "InvalidLayout",
    "refused",
    "SpecFacts",
    "build_spec",
    "kv_cache_config",
    "qualified_name",
    "resolve_block_sizes",
    "spec_base_class",
    "spec_class_by_name",
    "spec_classes",
    "spec_constructor",
    "spec_facts",
    "temporary_spec_subclass",
]

DTYPE = torch.float32
# Family defaults. The managers never read tensor shapes, only block
# bookkeeping: attention specs get a one-head, one-element geometry, Mamba
# specs a one-element state in align mode (the mode prefix caching needs).
_ATTENTION_ARGS: dict[str, Any] = dict(num_kv_heads=1, head_size=1, dtype=DTYPE)
_MAMBA_ARGS: dict[str, Any] = dict(shapes=((1,), (1,)), dtypes=(DTYPE, DTYPE), mamba_cache_mode="align")


class InvalidLayout(ConfigRejected):
    """vLLM's own resolver, validators or constructors rejected a layout."""


def refused(exc: BaseException) -> Exception:
    """What building vLLM objects for a drawn layout raises instead of
    ``exc``: :class:`InvalidLayout` when vLLM refused it, a
    :class:`fuzz.model.HarnessError` when the suite's own code failed."""
    failure = construction_failure(exc, VLLM_VERSION)
    return InvalidLayout(failure.reason) if isinstance(failure, ConfigRejected) else failure


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def spec_base_class() -> type:
    return _ki.KVCacheSpec


# Temporary test classes, hidden from discovery once their block ends (Python
# keeps subclasses alive in __subclasses__ for as long as anything refers to
# them). The classes themselves are kept, not their id()s: a collected class's
# id is reused, and a later temporary class would then look retired.
_RETIRED_SPEC_CLASSES: set[type] = set()


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
        if cls in _RETIRED_SPEC_CLASSES:
            del found[qual]
    registry = _compat.spec_registry()
    if registry is not None:
        with contextlib.suppress(AttributeError):
            registry.KVCacheSpecRegistry._ensure_registered()
            for cls in getattr(registry, "_REGISTRY_KVCACHESPEC_LIST", {}):
                found.setdefault(qualified_name(cls), cls)
    return sorted(found.values(), key=qualified_name)


register_installed(
    Installed(vllm_version=VLLM_VERSION, spec_classes=lambda: tuple(qualified_name(c) for c in spec_classes()))
)


def spec_class_by_name(kind: str) -> type:
    cls = getattr(_ki, kind, None)
    if cls is None:
        for candidate in spec_classes():
            if candidate.__name__ == kind:
                return candidate
        raise KeyError(f"vLLM {VLLM_VERSION} has no KV-cache spec class {kind!r}")
    return cls


def _row_extra(cls: type) -> dict[str, Any]:
    row = CLASSIFIED.get(qualified_name(cls)) or EXEMPT.get(qualified_name(cls))
    return dict(row.extra) if row is not None else {}


def spec_constructor(draw: SpecDraw) -> tuple[type, dict[str, Any]]:
    """The class and keyword arguments that build ``draw``'s spec (a wrapper's
    ``kv_cache_specs`` hold the inner draws' arguments, built by the caller)."""
    cls = spec_class_by_name(draw.kind)
    if draw.inner:
        return cls, dict(block_size=draw.block_size, kv_cache_specs={f"layer{i}": s for i, s in enumerate(draw.inner)})
    if issubclass(cls, _ki.MambaSpec):
        family = _MAMBA_ARGS
    elif issubclass(cls, _ki.AttentionSpec):
        family = _ATTENTION_ARGS
    else:
        family = {}  # a class this adapter has never seen: vLLM says what it lacks
    return cls, dict(block_size=draw.block_size, **family, **_row_extra(cls), **dict(draw.params))


def build_spec(draw: SpecDraw) -> Any:
    """Build the real vLLM spec object for ``draw``."""
    cls, kwargs = spec_constructor(draw)
    if draw.inner:
        kwargs["kv_cache_specs"] = {name: build_spec(s) for name, s in kwargs["kv_cache_specs"].items()}
    return cls(**kwargs)


def kv_cache_config(layout: LayoutDraw) -> Any:
    """The scheduler-side KV-cache config of ``layout`` (what the engine core
    hands the scheduler: the worker-side uniform-type wrapper is unwrapped
    into its per-layer spec)."""
    groups = [_ki.KVCacheGroupSpec([f"g{i}.layer"], build_spec(g)) for i, g in enumerate(layout.groups)]
    config = _ki.KVCacheConfig(num_blocks=layout.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return _kcu.generate_scheduler_kv_cache_config([config])


def resolve_block_sizes(layout: LayoutDraw) -> tuple[int, int]:
    """Ask vLLM's resolver for (scheduler_block_size, hash_block_size).

    vLLM is the judge of validity: a ``ValueError`` from the resolver becomes
    :class:`InvalidLayout`. Prefix caching is on and ``prefix_match_unit`` is
    the layout's hash block size (left unset for one group, where vLLM forbids
    anything but the block size).
    """
    single = len(layout.groups) == 1
    resolver = _compat.resolver_config(
        block_size=layout.groups[0].block_size,
        prefix_match_unit=None if single else layout.hash_block_size,
    )
    try:
        return _kcu.resolve_kv_cache_block_sizes(kv_cache_config(layout), resolver)
    except Exception as exc:  # noqa: BLE001 - vLLM's verdict, or the suite's misfit
        raise refused(exc) from exc


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


def _sample_params(cls: type, block_size: int) -> tuple[tuple[str, int], ...]:
    """Integer fields a sample instance needs: the table's row says, else
    (a class nobody classified yet) any required field the table knows."""
    row = CLASSIFIED.get(qualified_name(cls)) or EXEMPT.get(qualified_name(cls))
    if row is not None:
        return tuple((p.name, block_size * p.sample) for p in row.params)
    known = {p.name: p for r in (*CLASSIFIED.values(), *EXEMPT.values()) for p in r.params}
    fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
    required = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name in known
    ]
    return tuple((name, block_size * known[name].sample) for name in required)


def spec_facts(cls: type) -> SpecFacts:
    """Build a sample of ``cls`` and ask vLLM what it says about it."""
    sample = None
    error = None
    try:
        inner = (SpecDraw("FullAttentionSpec", 4),) if cls is _ki.UniformTypeKVCacheSpecs else ()
        sample = build_spec(SpecDraw(cls.__name__, 4, _sample_params(cls, 4), inner))
    except Exception as exc:  # noqa: BLE001 - recorded, not hidden
        error = f"{type(exc).__name__}: {exc}"
    kind = manager = None
    if sample is not None:
        with contextlib.suppress(Exception):
            kind = _ki.get_kv_cache_spec_kind(sample).value
        registry = _compat.spec_registry()
        if registry is not None:
            with contextlib.suppress(Exception):
                found = registry.KVCacheSpecRegistry.get_manager_class(sample)
                manager = None if found is None else found.__name__
    return SpecFacts(
        qualname=qualified_name(cls),
        prefix_cacheable=None if sample is None else _compat.prefix_cacheable(sample),
        kind=kind,
        manager=manager,
        is_mamba_subclass=issubclass(cls, _ki.MambaSpec),
        is_attention_subclass=issubclass(cls, _ki.AttentionSpec),
        build_error=error,
    )


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
        _RETIRED_SPEC_CLASSES.add(cls)
