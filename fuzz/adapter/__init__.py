"""The one adapter between this suite and vLLM's internal API.

Every vLLM constructor call and every version difference lives in this
package; strategies, invariants and targets import only from here (and speak
in :mod:`fuzz.model` dataclasses). Submodules: ``_kv`` (specs, KV-cache
configs, ``KVCacheManager``, planted truncation bugs), ``_scheduler`` (the
real ``Scheduler`` with a scripted KV connector).
"""

from fuzz.adapter._kv import (
    PLANTED_TRUNCATE_BUGS,
    VLLM_VERSION,
    InvalidLayout,
    Lookup,
    ManagerHarness,
    SpecFacts,
    build_spec,
    init_hashing,
    planted_truncate_bug,
    qualified_name,
    resolve_block_sizes,
    spec_base_class,
    spec_class_by_name,
    spec_classes,
    spec_facts,
    temporary_spec_subclass,
)

__all__ = [
    "PLANTED_TRUNCATE_BUGS",
    "VLLM_VERSION",
    "InvalidLayout",
    "Lookup",
    "ManagerHarness",
    "SpecFacts",
    "build_spec",
    "init_hashing",
    "planted_truncate_bug",
    "qualified_name",
    "resolve_block_sizes",
    "spec_base_class",
    "spec_class_by_name",
    "spec_classes",
    "spec_facts",
    "temporary_spec_subclass",
]

# --- scheduler tier (fuzz/adapter/_scheduler.py, fuzz/adapter/_connector.py) ---
from fuzz.adapter._connector import (  # noqa: E402
    REPLY_KINDS,
    ExternalReply,
)
from fuzz.adapter._scheduler import (  # noqa: E402
    PLANTED_SCHEDULER_BUGS,
    AdmissionObservation,
    PoolObservation,
    SchedulerDraw,
    SchedulerHarness,
    StepObservation,
    planted_scheduler_bug,
    scheduler_tier_unsupported,
)

__all__ += [
    "PLANTED_SCHEDULER_BUGS",
    "REPLY_KINDS",
    "AdmissionObservation",
    "ExternalReply",
    "PoolObservation",
    "SchedulerDraw",
    "SchedulerHarness",
    "StepObservation",
    "planted_scheduler_bug",
    "scheduler_tier_unsupported",
]
