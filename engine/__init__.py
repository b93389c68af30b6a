"""Engine tier: the real vLLM engine on a tiny hybrid model, a hybrid-aware
reference KV connector, and a differential output oracle.

Public surface (importing this package imports no vLLM):
  build_tiny_hybrid, TinyHybridSpec      engine.model
  KVStore, RequestBehaviour, StorePolicy engine.store
  check_completion, Completion, ColdResult, OutputMismatch, LOGPROB_TOL  engine.oracle
  engine_scenarios, request_behaviours   engine.strategies
  EngineHarness, ColdReference, run_scenario, engine_unavailable_reason  engine.harness
The connector itself is ``engine.connector.ReferenceHybridConnector`` (imports vLLM).
"""

from engine.harness import (
    ColdReference,
    EngineDied,
    EngineHarness,
    ScenarioReport,
    engine_flavour,
    engine_unavailable_reason,
    run_scenario,
)
from engine.model import TinyHybridSpec, build_tiny_hybrid
from engine.oracle import LOGPROB_TOL, ColdResult, Completion, OutputMismatch, Verdict, check_completion
from engine.store import KVStore, RequestBehaviour, StorePolicy, get_store

__all__ = [
    "LOGPROB_TOL",
    "ColdReference",
    "ColdResult",
    "Completion",
    "EngineDied",
    "EngineHarness",
    "KVStore",
    "OutputMismatch",
    "RequestBehaviour",
    "ScenarioReport",
    "StorePolicy",
    "TinyHybridSpec",
    "Verdict",
    "build_tiny_hybrid",
    "check_completion",
    "engine_flavour",
    "engine_unavailable_reason",
    "get_store",
    "run_scenario",
]
