"""The fuzz targets ``python -m fuzz`` knows, by name.

Each target names (lazily, so listing is instant) a strategy factory and a
check function, or a Hypothesis state machine, and the pytest test that runs
the same objects with its pinned examples (``test``: what ``python -m fuzz
matrix`` runs on each release). A target's name is its only identity: the
campaign, the matrix and the bench all take these names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["TARGETS", "Target", "default_targets", "get_target"]

# Capability names (fuzz.adapter._compat.CAPABILITIES), spelled out here so
# listing targets never imports vLLM.
TRUNCATION_TIER = ("truncate", "connector-lookup", "per-group-lookup")
SCHEDULER_TIER = ("truncate", "local-prefix-hit")
# Scheduler targets write their repro from the run's operation log.
SCHEDULER_REPRO = "fuzz.upstream:scheduler_repro_of_failure"
TRUNCATION_REPRO = "fuzz.upstream:truncation_repro_of_failure"
# The reach labels (fuzz.model.ENGINE_REACHABLE / SCHEDULER_API), spelled out
# here so listing targets never imports the suite's model.
_API = "scheduler-API"
_API_WHY = (
    "layouts drawn directly (strategies/scheduler.py, as vLLM's unit tests build schedulers); "
    "no engine path is known to build every one"
)


@dataclass(frozen=True)
class Target:
    name: str
    summary: str
    module: str
    test: str  # the pytest function (or state machine TestCase) in ``module``
    strategy: str | None = None  # zero-argument factory returning the strategy
    check: str | None = None  # function(example) raising on a violation
    machine: str | None = None  # RuleBasedStateMachine class (stateful targets)
    # "module:function" writing a failure's repro: function(failure, invariant,
    # sidecar=name) -> (its place in vLLM's tests tree, its source) or None.
    repro: str | None = None
    default: bool = True
    # The vLLM capabilities it cannot run without (fuzz.adapter.CAPABILITIES),
    # checked before fuzzing: a target this vLLM cannot host is skipped.
    needs: tuple[str, ...] = ()
    # Scheduler tier: can a real engine hand the scheduler the configurations
    # this target draws? "engine-reachable" (vLLM's planning code built them
    # from a model config) or "scheduler-API" (built directly, as vLLM's unit
    # tests do), and why; every finding's sidecar carries both.
    reach: str | None = None
    reach_reason: str = ""

    @property
    def nodeid(self) -> str:
        """The pytest node id, relative to the repository root."""
        return f"{self.module.replace('.', '/')}.py::{self.test}"

    def load(self) -> tuple[Any, Callable[[Any], None] | None, type | None]:
        mod = importlib.import_module(self.module)
        strategy = getattr(mod, self.strategy)() if self.strategy else None
        check = getattr(mod, self.check) if self.check else None
        machine = getattr(mod, self.machine) if self.machine else None
        return strategy, check, machine

    def repro_writer(self) -> Callable[..., tuple[str, str] | None] | None:
        if not self.repro:
            return None
        module, func = self.repro.split(":")
        return getattr(importlib.import_module(module), func)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        Target(
            "truncate-hybrid",
            "truncate_computed_blocks on real lookups: full attention + Mamba (+ up to 2 groups)",
            "fuzz.targets.target_truncate",
            "fuzz_truncate_hybrid",
            strategy="hybrid_scenarios",
            check="check_truncation_scenario",
            repro=TRUNCATION_REPRO,
            needs=TRUNCATION_TIER,
        ),
        Target(
            "truncate-any-layout",
            "truncate_computed_blocks on real lookups: any 1-4 group layout of every drawable spec",
            "fuzz.targets.target_truncate",
            "fuzz_truncate_any_layout",
            strategy="any_layout_scenarios",
            check="check_truncation_scenario",
            repro=TRUNCATION_REPRO,
            needs=TRUNCATION_TIER,
        ),
        Target(
            "scheduler-single-shot",
            "Scheduler.schedule() with a scripted KV connector: fill, diverge under real pressure, replay (FA + Mamba)",
            "fuzz.targets.target_scheduler",
            "fuzz_scheduler_single_shot",
            strategy="single_shot_strategy",
            check="check_single_shot",
            repro=SCHEDULER_REPRO,
            needs=SCHEDULER_TIER,
            reach=_API,
            reach_reason=_API_WHY,
        ),
        Target(
            "scheduler-any-layout",
            "Scheduler.schedule() single-shot over FA + Mamba + other groups and any 1-4 group layout, over-reports too",
            "fuzz.targets.target_scheduler",
            "fuzz_scheduler_single_shot_any_layout",
            strategy="any_layout_strategy",
            check="check_single_shot",
            repro=SCHEDULER_REPRO,
            needs=SCHEDULER_TIER,
            reach=_API,
            reach_reason=_API_WHY,
        ),
        Target(
            "scheduler-engine-reachable",
            "Scheduler.schedule() single-shot over KV-cache configs vLLM's engine planning builds from real "
            "architectures (NemotronH, Jamba, Qwen3-Next, Granite-4.0-H, Falcon-H1, Gemma-3, GPT-OSS)",
            "fuzz.targets.target_scheduler",
            "fuzz_scheduler_engine_reachable",
            strategy="engine_reachable_strategy",
            check="check_single_shot",
            repro=SCHEDULER_REPRO,
            needs=(*SCHEDULER_TIER, "engine-planning"),
            reach="engine-reachable",
            reach_reason=(
                "KV-cache config planned by vLLM's own engine code (verify_and_update_config hooks, "
                "hybrid block-size alignment, get_kv_cache_configs, the block-size resolver) from a model config.json"
            ),
        ),
        Target(
            "scheduler-machine",
            "Scheduler state machine: shared prefixes, steps, finish/abort, failed async loads, invariants every step",
            "fuzz.targets.target_scheduler",
            "TestSchedulerMachine",
            machine="SchedulerMachine",
            repro=SCHEDULER_REPRO,
            needs=SCHEDULER_TIER,
            reach=_API,
            reach_reason=_API_WHY,
        ),
    ]
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise KeyError(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None


def default_targets() -> list[Target]:
    return [t for t in TARGETS.values() if t.default]
