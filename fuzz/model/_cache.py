"""What the prefix cache must still serve: the records of the cache-model
claims (``invariants/cache.py``).

The harness's own model of the prefix cache (``fuzz/adapter/_cache_model.py``)
files an entry for every full block a scheduled request's computation
caches, and drops it only where vLLM's stated policy lets the entry go (the
block handed out fresh, evicted by id, copied over, or a reset that
succeeded). These records are where vLLM's index or a lookup fell short of
it.

Standard library only.
"""

from __future__ import annotations

import dataclasses

__all__ = ["CachedWhileOff", "ForgottenEntry", "ShortHit"]


@dataclasses.dataclass(frozen=True)
class ForgottenEntry:
    """A full-block entry the model says the index must still file, missing
    from it after a step: ``group``'s ``block`` under the key (``key``: the
    hash's first bytes, hex) of the request's prefix of ``tokens`` tokens,
    filed by ``request_id``'s computation in the ``step``'s ``schedule()``."""

    request_id: str
    group: int
    block: int
    tokens: int
    key: str
    step: int

    def describe(self) -> str:
        return (
            f"group {self.group} block {self.block}: the entry for {self.request_id}'s first {self.tokens} "
            f"token(s) (key {self.key}), filed at step {self.step}, is gone from the index, though no "
            "allocation took the block, no eviction named it and no reset succeeded since"
        )


@dataclasses.dataclass(frozen=True)
class CachedWhileOff:
    """An entry in the prefix-cache index of an engine started with prefix
    caching off (``--no-enable-prefix-caching``): ``group``'s ``block`` under
    the key ``key`` (the hash's first bytes, hex), there after ``step``."""

    group: int
    block: int
    key: str
    step: int

    def describe(self) -> str:
        return (
            f"group {self.group} block {self.block} is in the prefix-cache index under key {self.key} after "
            f"step {self.step}, though the engine runs with prefix caching off"
        )


@dataclasses.dataclass(frozen=True)
class ShortHit:
    """A lookup that served ``served`` tokens where the model guarantees
    ``guaranteed``: per group, the model's run of full blocks from token 0
    (``reaches``, tokens) and the blocks holding it (``blocks``)."""

    request_id: str
    served: int
    guaranteed: int
    reaches: tuple[int, ...]
    blocks: tuple[tuple[int, ...], ...]

    def describe(self) -> str:
        return (
            f"request {self.request_id}: the lookup served {self.served} token(s), the model guarantees "
            f"{self.guaranteed} (per group, the entries from token 0 reach {list(self.reaches)}, on blocks "
            f"{[list(b) for b in self.blocks]})"
        )
