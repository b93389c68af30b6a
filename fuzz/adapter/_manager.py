"""A real ``KVCacheManager`` for one layout, with the operations a
truncation scenario needs (prefill, lookups, evictions) and an observed
``truncate_computed_blocks``."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from fuzz.adapter import _compat
from fuzz.adapter._env import VLLM_VERSION, init_hashing, sha256
from fuzz.adapter._hits import index_hold
from fuzz.adapter._observe import raising_statement, vllm_frames
from fuzz.adapter._specs import kv_cache_config, qualified_name, refused, resolve_block_sizes

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core import kv_cache_utils as _kcu  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from fuzz.model import (  # noqa: E402
    AdmissionObservation,
    BlockRef,
    EagleDraw,
    GroupInfo,
    GroupTruncation,
    LayoutDraw,
    TruncationObservation,
    group_behaviour,
)

__all__ = ["Lookup", "ManagerHarness"]


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
    # Groups whose lookup dropped a matched block for EAGLE (a hit the same
    # call finds longer without the drop); () without EAGLE.
    eagle_dropped: tuple[int, ...] = ()


@contextlib.contextmanager
def _recording_eagle_drops(managers: Sequence[Any], dropped: set[int]) -> Iterator[None]:
    """For the duration, every ``find_longest_cache_hit`` asked to drop the
    EAGLE block is asked again without the drop (the lookups only read the
    cache); the groups where the drop shortened the hit go into ``dropped``."""
    classes = list(dict.fromkeys(type(m) for m in managers))
    saved = {cls: cls.__dict__.get("find_longest_cache_hit") for cls in classes}

    def wrap(cls: type) -> classmethod:
        find = inspect.getattr_static(cls, "find_longest_cache_hit").__func__

        def find_longest_cache_hit(klass: type, *args: Any, **kwargs: Any) -> Any:
            result = find(klass, *args, **kwargs)
            if kwargs.get("drop_eagle_block"):
                _, undropped = find(klass, *args, **{**kwargs, "drop_eagle_block": False})
                if undropped > result[1]:
                    dropped.update(kwargs["kv_cache_group_ids"])
            return result

        return classmethod(find_longest_cache_hit)

    wrapped = {cls: wrap(cls) for cls in classes}
    for cls, method in wrapped.items():
        cls.find_longest_cache_hit = method
    try:
        yield
    finally:
        for cls, original in saved.items():
            if original is None:
                del cls.find_longest_cache_hit
            else:
                cls.find_longest_cache_hit = original


class ManagerHarness:
    """A real ``KVCacheManager`` for one layout, with scenario operations;
    with ``eagle``, built as the scheduler builds it for an EAGLE-style
    drafter (draft groups flagged, ``use_eagle`` on).

    Raises :class:`InvalidLayout` when vLLM refuses the layout.
    """

    _ids = itertools.count()

    def __init__(self, layout: LayoutDraw, eagle: EagleDraw | None = None) -> None:
        init_hashing()
        self.layout = layout
        self.eagle = eagle
        sched, hash_bs = resolve_block_sizes(layout)
        self.scheduler_block_size = sched
        self.hash_block_size = hash_bs
        try:
            self.config = kv_cache_config(layout)
            if eagle is not None:
                _compat.flag_draft_groups(self.config, eagle.draft_groups)
            self.manager = KVCacheManager(
                self.config,
                max_model_len=layout.max_model_len,
                scheduler_block_size=sched,
                hash_block_size=hash_bs,
                enable_caching=True,
                **_compat.eagle_manager_kwargs(eagle is not None),
            )
        except Exception as exc:  # noqa: BLE001 - vLLM's verdict, or the suite's misfit
            raise refused(exc) from exc
        # The groups whose lookups drop the last matched block for EAGLE.
        self.eagle_drop_group_ids = _compat.eagle_drop_group_ids(self.manager.coordinator)
        self.groups = tuple(
            GroupInfo(
                index=i,
                spec_class=qualified_name(type(g.kv_cache_spec)),
                inner_classes=tuple(
                    qualified_name(type(s))
                    for s in getattr(g.kv_cache_spec, "kv_cache_specs", {}).values()
                ),
                block_size=mgr.block_size,
                prefix_cacheable=_compat.prefix_cacheable(g.kv_cache_spec),
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
        return _compat.partial_hits_enabled(self.manager.coordinator)

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
        """Look ``tokens`` up the way a scheduler would (see :meth:`_lookup`),
        recording which groups' lookups dropped a block for EAGLE."""
        if not self.eagle_drop_group_ids:
            return self._lookup(tokens, mode)
        dropped: set[int] = set()
        with _recording_eagle_drops(self.manager.coordinator.single_type_managers, dropped):
            found = self._lookup(tokens, mode)
        return dataclasses.replace(found, eagle_dropped=tuple(sorted(dropped)))

    def _lookup(self, tokens: Sequence[int], mode: str) -> Lookup:
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
            if _compat.has_per_group_lookup(coord):
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
        found = self._lookup(tokens, "per_group")
        return tuple(
            tuple(b.block_id for b in group if not b.is_null) for group in found.blocks.blocks
        )

    def evict(self, block_ids: set[int]) -> None:
        """Drop blocks from the prefix cache (the connector-load-failure path's call)."""
        self.manager.evict_blocks(set(block_ids))

    def evict_entry(self, tokens: Sequence[int], length: int, group: int) -> None:
        """Drop from the prefix cache the block that ``group`` files the
        prefix of ``tokens`` of ``length`` tokens (a multiple of the hash
        block) under."""
        req = self._request(tokens)
        key = _kcu.make_block_hash_with_group_id(req.block_hashes[length // self.hash_block_size - 1], group)
        cached = _compat.prefix_cache_map(self.manager.block_pool)
        entry = None if cached is None else cached.get(key)
        if entry is None:
            raise KeyError(f"group {group} files no entry for the prefix of {length} tokens")
        self.evict({(entry if hasattr(entry, "block_id") else next(iter(entry.values()))).block_id})

    def admission(self, tokens: Sequence[int]) -> AdmissionObservation:
        """A joint lookup of ``tokens`` (``get_computed_blocks``) as the
        hit-length claim sees a scheduler's: the index read as the lookup
        begins (fuzz/adapter/_hits.py) and the hit it served."""
        req = self._request(tokens)
        held = index_hold(self.manager, req, None, _compat.prefix_cache_map(self.manager.block_pool),
                          self.partial_hits_enabled)
        _, hit, _ = self.manager.get_computed_blocks(req)
        return AdmissionObservation(
            request_id=req.request_id, step=0, num_tokens=req.num_tokens, groups=self.groups,
            spans=(None,) * len(self.groups), behaviours=tuple(group_behaviour(g) for g in self.groups),
            span_rules=(None,) * len(self.groups), scheduler_block_size=self.scheduler_block_size,
            hash_block_size=self.hash_block_size, null_block_id=self.manager.block_pool.null_block.block_id,
            divergent_capable=False, local_hit=hit, local_blocks=(), hit_diverged=False, per_group_hits=(),
            joint_hit=hit, joint_blocks=(), **held,
        )

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
        error_type: str | None = None
        frames: tuple[str, ...] = ()
        statement = ""
        out_groups: Sequence[Sequence[Any]] | None = None
        try:
            result = self.manager.truncate_computed_blocks(blocks, endpoint)
            out_groups = result.blocks
        except Exception as exc:  # noqa: BLE001 - every failure is an observation
            error, error_type, frames = f"{type(exc).__name__}: {exc}", type(exc).__name__, vllm_frames(exc)
            statement = raising_statement(exc)
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
            error_type=error_type,
            error_frames=frames,
            error_statement=statement,
        )
