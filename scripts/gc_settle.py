"""Print what Python's garbage collector costs a scheduler target's examples,
as Python leaves it and settled (:func:`fuzz.hunting.settle_heap`, what the
campaign does once its first round is over).

    PYTHONPATH=. .venv/bin/python scripts/gc_settle.py [--target scheduler-machine] [--examples 60] [--seeds 3]

Each (mode, seed) runs in a fresh process: import vLLM, warm the target up
with a few examples, settle the heap or not, then time one in-process hunt
of ``--examples`` examples with the collector's own callbacks counting its
pauses and collections by generation. The modes alternate seed by seed, so
both see the same load. One line per run, then the medians and the ratio of
the medians' wall time (settled / as left). Used for the figure in
docs/campaign-profile.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("as left", "settled")


def _child(target: str, examples: int, seed: int, settled: bool) -> dict[str, float]:
    import gc

    from fuzz import adapter
    from fuzz.hunting import hunt, settle_heap
    from fuzz.registry import get_target

    adapter.init_hashing()
    strategy, check, machine = get_target(target).load()
    hunt(check, strategy, machine=machine, max_examples=5, seed=10**6 + seed)
    if settled:
        settle_heap()
    paused = {"s": 0.0, "at": 0.0}
    collections = [0, 0, 0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            paused["at"] = time.perf_counter()
        else:
            paused["s"] += time.perf_counter() - paused["at"]
            collections[info["generation"]] += 1

    gc.callbacks.append(count)
    t0 = time.perf_counter()
    hunt(check, strategy, machine=machine, max_examples=examples, seed=seed)
    wall = time.perf_counter() - t0
    gc.callbacks.remove(count)
    return {"wall_s": wall, "gc_s": paused["s"], "young": collections[0], "middle": collections[1],
            "oldest": collections[2]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="scheduler-machine")
    p.add_argument("--examples", type=int, default=60)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        job = json.loads(args.child)
        print("RESULT " + json.dumps(_child(args.target, args.examples, job["seed"], job["settled"])))
        return 0
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for seed in range(1, args.seeds + 1):
        for mode in MODES:
            job = json.dumps({"seed": seed, "settled": mode == "settled"})
            out = subprocess.run([sys.executable, __file__, "--target", args.target, "--examples",
                                  str(args.examples), "--child", job], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout
            (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
            r = json.loads(line[len("RESULT "):])
            runs[mode].append(r)
            print(f"{args.target} seed {seed} {mode:8}: {r['wall_s']:.2f} s, collector {r['gc_s']:.2f} s "
                  f"({100 * r['gc_s'] / r['wall_s']:.0f}%), collections {r['young']}/{r['middle']}/{r['oldest']}",
                  flush=True)
    med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in ("wall_s", "gc_s")} for m in MODES}
    for m in MODES:
        print(f"median {m:8}: {med[m]['wall_s']:.2f} s, collector {med[m]['gc_s']:.2f} s "
              f"({100 * med[m]['gc_s'] / med[m]['wall_s']:.0f}% of the wall time)")
    print(f"settled / as left, median wall time: {med['settled']['wall_s'] / med['as left']['wall_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
