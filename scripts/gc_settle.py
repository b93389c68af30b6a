"""Print what Python's garbage collector costs a scheduler target's examples,
as Python leaves the heap and settled (:func:`fuzz.hunting.settle_heap`,
what the campaign does once its first round is over).

    PYTHONPATH=. .venv/bin/python scripts/gc_settle.py [--target scheduler-machine] [--examples 60] [--seeds 5]

One process imports vLLM and warms the target up; then, for each seed, it
runs the same hunt of ``--examples`` examples twice, once with the heap as
Python leaves it (nothing frozen, the default thresholds) and once settled,
alternating which goes first, with the collector's own callbacks counting
its pauses and collections by generation. Same process, same examples:
the pair differs only in the collector. One line per run, then the medians
and, seed by seed, the ratio of CPU time (settled / as left). Used for the
figure in docs/campaign-profile.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

MODES = ("as left", "settled")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="scheduler-machine")
    p.add_argument("--examples", type=int, default=60)
    p.add_argument("--seeds", type=int, default=5)
    args = p.parse_args()

    from fuzz import adapter
    from fuzz.hunting import hunt, settle_heap
    from fuzz.registry import get_target

    adapter.init_hashing()
    strategy, check, machine = get_target(args.target).load()
    hunt(check, strategy, machine=machine, max_examples=5, seed=10**6)
    default = gc.get_threshold()
    paused = {"s": 0.0, "at": 0.0}
    collections = [0, 0, 0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            paused["at"] = time.perf_counter()
        else:
            paused["s"] += time.perf_counter() - paused["at"]
            collections[info["generation"]] += 1

    def run(mode: str, seed: int) -> dict[str, float]:
        gc.unfreeze()
        gc.set_threshold(*default)
        gc.collect()
        if mode == "settled":
            settle_heap()
        paused["s"], collections[:] = 0.0, [0, 0, 0]
        gc.callbacks.append(count)
        t0, c0 = time.perf_counter(), time.process_time()
        hunt(check, strategy, machine=machine, max_examples=args.examples, seed=seed)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        gc.callbacks.remove(count)
        return {"wall_s": wall, "cpu_s": cpu, "gc_s": paused["s"], "young": collections[0],
                "middle": collections[1], "oldest": collections[2]}

    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for seed in range(1, args.seeds + 1):
        for mode in (MODES if seed % 2 else MODES[::-1]):
            r = run(mode, seed)
            runs[mode].append(r)
            print(f"{args.target} seed {seed} {mode:8}: {r['wall_s']:.2f} s ({r['cpu_s']:.2f} s of CPU), "
                  f"collector {r['gc_s']:.2f} s ({100 * r['gc_s'] / r['wall_s']:.0f}%), "
                  f"collections {r['young']:.0f}/{r['middle']:.0f}/{r['oldest']:.0f}", flush=True)
    for m in MODES:
        med = {k: statistics.median(r[k] for r in runs[m]) for k in ("wall_s", "cpu_s", "gc_s")}
        print(f"median {m:8}: {med['wall_s']:.2f} s ({med['cpu_s']:.2f} s of CPU), collector "
              f"{med['gc_s']:.2f} s ({100 * med['gc_s'] / med['wall_s']:.0f}% of the wall time)")
    ratios = [s["cpu_s"] / a["cpu_s"] for a, s in zip(runs["as left"], runs["settled"])]
    print(f"settled / as left, CPU time of the same examples: median {statistics.median(ratios):.2f} "
          f"(seeds: {', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
