"""``python -m fuzz.bench --breakdown SECONDS``: where a campaign worker's
time goes, per Hypothesis phase and part (the target itself, the pareto
front, garbage collection, progress files, database checks, slice set-up);
see docs/campaign-profile.md."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["child_breakdown", "report_breakdown"]


class _Clock:
    """Exclusive wall time per (phase, part), by wrapping functions: time
    inside a wrapped call goes to its label until a nested wrapped call (or
    a garbage collection) takes over."""

    PHASES = ("replay", "generate", "target", "shrink")

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[tuple[str, str]] = [("outside Hypothesis", "worker loop")]
        self._last = time.perf_counter()

    def _switch(self) -> None:
        now = time.perf_counter()
        top = self._stack[-1]
        self.seconds[top] = self.seconds.get(top, 0.0) + now - self._last
        self._last = now

    def _phase(self) -> str:
        return next((p for p, part in reversed(self._stack) if part == "Hypothesis"), "outside Hypothesis")

    def wrap(self, owner: Any, name: str, part: str, *, phase: str | None = None) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._switch()
            label = (phase, "Hypothesis") if phase else (self._phase(), part)
            if part == "target code":
                self.calls[label[0]] = self.calls.get(label[0], 0) + 1
            self._stack.append(label)
            try:
                return original(*args, **kwargs)
            finally:
                self._switch()
                self._stack.pop()

        setattr(owner, name, timed)

    def gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        self._switch()
        if phase == "start":
            self._stack.append(("any", "garbage collection"))
        elif self._stack[-1] == ("any", "garbage collection"):
            self._stack.pop()


def child_breakdown(name: str, seconds: float, campaign_run: Callable[..., Any]) -> dict[str, Any]:
    """Where one worker's time goes, fuzzing ``name`` alone for ``seconds``
    in the campaign's worker loop (``campaign_run``: fuzz.bench's)."""
    import gc
    import importlib
    import inspect

    from hypothesis.internal.conjecture import engine, pareto

    from fuzz import adapter
    from fuzz.campaign import databases, fuzzer, progress
    from fuzz.registry import get_target

    adapter.init_hashing()
    clock = _Clock()
    runner = engine.ConjectureRunner
    for method, phase in (("reuse_existing_test_cases", "replay"), ("generate_new_test_cases", "generate"),
                          ("optimise_targets", "target"), ("shrink_interesting_test_cases", "shrink")):
        clock.wrap(runner, method, "", phase=phase)
    clock.wrap(pareto.ParetoFront, "add", "pareto front")
    target = get_target(name)
    module = importlib.import_module(target.module)
    if target.check:
        clock.wrap(module, target.check, "target code")
    else:  # a state machine: its rules must stay rules, so time the harness they drive
        harness = adapter.SchedulerHarness
        for attr in [a for a, v in vars(harness).items() if inspect.isfunction(v) and not a.startswith("_")]:
            clock.wrap(harness, attr, "target code")
    clock.wrap(progress.Progress, "flush", "progress files + telemetry")
    clock.wrap(fuzzer.TargetFuzzer, "has_new_entries", "database checks")
    clock.wrap(databases, "check_database", "database checks")
    clock.wrap(fuzzer, "property_test", "slice set-up")
    gc.callbacks.append(clock.gc_callback)
    t0 = time.perf_counter()
    rate, examples, *_ = campaign_run(name, seconds)
    clock._switch()
    gc.callbacks.remove(clock.gc_callback)
    wall = time.perf_counter() - t0
    rows = sorted(clock.seconds.items(), key=lambda kv: -kv[1])
    return {"target": name, "wall": wall, "examples": examples, "calls": clock.calls,
            "rows": [[phase, part, secs] for (phase, part), secs in rows if secs >= 0.005]}


def report_breakdown(results: list[dict[str, Any]]) -> None:
    for r in results:
        print(f"\n{r['target']}: {r['wall']:.1f} s, {r['examples']} examples after the first slice "
              f"(target code called {r['calls']})")
        print(f"  {'phase':<20} {'part':<28} {'seconds':>8} {'share':>6}")
        for phase, part, secs in r["rows"]:
            print(f"  {phase:<20} {part or 'Hypothesis itself':<28} {secs:8.2f} {100 * secs / r['wall']:5.1f}%")
