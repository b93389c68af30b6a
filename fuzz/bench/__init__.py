"""Benchmarks: ``python -m fuzz.bench [--targets ...] [--examples 400] [--repeats 3] [--seeds 5]``.

For each target, in its own fresh process (so no figure depends on what ran
before it: no heap, cache, patched vLLM or profiler is carried over):

- **start-up**: seconds to import the adapter (vLLM) and to run the first
  example after that (the target's module, its first vLLM configuration);
- **warm-up**: the first in-process run of ``--examples`` examples, reported
  on its own and left out of the medians;
- **raw**: examples per second of the target in-process
  (:func:`fuzz.hunting.hunt`: generate and target phases, no database),
  median of ``--repeats`` runs;
- **campaign**: examples per second of the same target inside the campaign's
  worker loop (:func:`fuzz.campaign.fuzzer.run_slot`: fair slices, a
  directory example database, progress files, telemetry) for
  ``--campaign-seconds``, its first slice left out; median of ``--repeats``
  runs, alternated with the raw ones so both see the same machine load;
- **campaign/raw**, the ratio of the medians;
- the share of wall time inside vLLM's own code (cProfile self time of
  functions under the installed ``vllm`` package).

Then seconds to find each planted bug (median of ``--seeds`` seeds, clock
stopped at the first failing example, before shrinking). Figures belong
here, never in timed tests; on a shared machine compare ratios.

``--ownership-cost`` instead measures what the block-ownership model
(:mod:`invariants.ownership`, :mod:`fuzz.adapter._ownership`) costs each
scheduler target: examples per second with the model on and off (the spy's
wrappers not installed, no observation, the checks see none), alternated,
medians of ``--repeats``; and, with it on, microseconds per step spent
building the observation and running the four checks.

``--model-cost`` instead measures, per scheduler target, each reference
model's and each invariant module's microseconds per step (fuzz/bench/model_cost.py).

``--breakdown SECONDS`` instead runs each target's campaign worker loop for
that long and prints where its time went: Hypothesis's phases (replay,
generation, target, shrink), the target itself (vLLM and the invariants),
the pareto front, garbage collection, progress files, database checks and
slice set-up (docs/campaign-profile.md).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fuzz.bench.breakdown import child_breakdown, report_breakdown
from fuzz.bench.model_cost import child_model_cost, report_model_cost

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]


# -- in the child process ------------------------------------------------------
class _Work:
    """Counts the ``schedule()`` steps the scheduler targets run (every one
    goes through :meth:`fuzz.runners.scheduler.Stepper.step`), so a rate can
    be read per unit of work. A scheduler example is anything from one step
    to hundreds, and how heavy the examples are depends on the seed and on
    how long the Hypothesis run is (docs/campaign-profile.md), so examples
    per second of two runs compare the examples they drew as much as the
    speed of what ran them. A truncation example is one truncation: there
    examples are the unit of work (``steps`` stays 0)."""

    steps = 0

    @classmethod
    @contextlib.contextmanager
    def counted(cls) -> Any:
        from fuzz.runners.scheduler import Stepper

        step = Stepper.step

        def counting(self: Any) -> Any:
            cls.steps += 1
            return step(self)

        Stepper.step = counting  # type: ignore[method-assign]
        try:
            yield
        finally:
            Stepper.step = step  # type: ignore[method-assign]


def _raw_run(target: Any, examples: int, seed: int) -> tuple[float, int, float, int]:
    """(examples/s, examples, seconds, schedule() steps) of one in-process run."""
    from fuzz.hunting import hunt

    strategy, check, machine = target.load()
    before = _Work.steps
    with _Work.counted():
        res = hunt(check, strategy, machine=machine, max_examples=examples, seed=seed)
    if res.found:
        raise SystemExit(f"{target.name}: unmodified vLLM failed during the benchmark: {res.violation}")
    return res.examples / res.seconds, res.examples, res.seconds, _Work.steps - before


def _campaign_run(name: str, seconds: float, seed: int | None = None) -> tuple[float, int, float, int, list[list[Any]]]:
    """(steady examples/s, examples, seconds, schedule() steps, slices) of
    the campaign worker loop on one target, its first slice left out; each
    steady slice as [examples asked, seed, seconds, examples run, steps]."""
    from fuzz import adapter
    from fuzz.campaign.config import CampaignConfig
    from fuzz.campaign.databases import open_database
    from fuzz.campaign.findings import Findings
    from fuzz.campaign.fuzzer import TargetFuzzer, run_slot, slice_seed
    from fuzz.campaign.progress import Progress

    # Per generate or replay call, in the schedule's order: its schedule()
    # steps, and whether it met a failure (recorded, or a known one swallowed).
    per_slice: list[tuple[int, bool]] = []
    met = [0]  # failures met so far, recorded or swallowed
    originals = {m: getattr(TargetFuzzer, m) for m in ("generate", "replay")}
    known = Findings.known

    def counted(method: Any) -> Any:
        def call(fuzzer: Any, *a: Any, **k: Any) -> Any:
            before, failures, seen = _Work.steps, fuzzer.failures, met[0]
            try:
                return method(fuzzer, *a, **k)
            finally:
                per_slice.append((_Work.steps - before, fuzzer.failures > failures or met[0] > seen))

        return call

    def known_counted(self: Any, target: str, exc: BaseException) -> bool:
        found = known(self, target, exc)
        met[0] += found
        return found

    for m, fn in originals.items():
        setattr(TargetFuzzer, m, counted(fn))
    Findings.known = known_counted  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix="fuzz-bench-") as tmp, _Work.counted():
            config = CampaignConfig(targets=(name,), items=((name, 0),), slots=1, budget=seconds, start=time.time(),
                                    repro_dir=f"{tmp}/repros", stats_dir=tmp, db=(f"{tmp}/db",), seed=seed)
            progress = Progress(tmp, "bench", start=config.start, vllm_version=adapter.VLLM_VERSION)
            findings = Findings(repro_dir=config.repro_dir, start=config.start, campaign_seed=seed, worker="bench",
                                vllm_version=adapter.VLLM_VERSION)
            schedule = run_slot(config, 0, [name], database=open_database(list(config.db)), progress=progress,
                                findings=findings)
    finally:
        for m, fn in originals.items():
            setattr(TargetFuzzer, m, fn)
        Findings.known = known  # type: ignore[method-assign]
    new = [f for f in progress.totals.failures if f.get("known_bug") is None]
    if new:
        raise SystemExit(f"{name}: unmodified vLLM failed during the benchmark: {new[0]['violation']}")
    assert schedule is not None and len(per_slice) == len(schedule.history)
    # A slice that met a documented bug of this release (fuzz/known_bugs.py)
    # shrank it or let it pass: a bare rerun would stop at it instead, so the
    # comparison leaves such slices out, like the first.
    slices = [[turn.examples, slice_seed(seed, 0, turn.index), secs, n, steps]
              for (turn, secs, n, _found), (steps, failed) in zip(schedule.history, per_slice)
              if turn.index > 0 and not failed]
    secs, n = sum(s[2] for s in slices), sum(s[3] for s in slices)
    return (n / secs if secs else 0.0), n, secs, sum(s[4] for s in slices), slices


class _Enough(BaseException):
    """A bare run has run as many examples as it was asked to stop after."""


def _bare_runs(target: Any, runs: list[tuple[int, int | None, int | None]]) -> list[float]:
    """Each ``(examples asked, seed, stop after)`` as a bare Hypothesis run of
    ``target`` (generation phases, no database, no worker loop), stopped
    after ``stop after`` examples when given; [examples, seconds, steps]."""
    from hypothesis import Verbosity

    from fuzz.campaign.fuzzer import GENERATE
    from fuzz.hunting import budget_settings, property_test

    strategy, check, machine = target.load()
    examples = 0
    stop_after: int | None = None

    def wrap(inner: Any) -> Any:
        def each(*a: Any, **k: Any) -> None:
            nonlocal examples
            examples += 1
            inner(*a, **k)
            if examples == stop_after:
                raise _Enough

        return each

    before, t0 = _Work.steps, time.perf_counter()
    with _Work.counted():
        for asked, seed, stop in runs:
            stop_after = None if stop is None else examples + stop
            settings = budget_settings(max_examples=asked, phases=GENERATE, verbosity=Verbosity.quiet)
            with contextlib.suppress(_Enough):
                property_test(settings=settings, strategy=strategy, body=check, machine=machine, seed=seed, wrap=wrap)()
    return [examples, time.perf_counter() - t0, _Work.steps - before]


def _same_examples_run(target: Any, slices: list[list[Any]]) -> dict[str, float]:
    """The campaign's steady slices run again bare: the same Hypothesis runs
    (examples asked, seed, phases), stopped after as many examples as the
    slice ran (a slice stopped by its clock ran a prefix of its run), so the
    same examples, without the worker loop around them. Returns both sides'
    seconds, examples and steps."""
    n, secs, steps = _bare_runs(target, [(asked, seed, ran) for asked, seed, _, ran, _ in slices if ran])
    return {"bare_s": secs, "bare_n": n, "bare_steps": steps,
            "campaign_s": sum(s[2] for s in slices), "campaign_n": sum(s[3] for s in slices),
            "campaign_steps": sum(s[4] for s in slices)}


def _vllm_share(target: Any, examples: int) -> float:
    from fuzz.hunting import hunt

    strategy, check, machine = target.load()
    prof = cProfile.Profile()
    prof.enable()
    try:
        hunt(check, strategy, machine=machine, max_examples=examples, seed=12345)
    finally:
        prof.disable()
    stats = pstats.Stats(prof)
    total = sum(row[2] for row in stats.stats.values())  # tottime
    in_vllm = sum(row[2] for key, row in stats.stats.items() if "/vllm/" in key[0])
    return in_vllm / total if total else 0.0


def _child_draws(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Per seed: ``--examples`` examples as one Hypothesis run, then as runs
    of ``--draws`` examples each (the campaign's slices, without the
    campaign): examples, seconds, schedule() steps of each."""
    from fuzz import adapter
    from fuzz.hunting import hunt
    from fuzz.registry import get_target

    adapter.init_hashing()
    target = get_target(name)
    strategy, check, machine = target.load()
    hunt(check, strategy, machine=machine, max_examples=5, seed=0)  # the first configuration's warm-up
    rows = []
    for seed in range(1, args.repeats + 1):
        whole = _bare_runs(target, [(args.examples, seed, None)])
        sliced = _bare_runs(target, [(args.draws, seed * 1000 + i, None)
                                     for i in range(max(args.examples // args.draws, 1))])
        rows.append({"seed": seed, "whole": whole, "sliced": sliced})
    return {"target": name, "rows": rows}


def _child_target(name: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    from fuzz import adapter, telemetry

    adapter.init_hashing()
    import_s = time.perf_counter() - t0
    from fuzz.hunting import hunt, settle_heap
    from fuzz.registry import get_target

    target = get_target(name)
    t1 = time.perf_counter()
    strategy, check, machine = target.load()
    hunt(check, strategy, machine=machine, max_examples=1, seed=0)
    first_s = time.perf_counter() - t1
    warmup = _raw_run(target, args.examples, seed=999)
    settle_heap()  # as the campaign does once its first round is over
    raw, campaign, same = [], [], []
    for r in range(args.repeats):
        raw.append(_raw_run(target, args.examples, seed=1000 + r))
        *run, slices = _campaign_run(name, args.campaign_seconds, seed=2000 + r)
        campaign.append(run)
        same.append(_same_examples_run(target, slices))
    branches = telemetry.snapshot()["branches"]
    share = _vllm_share(target, max(args.examples // 2, 100))
    return {"target": name, "import_s": import_s, "first_example_s": first_s, "warmup": warmup, "raw": raw,
            "campaign": campaign, "same": same, "vllm_share": share, "branches": branches, "vllm": adapter.VLLM_VERSION}


@contextlib.contextmanager
def _ownership_off() -> Any:
    """The scheduler harness without the ownership model: no wrappers, no
    observation (the ownership checks then return at once)."""
    from fuzz.adapter._ownership import OwnershipSpy

    install, observe = OwnershipSpy._install, OwnershipSpy.observe
    OwnershipSpy._install = lambda self: None  # type: ignore[method-assign]
    OwnershipSpy.observe = lambda self, *a, **k: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        OwnershipSpy._install, OwnershipSpy.observe = install, observe  # type: ignore[method-assign]


def _child_ownership_cost(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Examples/s of ``name`` with the ownership model on and off, and the
    per-step time of its observation and checks."""
    from fuzz import adapter
    from fuzz.adapter._ownership import OwnershipSpy
    from fuzz.hunting import settle_heap
    from fuzz.registry import get_target
    from invariants import ownership

    adapter.init_hashing()
    target = get_target(name)
    _raw_run(target, max(args.examples // 4, 20), seed=999)  # warm-up
    settle_heap()
    on, off = [], []
    for r in range(args.repeats):
        on.append(_raw_run(target, args.examples, seed=1000 + r)[0])
        with _ownership_off():
            off.append(_raw_run(target, args.examples, seed=1000 + r)[0])
    # Per step, with the model on: the observation, and the four checks.
    spent = {"observe": 0.0, "checks": 0.0}
    steps = 0

    def timed(fn: Any, part: str) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                result = fn(*a, **k)
                return list(result) if part == "checks" else result
            finally:
                spent[part] += time.perf_counter() - t0

        return call

    observe = OwnershipSpy.observe
    originals = {c: c.violations for c in ownership.OWNERSHIP_CHECKS}

    def counted_observe(self: Any, *a: Any, **k: Any) -> Any:
        nonlocal steps
        steps += 1
        return timed(observe, "observe")(self, *a, **k)

    OwnershipSpy.observe = counted_observe  # type: ignore[method-assign]
    for c, each in originals.items():
        c.violations = timed(each, "checks")
    try:
        examples = _raw_run(target, args.examples, seed=2000)[1]
    finally:
        OwnershipSpy.observe = observe  # type: ignore[method-assign]
        for c, each in originals.items():
            c.violations = each
    return {"target": name, "on": on, "off": off, "steps": steps, "examples": examples,
            "observe_us": 1e6 * spent["observe"] / max(steps, 1), "checks_us": 1e6 * spent["checks"] / max(steps, 1),
            "vllm": adapter.VLLM_VERSION}


def _report_ownership_cost(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"vLLM {results[0]['vllm'] if results else '?'}; block-ownership model on vs off, raw in-process hunts of "
          f"{args.examples} examples, alternated, medians of {args.repeats}")
    head = f"{'target':<22} {'on ex/s':>8} {'off ex/s':>9} {'on/off':>7} {'steps/ex':>9} {'observe us/step':>16} {'checks us/step':>15}"
    print(head)
    print("-" * len(head))
    for r in results:
        on, off = _median(r["on"]), _median(r["off"])
        print(f"{r['target']:<22} {on:8.1f} {off:9.1f} {on / off if off else 0:7.2f} "
              f"{r['steps'] / max(r['examples'], 1):9.1f} {r['observe_us']:16.1f} {r['checks_us']:15.1f}")


def _child_planted(args: argparse.Namespace) -> dict[str, Any]:
    from fuzz import adapter
    from fuzz.hunting import hunt
    from fuzz.registry import get_target

    adapter.init_hashing()
    from strategies.scenarios import truncation_scenarios
    from strategies.specs import kv_cache_layouts

    hybrid_strategy, check, _ = get_target("truncate-hybrid").load()
    with_scratch = truncation_scenarios(
        layouts=kv_cache_layouts(min_groups=3, max_groups=4, required=("FullAttentionSpec", "MambaSpec", "CircularBufferSpec"))
    )
    out: dict[str, Any] = {}
    for bug in adapter.PLANTED_TRUNCATE_BUGS:
        strategy = with_scratch if bug == "scratch_gets_null" else hybrid_strategy
        with adapter.planted_truncate_bug(bug):
            out[f"truncate: {bug}"] = [_found_after(hunt(check, strategy, max_examples=args.find_budget, seed=s))
                                       for s in range(args.seeds)]
    sched_strategy, sched_check, _ = get_target("scheduler-single-shot").load()
    with adapter.planted_scheduler_bug("pre_fix_assert_all"):
        out["scheduler: pre_fix_assert_all"] = [
            _found_after(hunt(sched_check, sched_strategy, max_examples=args.find_budget, seed=s))
            for s in range(args.seeds)]
    return out


def _found_after(res: Any) -> list[float] | None:
    return [res.seconds, res.examples] if res.found else None


# -- in the parent ---------------------------------------------------------------
def _child(argv: list[str]) -> dict[str, Any]:
    from fuzz.matrix.envs import cache_env

    env = {**cache_env(), **os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.run([sys.executable, "-m", "fuzz.bench", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"benchmark child {argv} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("BENCH "):])


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _steps_per_example(runs: list[list[Any]]) -> float:
    return sum(r[3] for r in runs) / max(sum(r[1] for r in runs), 1)


def _fmt_times(found: list[list[float] | None]) -> str:
    hits = [f[0] for f in found if f]
    if not hits:
        return "not found"
    misses = len(found) - len(hits)
    return (f"median {statistics.median(hits):6.2f} s  (min {min(hits):.2f}, max {max(hits):.2f})"
            + (f"  missed by {misses} seed(s)" if misses else ""))


def _report_draws(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"{args.examples} examples as one Hypothesis run vs as runs of {args.draws} (generate, target and shrink "
          f"phases, no database), per seed")
    head = f"{'target':<27} {'seed':>4}  {'run':<10} {'ex/s':>7} {'steps/s':>8} {'steps/ex':>8}"
    print(head)
    print("-" * len(head))
    for r in results:
        spans: dict[str, list[tuple[float, float]]] = {"whole": [], "sliced": []}
        for row in r["rows"]:
            for kind in ("whole", "sliced"):
                n, secs, steps = row[kind]
                spans[kind].append((n / secs, steps / secs))
                print(f"{r['target']:<27} {row['seed']:4}  {kind:<10} {n / secs:7.1f} {steps / secs:8.0f} "
                      f"{steps / max(n, 1):8.1f}")
        for kind, rates in spans.items():
            ex, st = [a for a, _ in rates], [b for _, b in rates]
            print(f"{r['target']:<27} {'all':>4}  {kind:<10} median {statistics.median(ex):.1f} ex/s "
                  f"(max/min {max(ex) / min(ex):.2f}), {statistics.median(st):.0f} steps/s "
                  f"(max/min {max(st) / min(st):.2f})")


def _report(results: list[dict[str, Any]], planted: dict[str, Any] | None, args: argparse.Namespace) -> None:
    print(f"vLLM {results[0]['vllm'] if results else '?'}; each target in a fresh process; "
          f"raw = in-process hunt of {args.examples} examples, campaign = the worker loop for "
          f"{args.campaign_seconds:g} s (first slice left out); medians of {args.repeats}")
    print("(2-core shared machine: compare ratios within one run, not absolute numbers)\n")
    head = (f"{'target':<27} {'raw ex/s':>8} {'campaign ex/s':>13} {'ratio':>5}  {'steps/ex raw, campaign':>22}  "
            f"{'same examples bare, campaign ex/s':>33} {'campaign/raw':>12}  {'vLLM':>4}  "
            f"warm-up (1st run ex/s; import, 1st example s)")
    print(head)
    print("-" * len(head))
    for r in results:
        raw, camp = _median([x[0] for x in r["raw"]]), _median([x[0] for x in r["campaign"]])
        per_ex = (f"{_steps_per_example(r['raw']):10.1f}, {_steps_per_example(r['campaign']):10.1f}"
                  if any(x[3] for x in r["raw"]) else f"{'-':>22}")
        bare = _median([m["bare_n"] / m["bare_s"] for m in r["same"] if m["bare_s"]])
        inside = _median([m["campaign_n"] / m["campaign_s"] for m in r["same"] if m["campaign_s"]])
        diverged = sum(m["bare_n"] != m["campaign_n"] or m["bare_steps"] != m["campaign_steps"] for m in r["same"])
        print(f"{r['target']:<27} {raw:8.1f} {camp:13.1f} {camp / raw if raw else 0:5.2f}  {per_ex}  "
              f"{bare:16.1f}, {inside:15.1f} {inside / bare if bare else 0:12.2f}"
              f"{'*' if diverged else ' '} {100 * r['vllm_share']:4.0f}%  "
              f"{r['warmup'][0]:.1f}; {r['import_s']:.1f}, {r['first_example_s']:.2f}")
    print("raw = one Hypothesis run of the target; ratio = campaign / raw examples per second, which also compares the\n"
          "examples each drew (scheduler examples range from one schedule() step to hundreds; steps/ex). campaign/raw\n"
          "compares the same examples: the campaign's steady slices run again bare (same examples asked, seed\n"
          "and phases, stopped where the slice stopped) and inside the worker loop; * = the two did not run the same examples\n"
          "and steps in some repeat (docs/campaign-profile.md)")
    print()
    for r in results:
        b = r["branches"]
        if r["target"].startswith("truncate-"):
            rejected = sum(v for k, v in b.items() if k.startswith("layout rejected by vLLM"))
            drawn = rejected + sum(v for k, v in b.items() if k.startswith("lookup="))
            print(f"{r['target']}: layouts vLLM rejected: {rejected} of {drawn} drawn")
        n = b.get("scheduler: examples")
        if r["target"] == "scheduler-single-shot" and n:
            print(f"{r['target']}: truncation branch reached by "
                  f"{100 * b.get('scheduler: truncation branch', 0) / n:.0f}% of examples, "
                  f"divergent-hit fallback by {100 * b.get('scheduler: divergent-hit fallback', 0) / n:.0f}%")
    if planted:
        print(f"\nseconds to find each planted bug (median of {args.seeds} seeds, budget {args.find_budget} examples):")
        for bug, found in planted.items():
            print(f"  {bug:<34} {_fmt_times(found)}")


def main(argv: list[str] | None = None) -> int:
    from fuzz.registry import TARGETS

    parser = argparse.ArgumentParser(prog="python -m fuzz.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="*", default=list(TARGETS), help="targets to measure (default: all)")
    parser.add_argument("--examples", type=int, default=400, help="examples per raw run")
    parser.add_argument("--repeats", type=int, default=3, help="raw and campaign runs per target (median reported)")
    parser.add_argument("--campaign-seconds", type=float, default=10.0, help="seconds per campaign run")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per planted bug (median reported)")
    parser.add_argument("--find-budget", type=int, default=3000, help="max examples when hunting a planted bug")
    parser.add_argument("--no-planted", action="store_true", help="skip the planted-bug hunts")
    parser.add_argument("--breakdown", type=float, default=None, metavar="SECONDS",
                        help="instead: where a worker's time goes, each target's worker loop run this long")
    parser.add_argument("--ownership-cost", action="store_true",
                        help="instead: the block-ownership model's cost on each scheduler target (on vs off)")
    parser.add_argument("--model-cost", action="store_true",
                        help="instead: each reference model's and check module's us per step on each scheduler target")
    parser.add_argument("--draws", type=int, default=None, metavar="N",
                        help="instead: each scheduler target's examples/s and steps/s as one run of --examples "
                             "examples vs runs of N (what a short run draws), one row per seed (--repeats seeds)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        parser.error(f"--targets {unknown[0]}: unknown target; known: {', '.join(TARGETS)}")
    if args.child is not None:  # one measurement in this fresh process
        if args.child == ":planted":
            result = _child_planted(args)
        elif args.breakdown:
            result = child_breakdown(args.child, args.breakdown, _campaign_run)
        elif args.ownership_cost:
            result = _child_ownership_cost(args.child, args)
        elif args.model_cost:
            result = child_model_cost(args.child, args.examples, args.repeats, _raw_run)
        elif args.draws:
            result = _child_draws(args.child, args)
        else:
            result = _child_target(args.child, args)
        print("BENCH " + json.dumps(result))
        return 0
    if args.breakdown:
        results = [_child(["--child", name, "--breakdown", str(args.breakdown)]) for name in args.targets]
        report_breakdown(results)
        return 0
    if args.draws:
        names = [t for t in args.targets if t.startswith("scheduler-")]
        results = [_child(["--child", n, "--draws", str(args.draws), "--examples", str(args.examples), "--repeats",
                           str(args.repeats)]) for n in names]
        _report_draws(results, args)
        if args.json:
            args.json.write_text(json.dumps({"draws": results}, indent=1))
        return 0
    if args.model_cost:
        names = [t for t in args.targets if t.startswith("scheduler-")]
        results = [_child(["--child", n, "--model-cost", "--examples", str(args.examples), "--repeats",
                           str(args.repeats)]) for n in names]
        report_model_cost(results, args.examples, args.repeats)
        if args.json:
            args.json.write_text(json.dumps({"model_cost": results}, indent=1))
        return 0
    if args.ownership_cost:
        names = [t for t in args.targets if t.startswith("scheduler-")]
        results = [_child(["--child", n, "--ownership-cost", "--examples", str(args.examples), "--repeats",
                           str(args.repeats)]) for n in names]
        _report_ownership_cost(results, args)
        if args.json:
            args.json.write_text(json.dumps({"ownership_cost": results}, indent=1))
        return 0
    common = ["--examples", str(args.examples), "--repeats", str(args.repeats), "--campaign-seconds",
              str(args.campaign_seconds), "--seeds", str(args.seeds), "--find-budget", str(args.find_budget)]
    results = []
    for name in args.targets:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        results.append(_child(["--child", name, *common]))
    planted = None
    if not args.no_planted:
        print("[bench] planted bugs ...", file=sys.stderr, flush=True)
        planted = _child(["--child", ":planted", *common])
    _report(results, planted, args)
    if args.json:
        args.json.write_text(json.dumps({"targets": results, "planted": planted}, indent=1))
    return 0

