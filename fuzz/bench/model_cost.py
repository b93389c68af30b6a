"""``python -m fuzz.bench --model-cost``: what each reference model the
scheduler harness keeps beside vLLM costs per ``schedule()`` step, and what
each invariant module's checks cost, on each scheduler target.

The models, each timed by wrapping the functions its callers look up (the
class attribute of a method, the module global of a function imported by
name), restored after the run:

- **contents**: the block-contents model (``ScriptedRunner`` and
  ``BlockContents``): the tables, copies and loads handed over
  (``hand_over``), the KV each step writes (``_write_contents``, the copies
  settled, the drafter's lookahead), the reads it judges (``_reads``), the
  index against it (``index_entries``: index-written and
  index-names-its-prefix), ``foreign_hits``, ``kv_from_other_tokens`` and
  the async loads landing;
- **hit-length**: the index read at each lookup (``index_hold``, called
  inside ``schedule()``);
- **kv-events**: the KV-event replay (``EventLog.publish``, called inside
  ``update_from_output()``, and ``Observer.event_gaps``);
- **preemption**: the preemption record (``Observer.preemptions``);
- **ownership**: the block-ownership observation (``OwnershipSpy.new_step``
  and ``observe``; its recording wrappers on the block pool and managers
  run inside vLLM's calls and are not separated from them);
- **cache-model**: the harness's own model of the prefix cache
  (``CacheModel``: what each ``schedule()`` files and each lookup is
  guaranteed, inside ``schedule()``, and ``take``, the index against it).

The checks: every function of ``invariants.scheduler.STEP_CHECKS`` and
``ADMISSION_CHECKS``, grouped by the module that defines it. They run
through :func:`invariants.scheduler.step_violations`, which picks them by
identity from those tuples, so the tuples are swapped for the timed
functions and the runner's selection is mapped to them; a check that
reports every violation it finds (``.violations``) is timed through that.

A step's time is the harness's ``step()`` (vLLM, the spies, the models)
plus ``step_violations`` (every check); each model's share is of that sum.
The vLLM column is the harness's own clock on ``schedule()`` and
``update_from_output()`` less the two models timed inside them.

The wrappers cost time themselves: examples/s and steps per example come
from separate runs without them (same seeds), alternated with the timed
runs; the report gives each wrapper call's cost, the calls per step, and
the timed runs' rate against the plain ones.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["MODELS", "child_model_cost", "report_model_cost", "summary"]

# The models' columns, in the report's order.
MODELS = ("contents", "hit-length", "kv-events", "preemption", "ownership", "cache-model")
# Check modules in the report's order (invariants.<name>).
CHECK_MODULES = ("scheduler", "connector", "ownership", "promises", "contents", "hits", "cache")
# Timed inside vLLM's clock (schedule() / update_from_output()).
_INSIDE_VLLM = (("hit-length", "index_hold"), ("kv-events", "publish"), ("cache-model", "_scheduled"),
                ("cache-model", "_reach"))


def _model_sites() -> dict[str, list[tuple[Any, str]]]:
    """Per model, the (owner, attribute) pairs its callers look up."""
    from fuzz.adapter import _observe
    from fuzz.adapter._cache_model import CacheModel
    from fuzz.adapter._contents import BlockContents
    from fuzz.adapter._events import EventLog
    from fuzz.adapter._observations import Observer
    from fuzz.adapter._ownership import OwnershipSpy
    from fuzz.adapter._runner import ScriptedRunner

    return {
        "contents": [(ScriptedRunner, "hand_over"), (ScriptedRunner, "_write_contents"),
                     (ScriptedRunner, "_check_lookahead"), (BlockContents, "settle_copies"),
                     (ScriptedRunner, "_reads"), (ScriptedRunner, "index_entries"),
                     (ScriptedRunner, "foreign_hits"), (ScriptedRunner, "kv_from_other_tokens"),
                     (BlockContents, "land_async_load")],
        "hit-length": [(_observe, "index_hold")],
        "kv-events": [(EventLog, "publish"), (Observer, "event_gaps")],
        "preemption": [(Observer, "preemptions")],
        "ownership": [(OwnershipSpy, "new_step"), (OwnershipSpy, "observe")],
        "cache-model": [(CacheModel, "_scheduled"), (CacheModel, "_reach"), (CacheModel, "take")],
    }


class _Timer:
    """Seconds and calls per (label, site). A call made while the same
    label's wrapper is running is counted in the outer call only."""

    def __init__(self) -> None:
        self.seconds: Counter[tuple[str, str]] = Counter()
        self.calls: Counter[tuple[str, str]] = Counter()
        self._active: set[str] = set()

    def wrap(self, label: str, site: str, fn: Callable[..., Any], consume: bool = False) -> Callable[..., Any]:
        key = (label, site)
        active, seconds, calls, clock = self._active, self.seconds, self.calls, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            if label in active:
                return fn(*args, **kwargs)
            active.add(label)
            t0 = clock()
            try:
                result = fn(*args, **kwargs)
                return list(result) if consume else result
            finally:
                seconds[key] += clock() - t0
                calls[key] += 1
                active.discard(label)

        return timed


@contextlib.contextmanager
def _patched(pairs: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each ``(owner, name, value)`` set for the block; the originals back after."""
    saved = [(owner, name, vars(owner)[name]) for owner, name, _ in pairs]
    try:
        for owner, name, value in pairs:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _timed_checks(timer: _Timer) -> list[tuple[Any, str, Any]]:
    """The patches that time every step and admission check, per module, and
    ``step_violations`` as a whole (label ``checks``)."""
    import invariants.scheduler as sched
    from fuzz.runners import scheduler as runner

    swapped: dict[Any, Any] = {}
    for check in (*sched.STEP_CHECKS, *sched.ADMISSION_CHECKS):
        group = check.__module__.removeprefix("invariants.")
        each = getattr(check, "violations", None)
        timed = timer.wrap("check:" + group, check.__name__, check)
        if each is not None:  # step_violations calls it through .violations
            timed.violations = timer.wrap("check:" + group, check.__name__, each, consume=True)  # type: ignore[attr-defined]
        swapped[check] = timed
    step_violations = sched.step_violations

    def mapped(step: Any, checks: Any = None) -> Any:
        return step_violations(step, None if checks is None else tuple(swapped.get(c, c) for c in checks))

    def swap(name: str) -> tuple[Any, str, Any]:
        return (sched, name, tuple(swapped[c] for c in getattr(sched, name)))

    return [swap("STEP_CHECKS"), swap("ADMISSION_CHECKS"), swap("CONTENTS_CHECKS"),
            (runner, "step_violations", timer.wrap("checks", "step_violations", mapped))]


def _timed_run(target: Any, examples: int, seed: int, raw_run: Callable[..., Any]) -> dict[str, Any]:
    """One run of ``target`` with every model, every check and the harness's
    step timed: seconds per label and site, calls, steps, vLLM's seconds."""
    from fuzz.adapter import SchedulerHarness

    timer = _Timer()
    pairs = [(owner, name, timer.wrap(model, name, vars(owner)[name]))
             for model, sites in _model_sites().items() for owner, name in sites]
    pairs += _timed_checks(timer)
    step = vars(SchedulerHarness)["step"]
    counts = {"steps": 0, "vllm": 0.0}

    def harness_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = self.vllm_seconds
        counts["steps"] += 1
        try:
            return step(self, *args, **kwargs)
        finally:
            counts["vllm"] += self.vllm_seconds - before

    pairs.append((SchedulerHarness, "step", timer.wrap("harness", "step", harness_step)))
    with _patched(pairs):
        rate, n, secs, _ = raw_run(target, examples, seed=seed)
    return {"ex_per_s": rate, "examples": n, "steps": counts["steps"], "vllm_s": counts["vllm"],
            "seconds": [[label, site, s] for (label, site), s in timer.seconds.items()],
            "calls": [[label, site, c] for (label, site), c in timer.calls.items()]}


def _wrapper_cost() -> float:
    """Seconds one timed call adds (a wrapped no-op, best of 5 x 20,000)."""
    timer = _Timer()
    timed = timer.wrap("x", "x", lambda: None)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20_000):
            timed()
        t1 = time.perf_counter()
        for _ in range(20_000):
            pass
        best = min(best, ((t1 - t0) - (time.perf_counter() - t1)) / 20_000)
    return max(best, 0.0)


def child_model_cost(name: str, examples: int, repeats: int, raw_run: Callable[..., Any]) -> dict[str, Any]:
    """``repeats`` plain runs of ``name`` (examples/s, steps) alternated with
    as many timed ones on the same seeds (``raw_run``: fuzz.bench's)."""
    from fuzz import adapter
    from fuzz.hunting import settle_heap
    from fuzz.registry import get_target

    adapter.init_hashing()
    target = get_target(name)
    raw_run(target, max(examples // 4, 5), seed=999)  # warm-up
    settle_heap()  # as the campaign does once its first round is over
    plain, timed = [], []
    for r in range(repeats):
        plain.append(list(raw_run(target, examples, seed=1000 + r)))
        timed.append(_timed_run(target, examples, 1000 + r, raw_run))
    return {"target": name, "plain": plain, "timed": timed, "wrapper_s": _wrapper_cost(),
            "vllm": adapter.VLLM_VERSION}


def _per_step(run: dict[str, Any]) -> dict[str, float]:
    """Microseconds per step of one timed run: each model, each check
    module, the checks, the harness, vLLM (less the models inside it), the
    step (harness + checks); and the wrapped calls per step."""
    steps = max(run["steps"], 1)
    us: Counter[str] = Counter()
    for label, _, s in run["seconds"]:
        us[label] += 1e6 * s / steps
    inside = sum(s for label, site, s in run["seconds"] if (label, site) in _INSIDE_VLLM)
    out = {label: us[label] for label in (*MODELS, "checks", "harness")}
    out.update({"check:" + m: us["check:" + m] for m in CHECK_MODULES})
    out["vllm"] = 1e6 * (run["vllm_s"] - inside) / steps
    out["step"] = us["harness"] + us["checks"]
    out["calls"] = sum(c for _, _, c in run["calls"]) / steps
    return out


def summary(result: dict[str, Any]) -> dict[str, float]:
    """One target's medians: examples/s and steps/example of the plain runs,
    each per-step figure of the timed runs, the timed runs' rate over the
    plain ones', the wrapper's cost per call (us)."""
    plain = result["plain"]
    per = [_per_step(run) for run in result["timed"] if run["steps"]]
    out = {key: statistics.median(p[key] for p in per) for key in (per[0] if per else {})}
    out["ex_per_s"] = statistics.median(p[0] for p in plain)
    out["steps_per_ex"] = statistics.median(p[3] / max(p[1], 1) for p in plain)
    out["timed_over_plain"] = statistics.median(t["ex_per_s"] / p[0] for t, p in zip(result["timed"], plain) if p[0])
    out["wrapper_us"] = 1e6 * result["wrapper_s"]
    # The timed runs ran other steps than the plain ones on the same seeds (they should not).
    out["diverged"] = float(any(t["steps"] != p[3] for t, p in zip(result["timed"], plain)))
    return out


def _site_medians(result: dict[str, Any]) -> list[tuple[str, float]]:
    """Each model's call sites (``model: function``), us per step, median
    over the timed runs, largest first."""
    per: dict[str, list[float]] = {}
    for run in result["timed"]:
        for label, site, s in run["seconds"]:
            if label in MODELS and run["steps"]:
                per.setdefault(f"{label}: {site}", []).append(1e6 * s / run["steps"])
    return sorted(((site, statistics.median(v)) for site, v in per.items()), key=lambda kv: -kv[1])


def _cell(us: float, step: float) -> str:
    return f"{us:.1f} ({100 * us / step if step else 0:.0f}%)"


def report_model_cost(results: list[dict[str, Any]], examples: int, repeats: int) -> None:
    rows = [(r["target"], summary(r)) for r in results]
    print(f"vLLM {results[0]['vllm'] if results else '?'}; each scheduler target in a fresh process; in-process hunts "
          f"of {examples} examples, medians of {repeats}")
    print("ex/s, steps/ex: runs without timers; us per schedule() step: timed runs on the same seeds, alternated; "
          "(share of the step: harness step + checks)\n")
    head = (f"{'target':<27} {'ex/s':>6} {'steps/ex':>8} {'step us':>8} {'vLLM us':>13} "
            + " ".join(f"{m:>14}" for m in MODELS))
    print(head)
    print("-" * len(head))
    for name, s in rows:
        print(f"{name:<27} {s.get('ex_per_s', 0):6.1f} {s.get('steps_per_ex', 0):8.1f} {s.get('step', 0):8.1f} "
              f"{_cell(s.get('vllm', 0), s.get('step', 0)):>13} "
              + " ".join(f"{_cell(s.get(m, 0), s.get('step', 0)):>14}" for m in MODELS))
    print("\nchecks, us per step by invariant module (share of the step)")
    head = f"{'target':<27} {'all checks':>13} " + " ".join(f"{m:>13}" for m in CHECK_MODULES)
    print(head)
    print("-" * len(head))
    for name, s in rows:
        step = s.get("step", 0)
        print(f"{name:<27} {_cell(s.get('checks', 0), step):>13} "
              + " ".join(f"{_cell(s.get('check:' + m, 0), step):>13}" for m in CHECK_MODULES))
    print("\neach model's call sites, us per step (medians)")
    for r in results:
        sites = _site_medians(r)
        print(f"  {r['target']:<27} " + ", ".join(f"{site} {us:.1f}" for site, us in sites if us >= 0.5))
    print("\ntimers: us per timed call, timed calls per step, timed/plain ex/s")
    for name, s in rows:
        print(f"  {name:<27} {s.get('wrapper_us', 0):.2f} us x {s.get('calls', 0):.0f} calls = "
              f"~{s.get('wrapper_us', 0) * s.get('calls', 0):.0f} us per step; {s.get('timed_over_plain', 0):.2f}"
              + (" (* timed and plain runs stepped differently)" if s.get("diverged") else ""))
