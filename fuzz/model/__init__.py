"""The suite's own vocabulary: small frozen dataclasses, no vLLM imports.

Strategies draw these, the adapter turns them into vLLM objects and reports
what vLLM did in them, and the invariants read those observations and raise
:class:`InvariantViolation`. Keeping vLLM out of this package is what lets the
rest of the suite survive vLLM's moving internal API.

* ``_classification``: the spec-kind table, one row per vLLM spec class
  (:data:`CLASSIFIED`, :data:`EXEMPT`): how each kind
  must truncate and the facts needed to draw, build and judge its groups;
* ``_groups``: what the checks, runners and repro writers say about one
  group (its behaviour, kind and name, :func:`cdiv`) and the connector
  answer the scheduler acts on;
* ``_kv``: KV-cache layouts (:class:`SpecDraw`, :class:`LayoutDraw`), an
  EAGLE-style drafter's settings (:class:`EagleDraw`), one
  ``truncate_computed_blocks`` call (:class:`TruncationObservation`), and
  the table's values a repro file carries (:class:`Behaviour`,
  :class:`Span`);
* ``_outputs``: what a fed-back output did to its requests
  (:class:`StaleOutput`, :class:`DraftVerification`), and the helpers that
  build them for the harness;
* ``_replies``: the connector's scripted answers (:class:`ExternalReply`);
* ``_scheduler``: a scheduler configuration (:class:`SchedulerDraw`), the
  protocol calls the connector saw (:class:`ConnectorAlloc`, :class:`ConnectorMeta`,
  :class:`ConnectorFinish`), one step
  (:class:`StepObservation`, :class:`AdmissionObservation`) and the idle
  pool (:class:`PoolObservation`);
* ``_scenarios``: the scenarios the runners play (:class:`TruncationScenario`,
  :class:`SingleShotScenario` and their parts, drawn by :mod:`strategies`;
  :class:`FixedRun`, written by hand beside a planted bug);
* ``_oplog``: the operation log of a scheduler run (:class:`OpLog`), a
  repro's source of truth, and the one place its kinds of operation are
  told apart (:class:`OpVisitor`);
* ``_oplog_json``: that log as JSON and back (:func:`encode_oplog`,
  :func:`decode_oplog`), for the campaign's sidecar and ``replay``;
* ``_ownership``: the shadow model of block ownership after one
  ``schedule()`` (:class:`OwnershipObservation`);
* ``_evictions``: how each free block came back to the pool
  (:class:`FreedBlock`) and each cached block an allocation evicted
  (:class:`Eviction`), and vLLM's free order among them
  (:func:`reused_before`, :func:`evicted_out_of_order`);
* ``_cache``: where vLLM's index or a lookup fell short of the harness's
  model of the prefix cache (:class:`ForgottenEntry`, :class:`ShortHit`, :class:`CachedWhileOff`);
* ``_hits``: how long a hit the prefix-cache index allows a lookup
  (:func:`allowed_hit`);
* ``_fate``: where each request the harness added is after a step
  (:class:`RequestPlaces`) and the waiting requests whose blockers were
  gone (:class:`WaitingRequest`);
* ``_events``: a block a KV event announces whose payload is not what the
  harness knows of it (:class:`EventPayload`);
* ``_violations``: :class:`InvariantViolation`, :class:`HarnessError`;
* ``_catalog``: what the installed vLLM offers (:func:`installed`), filled in
  by the adapter;
* ``_engine``: an engine-reachable configuration (:class:`EngineDraw`: a
  model's config.json and cache flags) and the reach labels.
"""

from fuzz.model._catalog import Installed, installed, register_installed
from fuzz.model._classification import (
    CLASSIFIED,
    EXEMPT,
    Behaviour,
    Classification,
    Exemption,
    Param,
    Span,
    UnclassifiedSpec,
    behaviour_of,
    classification_of_kind,
    provisional,
    question_for,
)
from fuzz.model._groups import answer_acted_on, cdiv, group_behaviour, group_kind, group_name, span_of
from fuzz.model._kv import first_needed_token, saved_prefix
from fuzz.model._ownership import AllocationRecord, HeldTable, LookupRecord, OwnershipObservation
from fuzz.model._evictions import Eviction, FreedBlock, describe_out_of_order, evicted_out_of_order, reused_before
from fuzz.model._cache import CachedWhileOff, ForgottenEntry, ShortHit
from fuzz.model._fate import RequestPlaces, WaitingRequest
from fuzz.model._events import EventPayload
from fuzz.model._hits import allowed_hit
from fuzz.model._engine import ENGINE_REACHABLE, SCHEDULER_API, EngineDraw, reach_label
from fuzz.model._kv import BlockRef, EagleDraw, GroupInfo, GroupTruncation, LayoutDraw, SpecDraw, TruncationObservation
from fuzz.model._oplog import (
    Abort,
    AddRequest,
    ConnectorAnswer,
    Evict,
    FedOutput,
    OpLog,
    OpVisitor,
    ResetPrefixCache,
    RunConfig,
    ScheduledOutput,
    Step,
)
from fuzz.model._oplog_json import decode_oplog, encode_oplog
from fuzz.model._connector import HandOff
from fuzz.model._replies import REPLY_KINDS, ExternalReply
from fuzz.model._scheduler import (
    AdmissionObservation,
    ConnectorAlloc,
    ConnectorFinish,
    ConnectorMeta,
    DraftVerification,
    FailedLoad,
    KvFromOtherToken,
    MisnamedEntry,
    UnbackedEntry,
    EventGap,
    EventOrphan,
    ForeignHit,
    HitAcrossReset,
    MissingLookahead,
    UnwrittenRead,
    PoolObservation,
    PreemptedRequest,
    SchedulerDraw,
    StaleOutput,
    StepObservation,
    StrandedRequest,
)
from fuzz.model._contents import (
    KeyCollision, event_orphans_of, hits_across_reset_of, key_collisions_of, missing_lookahead_of, unwritten_reads_of,
)
from fuzz.model._scenarios import EndpointRule, FixedPrompt, FixedRun, PromptDraw, SingleShotScenario, TruncationScenario
from fuzz.model._scenarios import distinct_prompts
from fuzz.model._outputs import draft_verifications_of, drafts_to_verify_of, stale_outputs_of, stale_shares_of
from fuzz.model._violations import Fact, HarnessError, Instance, InvariantViolation, MissedHit

__all__ = [
    "saved_prefix",
    "EndpointRule",
    "FixedPrompt",
    "FixedRun",
    "PromptDraw",
    "distinct_prompts",
    "SingleShotScenario",
    "TruncationScenario",
    "CLASSIFIED",
    "EXEMPT",
    "Behaviour",
    "Classification",
    "Exemption",
    "Param",
    "Span",
    "UnclassifiedSpec",
    "behaviour_of",
    "classification_of_kind",
    "provisional",
    "question_for",
    "answer_acted_on",
    "cdiv",
    "group_behaviour",
    "group_kind",
    "group_name",
    "span_of",
    "first_needed_token",
    "ENGINE_REACHABLE",
    "SCHEDULER_API",
    "EngineDraw",
    "reach_label",
    "REPLY_KINDS",
    "Abort",
    "AddRequest",
    "ConnectorAnswer",
    "Evict",
    "FedOutput",
    "OpLog",
    "OpVisitor",
    "ResetPrefixCache",
    "RunConfig",
    "ScheduledOutput",
    "Step",
    "decode_oplog",
    "encode_oplog",
    "AdmissionObservation",
    "AllocationRecord",
    "BlockRef",
    "ConnectorAlloc",
    "ConnectorFinish",
    "ConnectorMeta",
    "DraftVerification",
    "EagleDraw",
    "Eviction",
    "ExternalReply",
    "FailedLoad",
    "HandOff",
    "GroupInfo",
    "GroupTruncation",
    "Fact",
    "HarnessError",
    "HeldTable",
    "Instance",
    "Installed",
    "InvariantViolation",
    "MissedHit",
    "KvFromOtherToken",
    "MisnamedEntry",
    "UnbackedEntry",
    "EventGap",
    "EventPayload",
    "EventOrphan",
    "event_orphans_of",
    "hits_across_reset_of",
    "KeyCollision",
    "key_collisions_of",
    "missing_lookahead_of",
    "unwritten_reads_of",
    "draft_verifications_of",
    "drafts_to_verify_of",
    "stale_outputs_of",
    "stale_shares_of",
    "ForeignHit",
    "CachedWhileOff",
    "ForgottenEntry",
    "HitAcrossReset",
    "FreedBlock",
    "ShortHit",
    "MissingLookahead",
    "UnwrittenRead",
    "LayoutDraw",
    "LookupRecord",
    "OwnershipObservation",
    "PoolObservation",
    "PreemptedRequest",
    "SchedulerDraw",
    "SpecDraw",
    "StaleOutput",
    "StepObservation",
    "StrandedRequest",
    "RequestPlaces",
    "WaitingRequest",
    "TruncationObservation",
    "allowed_hit",
    "describe_out_of_order",
    "evicted_out_of_order",
    "installed",
    "register_installed",
    "reused_before",
]
