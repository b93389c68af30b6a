"""The one adapter between this suite and vLLM's internal API.

Every vLLM constructor call and every version difference lives in this
package; strategies and invariants never import it, and speak in
:mod:`fuzz.model` dataclasses. One module per job:

* ``_env``: the environment vLLM needs here, its version, its hash seed;
* ``_compat``: every difference between supported releases (0.28-0.33);
* ``_specs``: spec classes and layouts (discovery, construction, resolver);
* ``_manager``: a real ``KVCacheManager`` driven by a truncation scenario;
* ``_config``: model, scheduler and cache configs, built as the engine does;
* ``_engine_plan``: a model's config.json + cache flags planned into the
  scheduler's KV-cache config by vLLM's own planning code;
* ``_build``: the one ``Scheduler(...)`` construction, from either plan;
* ``_connector``: the scripted KV connector vLLM loads by module path;
* ``_observe``: recording wrappers on a live scheduler, vLLM frames;
* ``_scheduler``: a real ``Scheduler`` driven a step at a time, composing:
  ``_runner`` (the model runner imitated: samples, drafts, the
  ``ModelRunnerOutput``; with ``_reports`` and ``_contents``, what the worker
  knows and what each block holds), ``_faults`` (failing loads, aborts
  during a step) and ``_observations`` (each step's observations);
* ``_oplog``: its operation log read from vLLM's objects, and replayed;
* ``_planted``: deliberately wrong vLLM code for the self-tests.
"""

import dataclasses as _dataclasses

from fuzz.adapter._compat import CAPABILITIES, declared_defaults, eagle_manager_kwargs, missing_capabilities
from fuzz.adapter._env import VLLM_VERSION, init_hashing
from fuzz.adapter._manager import Lookup, ManagerHarness
from fuzz.adapter._planted import (
    FIXED_RUNS,
    PLANTED_OWNERSHIP_BUGS,
    PLANTED_SCHEDULER_BUGS,
    PLANTED_TRUNCATE_BUGS,
    SIBLING_PLANTS,
    SPECULATING,
    planted_scheduler_bug,
    planted_truncate_bug,
)
from fuzz.adapter._oplog import replay_oplog
from fuzz.adapter._scheduler import SchedulerHarness
from fuzz.model import installed as _installed
from fuzz.model import register_installed as _register_installed
from fuzz.adapter._specs import (
    InvalidLayout,
    SpecFacts,
    build_spec,
    qualified_name,
    resolve_block_sizes,
    spec_base_class,
    spec_class_by_name,
    spec_classes,
    spec_constructor,
    spec_facts,
    temporary_spec_subclass,
)

__all__ = [
    "CAPABILITIES",
    "FIXED_RUNS",
    "PLANTED_OWNERSHIP_BUGS",
    "PLANTED_SCHEDULER_BUGS",
    "PLANTED_TRUNCATE_BUGS",
    "SIBLING_PLANTS",
    "SPECULATING",
    "VLLM_VERSION",
    "InvalidLayout",
    "Lookup",
    "ManagerHarness",
    "SchedulerHarness",
    "SpecFacts",
    "build_spec",
    "declared_defaults",
    "eagle_manager_kwargs",
    "init_hashing",
    "missing_capabilities",
    "planted_scheduler_bug",
    "planted_truncate_bug",
    "qualified_name",
    "replay_oplog",
    "resolve_block_sizes",
    "spec_base_class",
    "spec_class_by_name",
    "spec_classes",
    "spec_constructor",
    "spec_facts",
    "temporary_spec_subclass",
]



def _planned_layout_or_none(engine, num_speculative_tokens=0):  # type: ignore[no-untyped-def]
    # Imported on first use: the planner pulls in vLLM's model registry and
    # attention backends, which every other adapter user can do without.
    from fuzz.adapter import _engine_plan

    return _engine_plan.layout_or_none(engine, num_speculative_tokens)


# Strategies size prompts by the engine planner's layouts (fuzz.model), on
# releases that have the planning code it calls.
if CAPABILITIES["engine-planning"].present():
    _register_installed(_dataclasses.replace(_installed(), plan_layout=_planned_layout_or_none))
