"""A hybrid-aware (HMA) reference KV connector for tests.

Load it with::

    KVTransferConfig(kv_connector="ReferenceHybridConnector",
                     kv_connector_module_path="engine.connector",
                     kv_role="kv_both",
                     kv_connector_extra_config={"store": NAME})

It really saves and loads: after each step the worker side copies the paged
attention blocks and the Mamba conv/SSM states at the step's end boundary
into :class:`engine.store.KVStore` (host memory); a later lookup reports the
longest stored boundary and the load copies the blocks and the state back.
Loads are asynchronous in vLLM's sense (the request waits in
WAITING_FOR_REMOTE_KVS for one step), which is how a Mamba state reaches its
block before the model runner's align-mode pre-copy reads it; a synchronous
load would land after that copy.

Why vLLM's own connectors don't serve: the example connector refuses hybrid
KV configs and never saves Mamba state; the offloading connectors need a GPU.

Layout facts this relies on (checked at run time, failing loudly otherwise):
every prefix-cacheable group has the same block size ``B``; a layer's paged
cache has the block index on dim 0 (dim 1 for a leading K/V pair); in align
mode the state after ``P`` tokens lives in the Mamba block at index
``(P - 1) // B`` of the request's block list, and the running state after a
step ending at ``E`` is in block ``ceil(E / B) - 1``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.v1.kv_cache_interface import MambaSpec

from engine.store import KVStore, RequestBehaviour, get_store, prefix_digests

try:  # present in 0.32/0.33; labels where external hits came from
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # pragma: no cover - older releases
    CacheHitSource = None  # type: ignore[assignment]

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorTransferResults,
    )
except ImportError:  # pragma: no cover - older releases
    KVConnectorTransferResults = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["ReferenceHybridConnector"]

_DEBUG = bool(os.environ.get("KVTRUNC_CONNECTOR_DEBUG"))


@dataclass
class _LoadJob:
    req_id: str
    start: int
    end: int
    # (group id, block id, store key) triples
    attn: list[tuple[int, int, bytes]]
    mamba: list[tuple[int, int, bytes]]
    silent: bool = False
    corrupt: bool = False


@dataclass
class _SaveJob:
    req_id: str
    attn: list[tuple[int, int, bytes, int]]  # + boundary
    mamba: list[tuple[int, int, bytes, int]]


@dataclass
class ReferenceConnectorMetadata(KVConnectorMetadata):
    loads: list[_LoadJob] = field(default_factory=list)
    saves: list[_SaveJob] = field(default_factory=list)


@dataclass
class _Plan:
    start: int
    end: int
    behaviour: RequestBehaviour
    promised: int  # tokens promised (end - start)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class ReferenceHybridConnector(KVConnectorBase_V1, SupportsHMA):
    if CacheHitSource is not None:
        _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self,
        vllm_config: "VllmConfig",
        role: KVConnectorRole,
        kv_cache_config: "KVCacheConfig",
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.store: KVStore = get_store(extra.get("store", "default"))
        cache = vllm_config.cache_config
        self.hash_unit = int(getattr(cache, "hash_block_size", None) or cache.prefix_match_unit or cache.block_size)
        self.attn_groups: list[int] = []
        self.mamba_groups: list[int] = []
        sizes = set()
        for gid, group in enumerate(kv_cache_config.kv_cache_groups):
            spec = group.kv_cache_spec
            if isinstance(spec, MambaSpec):
                self.mamba_groups.append(gid)
            else:
                self.attn_groups.append(gid)
            sizes.add(spec.block_size)
        if len(sizes) != 1:
            raise NotImplementedError(
                f"ReferenceHybridConnector needs one block size for all groups, got {sorted(sizes)}"
            )
        (self.block_size,) = sizes
        if self.block_size % self.hash_unit:
            raise ValueError(f"block_size={self.block_size} is not a multiple of hash unit {self.hash_unit}")
        self.group_layers = {gid: list(g.layer_names) for gid, g in enumerate(kv_cache_config.kv_cache_groups)}
        self.num_blocks = kv_cache_config.num_blocks
        # scheduler side
        self._requests: dict[str, "Request"] = {}
        self._plans: dict[str, _Plan] = {}
        self._lied: set[str] = set()
        self._loads: list[_LoadJob] = []
        # worker side
        self._layers: dict[str, Any] = {}
        self._recv_done: set[str] = set()
        self._recv_failed: set[str] = set()

    # ------------------------------------------------------------ properties
    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return self.store.policy.divergent

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a dropped save is a future miss, nothing more.
        return False

    @property
    def unit(self) -> int:
        return self.block_size if self.store.policy.unit == "block" else self.hash_unit

    # ------------------------------------------------------- scheduler side
    def on_new_request(self, request: "Request") -> None:
        self._requests[request.request_id] = request

    def _tokens(self, request: "Request") -> list[int]:
        return list(request.all_token_ids[: request.num_tokens])

    def _keys(self, digests: list[bytes], start: int, end: int) -> tuple[list[tuple[int, bytes]], bytes | None]:
        """Attention (block index, key) pairs covering [start, end), and the Mamba key at end."""
        B, G = self.block_size, self.hash_unit
        attn = []
        for k in range(start // B, _cdiv(end, B)):
            boundary = min((k + 1) * B, end)
            attn.append((k, digests[boundary // G - 1]))
        return attn, digests[end // G - 1] if end else None

    def _available(self, digests: list[bytes], start: int, end: int) -> bool:
        attn, mkey = self._keys(digests, start, end)
        return mkey in self.store.mamba and all(key in self.store.attn for _, key in attn)

    def get_num_new_matched_tokens(
        self, request: "Request", num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        self._requests.setdefault(request.request_id, request)
        st = self.store
        st.stats.lookups += 1
        if not st.policy.load:
            return 0, False
        behaviour = RequestBehaviour.from_extra_args(getattr(request.sampling_params, "extra_args", None))
        start, U = num_computed_tokens, self.unit
        if start % self.block_size:
            raise AssertionError(f"lookup start {start} not aligned to block {self.block_size}")
        tokens = self._tokens(request)
        # Leave at least one token to compute: the scheduler would otherwise
        # replay the last one from a state that is not a stored boundary.
        cap = (len(tokens) - 1) // U * U
        digests = prefix_digests(tokens, self.hash_unit)
        found = start
        for end in range(cap, start, -U):
            if self._available(digests, start, end):
                found = end
                break
        end = found
        if behaviour.mode == "withhold":
            # Report less, but only what is really there: the longest stored
            # boundary within the limit (a withheld answer must stay true).
            end = start
            for cand in range(min(found, (start + behaviour.limit) // U * U), start, -U):
                if self._available(digests, start, cand):
                    end = cand
                    break
        elif behaviour.mode == "over_report" and request.request_id not in self._lied:
            # Lie once per request: after the failed load, vLLM retries the
            # lookup, and a store that just failed a load answers truthfully
            # (a connector that lies forever livelocks any engine).
            self._lied.add(request.request_id)
            end = min(max(found, start) + behaviour.extra_units * U, cap)
        if _DEBUG:
            print(f"[refconn] lookup {request.request_id} len={len(tokens)} start={start} found={found} "
                  f"end={end} mode={behaviour.mode} stored={self.store.mamba_boundaries()}", flush=True)
        if end <= start:
            self._plans.pop(request.request_id, None)
            return 0, False
        self._plans[request.request_id] = _Plan(start, end, behaviour, end - start)
        st.stats.hits += 1
        st.stats.hit_tokens += end - start
        return end - start, True

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        if num_external_tokens <= 0:
            return
        plan = self._plans.pop(request.request_id)
        start = plan.start
        end = start + num_external_tokens
        tokens = self._tokens(request)
        digests = prefix_digests(tokens, self.hash_unit)
        attn_keys, mkey = self._keys(digests, start, end)
        assert mkey is not None
        block_ids = blocks.get_block_ids()
        B = self.block_size
        attn = [(gid, block_ids[gid][k], key) for gid in self.attn_groups for k, key in attn_keys]
        state_idx = (end - 1) // B
        mamba = [(gid, block_ids[gid][state_idx], mkey) for gid in self.mamba_groups]
        if plan.behaviour.mode == "lose":
            # An eviction racing the lookup: the promised state is gone by load time.
            self.store.mamba.pop(mkey, None)
        self._loads.append(
            _LoadJob(request.request_id, start, end, attn, mamba,
                     silent=plan.behaviour.silent, corrupt=plan.behaviour.corrupt)
        )

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = ReferenceConnectorMetadata(loads=self._loads)
        self._loads = []
        if not self.store.policy.save or self._kv_cache_manager is None:
            return meta
        starts: dict[str, int] = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            starts[req_id] = cached.num_computed_tokens[i]
        null_id = self._kv_cache_manager.block_pool.null_block.block_id
        B, G, U = self.block_size, self.hash_unit, self.unit
        for req_id, start in starts.items():
            n = scheduler_output.num_scheduled_tokens.get(req_id, 0)
            request = self._requests.get(req_id)
            if n <= 0 or request is None:
                continue
            stop = min(start + n, request.num_prompt_tokens)
            if stop <= 0:
                continue
            digests = prefix_digests(list(request.prompt_token_ids or []), G)
            block_ids = self._kv_cache_manager.get_block_ids(req_id)
            attn: list[tuple[int, int, bytes, int]] = []
            for k in range(stop // B):
                key = digests[(k + 1) * B // G - 1]
                if key in self.store.attn:
                    continue
                for gid in self.attn_groups:
                    if block_ids[gid][k] != null_id:
                        attn.append((gid, block_ids[gid][k], key, (k + 1) * B))
            end = start + n
            mamba: list[tuple[int, int, bytes, int]] = []
            if end <= request.num_prompt_tokens and end % U == 0:
                key = digests[end // G - 1]
                if end % B:
                    # The partial block that ends at this fine boundary.
                    for gid in self.attn_groups:
                        attn.append((gid, block_ids[gid][end // B], key, end))
                for gid in self.mamba_groups:
                    bid = block_ids[gid][_cdiv(end, B) - 1]
                    if bid != null_id:
                        mamba.append((gid, bid, key, end))
            if _DEBUG and (attn or mamba):
                print(f"[refconn] save {req_id} step [{start},{start + n}) blocks={[b for _, _, _, b in attn]} "
                      f"states={[b for _, _, _, b in mamba]}", flush=True)
            if attn or mamba:
                meta.saves.append(_SaveJob(req_id, attn, mamba))
        return meta

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request.request_id)
        return False, None

    def request_finished_all_groups(
        self, request: "Request", block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request.request_id)
        return False, None

    def _forget(self, req_id: str) -> None:
        self._requests.pop(req_id, None)
        self._plans.pop(req_id, None)
        self._lied.discard(req_id)

    # ---------------------------------------------------------- worker side
    def _caches(self, layer_name: str) -> tuple[torch.Tensor, ...]:
        layer = self._layers[layer_name]
        kv = layer.kv_cache
        if isinstance(kv, torch.Tensor):
            return (kv,)
        kv = tuple(kv)
        if kv and isinstance(kv[0], (list, tuple)):  # per-virtual-engine lists
            kv = tuple(kv[0])
        return kv

    def _block(self, t: torch.Tensor, block_id: int) -> torch.Tensor:
        if t.shape[0] >= self.num_blocks:
            return t[block_id]
        if t.dim() > 1 and t.shape[0] == 2 and t.shape[1] >= self.num_blocks:
            return t[:, block_id]
        raise AssertionError(
            f"cannot find the block dimension of a paged cache of shape {tuple(t.shape)} "
            f"(num_blocks={self.num_blocks})"
        )

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        self._layers = forward_context.no_compile_layers
        meta = self._get_connector_metadata()
        assert isinstance(meta, ReferenceConnectorMetadata)
        st = self.store
        for job in meta.loads:
            st.stats.loads += 1
            missing = [k for _, _, k in job.attn if k not in st.attn] + [
                k for _, _, k in job.mamba if k not in st.mamba
            ]
            if missing and not job.silent:
                st.stats.failed_loads += 1
                self._recv_failed.add(job.req_id)
                continue
            if missing:
                st.stats.silent_failures += 1
            for gid, bid, key in job.attn:
                entry = st.attn.get(key)
                if entry is None:
                    continue
                for layer in self.group_layers[gid]:
                    for dst, src in zip(self._caches(layer), entry[layer]):
                        self._block(dst, bid).copy_(src)
            for gid, bid, key in job.mamba:
                entry = st.mamba.get(key)
                if entry is None:
                    continue
                for layer in self.group_layers[gid]:
                    for dst, src in zip(self._caches(layer), entry[layer]):
                        blk = self._block(dst, bid)
                        blk.copy_(src)
                        if job.corrupt:
                            blk.add_(torch.randn_like(blk) * 0.5)
            self._recv_done.add(job.req_id)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # saves happen once per step in wait_for_save

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, ReferenceConnectorMetadata)
        if not meta.saves:
            return
        if not self._layers:
            from vllm.forward_context import get_forward_context

            self._layers = get_forward_context().no_compile_layers
        st = self.store
        for job in meta.saves:
            for gid, bid, key, boundary in job.attn:
                entry = st.attn.setdefault(key, {})
                for layer in self.group_layers[gid]:
                    entry[layer] = tuple(self._block(t, bid).detach().clone().cpu() for t in self._caches(layer))
                st.boundary_of.setdefault(key, boundary)
                st.stats.saved_blocks += 1
            for gid, bid, key, boundary in job.mamba:
                entry = st.mamba.setdefault(key, {})
                for layer in self.group_layers[gid]:
                    entry[layer] = tuple(self._block(t, bid).detach().clone().cpu() for t in self._caches(layer))
                st.boundary_of.setdefault(key, boundary)
                st.stats.saved_states += 1

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done = self._recv_done | self._recv_failed
        self._recv_done, self._recv_failed = set(), set()
        return None, done or None

    def get_transfer_results(self, finished_req_ids: set[str]):
        failed = set(self._recv_failed)
        done = self._recv_done | failed
        self._recv_done, self._recv_failed = set(), set()
        if KVConnectorTransferResults is None:  # pragma: no cover
            return None, done
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed)
