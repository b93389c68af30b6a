"""``--shard K/N``: split one campaign across N runners, deterministically.

Runner K (1-based) of N works out its own share from ``K/N``, the target list
and its worker count alone, so a CI matrix needs no coordinator; the runners
share findings through one example database (``--db redis://...``) and
their reports are merged afterwards (``python -m fuzz merge``).

The plan, for T targets (in the order given) and W workers per runner:

- N <= T: runner K fuzzes targets K-1, K-1+N, K-1+2N, ... (each target on
  exactly one runner; runners differ by at most one target).
- N > T: runner K fuzzes target (K-1) mod T as its replica r = (K-1) div T;
  each target gets N div T or one more runners.

Each item is (target, slot); replica r's workers use slots r*W .. r*W+W-1, so
no two runners fuzzing one target share a seed stream (the campaign's round
seed is ``seed*1000003 + slot*10007 + round``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Shard", "merge_campaigns", "parse_shard", "shard_items"]


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


def merge_campaigns(paths: list[Path]) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Merge the ``campaign.json`` files of several shards into one (total, config, elapsed).

    Counts add up; failures are deduplicated by key (the first shard to
    report one wins); elapsed is the longest shard's wall time.
    """
    if not paths:
        raise ValueError("merge: no campaign.json files given")
    total: dict[str, Any] = {"examples": {}, "seconds": {}, "failures": [], "telemetry": {}, "vllm_version": "?"}
    targets: list[str] = []
    shards: list[str] = []
    slots = 0
    elapsed = 0.0
    config: dict[str, Any] = {}
    seen: set[str] = set()
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            part, part_config = data["total"], data["config"]
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"merge: {path} is not a campaign.json written by `python -m fuzz run` ({exc})") from None
        config = config or dict(part_config)
        total["vllm_version"] = part.get("vllm_version", total["vllm_version"])
        for key in ("examples", "seconds"):
            for name, v in part[key].items():
                total[key][name] = total[key].get(name, 0) + v
        for f in part["failures"]:
            if f["key"] not in seen:
                seen.add(f["key"])
                total["failures"].append(f)
        for name, counter in part["telemetry"].items():
            agg = total["telemetry"].setdefault(name, {})
            for label, v in counter.items():
                agg[label] = agg.get(label, 0) + v
        targets += [t for t in part_config["targets"] if t not in targets]
        shards.append(part_config.get("shard") or "1/1")
        slots += part_config["slots"]
        elapsed = max(elapsed, float(data.get("elapsed", 0.0)))
    config.update(targets=targets, slots=slots, shard=", ".join(shards))
    return total, config, elapsed
