"""Benchmarks: ``python -m fuzz.bench [--seeds 5] [--examples 600] [--quick]``.

Prints, for each target tier available:
- examples per second (median over repeated runs; these machines are noisy),
- the share of wall time spent inside vLLM's own code (cProfile self time of
  functions defined under the installed ``vllm`` package),
- seconds to find each planted bug (median of N seeds, clock stopped at the
  first failing example, before shrinking), with min/max.
Figures belong here, never in timed tests.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

from fuzz import adapter
from fuzz.hunting import hunt

__all__ = ["main"]


def _vllm_share(body: Callable[[Any], None], strategy: Any, examples: int) -> float:
    prof = cProfile.Profile()
    prof.enable()
    hunt(body, strategy, max_examples=examples, seed=12345)
    prof.disable()
    stats = pstats.Stats(prof)
    total = sum(row[2] for row in stats.stats.values())  # tottime
    in_vllm = sum(row[2] for key, row in stats.stats.items() if "/vllm/" in key[0])
    return in_vllm / total if total else 0.0


def _rate(body: Callable[[Any], None], strategy: Any, examples: int, repeats: int) -> list[float]:
    rates = []
    for r in range(repeats):
        res = hunt(body, strategy, max_examples=examples, seed=1000 + r)
        if res.found:
            raise SystemExit(f"unmodified vLLM failed during the benchmark: {res.violation}")
        rates.append(res.examples / res.seconds)
    return rates


def _time_to_find(body, strategy, bug: str, seeds: int, budget: int) -> tuple[list[float], int]:
    times, misses = [], 0
    with adapter.planted_truncate_bug(bug):
        for s in range(seeds):
            res = hunt(body, strategy, max_examples=budget, seed=s)
            if res.found:
                times.append(res.seconds)
            else:
                misses += 1
    return times, misses


def _fmt(values: list[float]) -> str:
    if not values:
        return "not found"
    return f"median {statistics.median(values):7.2f}  (min {min(values):.2f}, max {max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per planted bug (median reported)")
    parser.add_argument("--examples", type=int, default=600, help="examples per throughput run")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs (median reported)")
    parser.add_argument("--find-budget", type=int, default=3000, help="max examples when hunting a planted bug")
    args = parser.parse_args(argv)
    adapter.init_hashing()

    from fuzz.targets.target_truncate import any_layout_scenarios, check_truncation_scenario, hybrid_scenarios
    from strategies.scenarios import truncation_scenarios
    from strategies.specs import kv_cache_layouts

    from fuzz import telemetry

    print(f"vLLM {adapter.VLLM_VERSION}; benchmark of the truncate-level target")
    print("(2-core shared machine: medians; compare ratios, not absolute numbers)\n")
    hybrid = hybrid_scenarios()
    for name, strategy in [("truncate-hybrid", hybrid), ("truncate-any-layout", any_layout_scenarios())]:
        rates = _rate(check_truncation_scenario, strategy, args.examples, args.repeats)
        share = _vllm_share(check_truncation_scenario, strategy, max(args.examples // 2, 100))
        print(f"{name:<22} examples/s {_fmt(rates)}   time inside vLLM code {100 * share:.0f}%")
    layouts = sum(telemetry.COUNTERS["layouts"].values())
    rejected = sum(telemetry.COUNTERS["rejections"].values())
    print(f"layouts vLLM rejected: {rejected} of {layouts + rejected} drawn {dict(telemetry.COUNTERS['rejections'])}")

    with_scratch = truncation_scenarios(
        layouts=kv_cache_layouts(min_groups=3, max_groups=4, required=("FullAttentionSpec", "MambaSpec", "CircularBufferSpec"))
    )
    print(f"\nseconds to find each planted bug (median of {args.seeds} seeds, budget {args.find_budget} examples):")
    for bug in adapter.PLANTED_TRUNCATE_BUGS:
        strategy = with_scratch if bug == "scratch_gets_null" else hybrid
        times, misses = _time_to_find(check_truncation_scenario, strategy, bug, args.seeds, args.find_budget)
        miss = f"  missed by {misses} seed(s)" if misses else ""
        print(f"  {bug:<22} {_fmt(times)}{miss}")

    try:
        from fuzz.targets.scheduler import bench_scheduler  # the scheduler tier, when present
    except ImportError:
        print("\n(scheduler tier not available)")
        return 0
    print("\nscheduler tier:")
    for key, value in bench_scheduler(seeds=args.seeds).items():
        print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
