"""Print how long the scheduler repro writer takes to write one file.

    HYPOTHESIS_PROFILE=ci PYTHONPATH=. .venv/bin/python scripts/writer_speed.py [--json OUT]

Writes a file for each of a fixed set of claims, sync and async, from the
same two-step run (:func:`tiny_log`: one full-attention group, one request
with an external hit, as the repro kit's tests write from), and prints the
seconds each took, then their median and total. The files are what a
campaign writes for a finding; the time is the writer's alone (no search,
no shrinking). Run it on two commits to compare them; with ``--json`` the
files themselves are saved too, to check that both commits write the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

CLAIMS = (
    "computed-adds-up", "same-step-hazard", "reads-written", "kv-matches-tokens", "hits-within-namespace",
    "events-replay-index", "preempted-resumable", "in-flight-reads-held", "events-chain", "hit-matches-index",
    "eviction-order", "lookahead-allocated", "hits-after-reset", "index-written", "no-leaked-blocks",
)


def tiny_log(**draw):  # type: ignore[no-untyped-def]
    """Two steps of one request (8 tokens, an external hit of 4) on one
    full-attention group: ``draw`` sets any other SchedulerDraw field."""
    from fuzz.adapter import SchedulerHarness
    from fuzz.model import ExternalReply, LayoutDraw, SchedulerDraw, SpecDraw

    harness = SchedulerHarness(SchedulerDraw(LayoutDraw((SpecDraw("FullAttentionSpec", 4),), 4, 16), **draw))
    harness.add_request(range(8), reply=ExternalReply("store", store_len=4))
    harness.step()
    harness.step()
    return harness.oplog


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the files to this file (claim-async -> source)")
    args = parser.parse_args()
    import fuzz.adapter  # noqa: F401  (vLLM's offline environment first)
    from fuzz.repro.scheduler import scheduler_repro

    files: dict[str, str | None] = {}
    seconds = []
    for async_scheduling in (False, True):
        log = tiny_log(async_scheduling=async_scheduling)
        for claim in CLAIMS:
            start = time.perf_counter()
            files[f"{claim}-{'async' if async_scheduling else 'sync'}"] = scheduler_repro(
                log, invariant=claim, target="t", seed=0, violation="")
            seconds.append(time.perf_counter() - start)
            print(f"{claim} | {'async' if async_scheduling else 'sync'} | {seconds[-1]:.2f} s", flush=True)
    print(f"{len(seconds)} files: median {statistics.median(seconds):.2f} s, total {sum(seconds):.1f} s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(files, out, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
