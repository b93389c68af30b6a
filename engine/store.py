"""Host-memory KV store behind the reference connector (no vLLM import).

Keys are chained SHA-256 digests of the token prefix at a boundary P (a
multiple of the digest unit), so an entry is valid for every prompt sharing
those P tokens. Two kinds of entries:

* attention blocks: the whole paged block that *ends* at P (a full block
  ends at a multiple of the block size; a partial one at a finer P), per
  attention layer;
* Mamba states: the conv and SSM state after exactly P tokens, per Mamba
  layer.

A load to boundary P from an aligned start S needs every attention block
from S up to P and the Mamba state at P. The store is looked up by the
scheduler-side connector and filled/read by the worker-side connector; both
live in the engine-core process, which is where the store lives too.
"""

from __future__ import annotations

import hashlib
import random
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KVStore", "RequestBehaviour", "StorePolicy", "get_store", "prefix_digests"]

_STORES: dict[str, "KVStore"] = {}
_LOCK = threading.Lock()


def get_store(name: str) -> "KVStore":
    """The process-wide store called ``name`` (created on first use)."""
    with _LOCK:
        return _STORES.setdefault(name, KVStore(name))


def prefix_digests(tokens: list[int], unit: int) -> list[bytes]:
    """``d[k]`` is the digest of ``tokens[: (k + 1) * unit]`` (whole units only)."""
    out: list[bytes] = []
    h = b"kvtrunc-root"
    for k in range(len(tokens) // unit):
        piece = ",".join(map(str, tokens[k * unit : (k + 1) * unit])).encode()
        h = hashlib.sha256(h + piece).digest()
        out.append(h)
    return out


@dataclass(frozen=True)
class RequestBehaviour:
    """How the connector treats one request (sent in SamplingParams.extra_args).

    mode:
      honest       report exactly what the store holds
      withhold     report at most ``limit`` tokens beyond the local hit (0: none)
      over_report  report ``extra_units`` store units more than the store holds
                   (capped below the prompt end); the load then finds entries
                   missing and reports the request as a failed receive
      lose         report honestly, then drop the Mamba state at the reported
                   boundary before the load runs (a store eviction racing the
                   lookup); the load reports a failed receive
    silent: planted defect for self-tests only. A failed load is reported as a
      success and whatever the blocks held is used: the oracle must catch it.
    corrupt: planted defect for self-tests only: perturb loaded Mamba states.
    """

    mode: str = "honest"
    extra_units: int = 1
    limit: int = 0
    silent: bool = False
    corrupt: bool = False

    MODES = ("honest", "withhold", "over_report", "lose")

    def __post_init__(self) -> None:
        if self.mode not in self.MODES:
            raise ValueError(f"mode={self.mode!r} is not one of {self.MODES}")
        if self.extra_units < 1:
            raise ValueError(f"extra_units={self.extra_units} < 1")

    @property
    def lies(self) -> bool:
        """The lookup answer may promise more than the store can deliver."""
        return self.mode in ("over_report", "lose")

    def to_extra_args(self) -> dict[str, Any]:
        return {"kvtrunc": {k: getattr(self, k) for k in
                            ("mode", "extra_units", "limit", "silent", "corrupt")}}

    @classmethod
    def from_extra_args(cls, extra: dict[str, Any] | None) -> "RequestBehaviour":
        raw = (extra or {}).get("kvtrunc")
        return cls(**raw) if raw else cls()


@dataclass
class StorePolicy:
    """Store-wide knobs the harness may change between examples."""

    unit: str = "block"  # "block": boundaries at block multiples; "hash": prefix_match_unit
    divergent: bool = False  # supports_divergent_local_hybrid_hits
    save: bool = True
    load: bool = True


@dataclass
class StoreStats:
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    loads: int = 0
    failed_loads: int = 0
    silent_failures: int = 0
    saved_blocks: int = 0
    saved_states: int = 0
    truncation_branch: int = 0  # scheduler took the partial-tail truncation branch (the seed's path)
    diverged_hits: int = 0  # local hybrid hits where attention reached deeper than Mamba

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class KVStore:
    name: str
    attn: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    mamba: dict[bytes, dict[str, tuple[Any, ...]]] = field(default_factory=dict)
    boundary_of: dict[bytes, int] = field(default_factory=dict)
    policy: StorePolicy = field(default_factory=StorePolicy)
    stats: StoreStats = field(default_factory=StoreStats)

    def clear(self) -> None:
        self.attn.clear()
        self.mamba.clear()
        self.boundary_of.clear()
        self.stats = StoreStats()

    def drop_fraction(self, fraction: float, seed: int) -> int:
        """Forget about ``fraction`` of the entries (attention and Mamba alike)."""
        rng = random.Random(seed)
        dropped = 0
        for table in (self.attn, self.mamba):
            for key in sorted(table):
                if rng.random() < fraction:
                    del table[key]
                    dropped += 1
        return dropped

    def mamba_boundaries(self) -> list[int]:
        return sorted(self.boundary_of[k] for k in self.mamba if k in self.boundary_of)
