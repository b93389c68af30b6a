"""What a campaign counted: one type for a slot, a worker, a runner and a
sharded campaign.

A worker counts into its :class:`Totals` and writes them to its progress
file; the runner merges the workers' files, and ``python -m fuzz
merge`` the runners' ``campaign.json`` files, with the same :meth:`Totals.merge`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Totals", "is_missed_hit"]


def _add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _earliest(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: min(v for v in (a.get(k), b.get(k)) if v is not None) for k in {**a, **b}}


def is_missed_hit(failure: dict[str, Any]) -> bool:
    """The sidecar is a missed hit (fuzz.outcomes), not a violation."""
    return failure.get("outcome") == "missed hit"


def _targets(failure: dict[str, Any]) -> list[str]:
    return list(failure.get("targets") or [failure["target"]])


@dataclass
class Totals:
    """Counts per target, the distinct failures, and what the targets reached.

    ``failures`` holds one repro sidecar (a dict, see ``fuzz.campaign.worker``)
    per distinct key; when two parts found the same failure, the earlier
    finding is kept.
    """

    examples: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # time each target ran
    failures: list[dict[str, Any]] = field(default_factory=list)
    telemetry: dict[str, dict[str, int]] = field(default_factory=dict)  # counter name -> label -> count
    vllm_version: str = "?"
    # Seconds from the runner's start: when each target ran its first example,
    # and when each worker was ready to fuzz (its start-up: importing vLLM).
    first_example_s: dict[str, float] = field(default_factory=dict)
    startup_s: list[float] = field(default_factory=list)
    # Per worker slot, the target of each slice in the order the slices ran
    # (fairness is asserted on this order, never on the clock).
    turns: dict[str, list[str]] = field(default_factory=dict)
    # Per worker slot, every slice as [target, why it got the slice, seconds,
    # examples, new behaviours] (fuzz.campaign.schedule: the report's schedule).
    slices: dict[str, list[list[Any]]] = field(default_factory=dict)
    # Targets the installed vLLM cannot host: target -> one line naming what it lacks.
    unsupported: dict[str, str] = field(default_factory=dict)

    def merge(self, other: Totals) -> Totals:
        """The sum of two parts (counts add up, failures are deduplicated by
        key: the earlier finding is kept, listing every target of both)."""
        failures = {f["key"]: f for f in self.failures}
        for f in other.failures:
            mine = failures.get(f["key"])
            if mine is None:
                failures[f["key"]] = f
                continue
            first, second = (f, mine) if f.get("found_after_s", 0) < mine.get("found_after_s", 0) else (mine, f)
            targets = list(dict.fromkeys(_targets(first) + _targets(second)))
            merged = {**first, "targets": targets}
            if second.get("reach") == "engine-reachable":  # the strongest label wins
                merged["reach"], merged["reach_reason"] = second["reach"], second.get("reach_reason")
            failures[f["key"]] = merged
        names = set(self.telemetry) | set(other.telemetry)
        return Totals(
            examples=_add(self.examples, other.examples),
            seconds=_add(self.seconds, other.seconds),
            failures=list(failures.values()),
            telemetry={n: _add(self.telemetry.get(n, {}), other.telemetry.get(n, {})) for n in sorted(names)},
            vllm_version=other.vllm_version if other.vllm_version != "?" else self.vllm_version,
            first_example_s=_earliest(self.first_example_s, other.first_example_s),
            startup_s=self.startup_s + other.startup_s,
            turns={**self.turns, **other.turns},
            slices={**self.slices, **other.slices},
            unsupported={**self.unsupported, **other.unsupported},
        )

    @classmethod
    def sum(cls, parts: Iterable[Totals]) -> Totals:
        total = cls()
        for part in parts:
            total = total.merge(part)
        return total

    @property
    def example_count(self) -> int:
        return sum(self.examples.values())

    @property
    def new_failures(self) -> list[dict[str, Any]]:
        """The violations that are no known vLLM bug of the installed release
        (missed hits are counted apart: :attr:`missed_hits`)."""
        return [f for f in self.failures if not f.get("known_bug") and not is_missed_hit(f)]

    @property
    def violations(self) -> list[dict[str, Any]]:
        """Every distinct violation, known vLLM bugs included (no missed hit)."""
        return [f for f in self.failures if not is_missed_hit(f)]

    @property
    def missed_hits(self) -> list[dict[str, Any]]:
        """The distinct missed hits: lookups that served less than the index held."""
        return [f for f in self.failures if is_missed_hit(f)]

    # -- the wire format (progress files, campaign.json) -------------------------
    def to_json(self) -> dict[str, Any]:
        return {"examples": self.examples, "seconds": self.seconds, "failures": self.failures,
                "telemetry": self.telemetry, "vllm_version": self.vllm_version,
                "first_example_s": self.first_example_s, "startup_s": self.startup_s, "turns": self.turns,
                "slices": self.slices, "unsupported": self.unsupported}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Totals:
        return cls(
            examples=dict(data["examples"]),
            seconds=dict(data["seconds"]),
            failures=list(data["failures"]),
            telemetry={k: dict(v) for k, v in data.get("telemetry", {}).items()},
            vllm_version=data.get("vllm_version", "?"),
            first_example_s=dict(data.get("first_example_s", {})),
            startup_s=list(data.get("startup_s", [])),
            turns={k: list(v) for k, v in data.get("turns", {}).items()},
            slices={k: [list(s) for s in v] for k, v in data.get("slices", {}).items()},
            unsupported=dict(data.get("unsupported", {})),
        )
