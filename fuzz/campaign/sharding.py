"""``--shard K/N``: split one campaign across N runners, deterministically.

Runner K (1-based) of N works out its own share from ``K/N``, the target list
and its worker count alone, so a CI matrix needs no coordinator; the runners
share findings through one example database (``--db redis://...``) and
their reports are merged afterwards (``python -m fuzz merge``,
:mod:`fuzz.campaign.record`).

The plan, for T targets (in the order given) and W workers per runner:

- N <= T: runner K fuzzes targets K-1, K-1+N, K-1+2N, ... (each target on
  exactly one runner; runners differ by at most one target).
- N > T: runner K fuzzes target (K-1) mod T as its replica r = (K-1) div T;
  each target gets N div T or one more runners.

Each item is (target, slot); replica r's workers use slots r*W .. r*W+W-1, so
no two runners fuzzing one target share a seed stream (a slice's seed is
``seed*1000003 + slot*10007 + slice``, :func:`fuzz.campaign.fuzzer.slice_seed`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Shard", "parse_shard", "shard_items"]


@dataclass(frozen=True)
class Shard:
    """Runner ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``"2/4"`` -> ``Shard(2, 4)``; ValueError with the rule broken otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if m is None:
        raise ValueError(f"--shard {text!r}: expected K/N, e.g. 1/4")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1:
        raise ValueError(f"--shard {text!r}: N={n} must be at least 1")
    if not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K={k} must be in 1..{n}")
    return Shard(k, n)


def shard_items(targets: list[str], shard: Shard | None, workers: int) -> list[tuple[str, int]]:
    """This runner's (target, slot) items; every runner computes the same plan."""
    if workers < 1:
        raise ValueError(f"workers={workers} must be at least 1")
    if not targets:
        return []
    if shard is None:
        shard = Shard(1, 1)
    k, n, t = shard.index - 1, shard.count, len(targets)
    if n <= t:
        mine = targets[k::n]
        replica = 0
    else:
        mine = [targets[k % t]]
        replica = k // t
    return [(name, replica * workers + s) for name in mine for s in range(workers)]
