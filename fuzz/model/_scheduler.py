"""The scheduler tier's vocabulary: a drawn configuration and what one
``schedule()`` step showed (the connector's scripted answers:
:mod:`fuzz.model._replies`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fuzz.model._classification import Behaviour, classification_of_kind
from fuzz.model._connector import ConnectorAlloc, ConnectorFinish, ConnectorMeta, FailedLoad
from fuzz.model._encoder import MissingEncoderOutput
from fuzz.model._contents import (
    EventGap,
    EventOrphan,
    ForeignHit,
    HitAcrossReset,
    KvFromOtherToken,
    KeyCollision,
    MisnamedEntry,
    MissingLookahead,
    PreemptedRequest,
    UnbackedEntry,
    UnwrittenRead,
)
from fuzz.model._engine import EngineDraw, reach_label
from fuzz.model._cache import CachedWhileOff, ForgottenEntry, ShortHit
from fuzz.model._evictions import Eviction
from fuzz.model._events import EventPayload
from fuzz.model._fate import RequestPlaces, WaitingRequest
from fuzz.model._kv import GroupInfo, LayoutDraw, Span
from fuzz.model._outputs import DraftVerification, StaleOutput
from fuzz.model._ownership import OwnershipObservation

if TYPE_CHECKING:
    from fuzz.model._oplog import Step

__all__ = [
    "KV_ROLES",
    "AdmissionObservation",
    "ConnectorAlloc",
    "ConnectorFinish",
    "ConnectorMeta",
    "DraftVerification",
    "PoolObservation",
    "PreemptedRequest",
    "SchedulerDraw",
    "StaleOutput",
    "StepObservation",
]

# The connector roles a draw may take (KVTransferConfig.kv_role); a consumer
# ("kv_consumer") is left out: it saves nothing, and "kv_both" already loads.
KV_ROLES = ("kv_both", "kv_producer")


@dataclasses.dataclass(frozen=True)
class SchedulerDraw:
    """A scheduler configuration: KV layout, budgets, connector capability."""

    layout: LayoutDraw
    max_num_batched_tokens: int = 64
    max_num_seqs: int = 8
    long_prefill_token_threshold: int = 0
    divergent_hits: bool = True
    kv_load_failure_policy: str = "fail"
    # Which model runner the scheduler serves ("v1", "v2"; None: the
    # release's own choice on this machine). It changes what SchedulerOutput
    # looks like: with V2, requests resumed after a preemption are reported
    # as new requests; with V1, among the cached ones.
    model_runner: str | None = None
    # The model and cache flags vLLM's engine planned ``layout`` from
    # (engine-reachable); None: the layout was built directly (scheduler-API).
    engine: EngineDraw | None = None
    # ``--async-scheduling``: vLLM builds an ``AsyncScheduler`` and the engine
    # core drives it through its batch queue (one step's output fed back
    # after the next schedule()). False: the synchronous ``Scheduler``.
    async_scheduling: bool = False
    # ``--prefill-schedule-interval``: admit prefills only once every N
    # executed steps while requests decode (vLLM's local prefill cadence;
    # 1, the default, admits them every step).
    prefill_schedule_interval: int = 1
    # The connector's ``kv_role``: "kv_both" (loads and saves: a consumer, so
    # vLLM defers block frees under async scheduling, scheduler.py:189-195)
    # or "kv_producer" (a P/D prefill instance: it never loads, so vLLM frees
    # at once and may preempt a request whose step is still in flight).
    kv_role: str = "kv_both"
    # ``--kv-events-config`` with ``enable_kv_cache_events``: the block pool
    # queues BlockStored / BlockRemoved / AllBlocksCleared events and each
    # update_from_output() publishes them (the harness replays them as a
    # KV-aware router would). Off: no event is built, as by default.
    kv_events: bool = False

    # Speculative decoding (``--speculative-config``): the method ("ngram":
    # prompt lookup, no draft model; "eagle": a draft model reading the
    # target's hidden states, which reserves lookahead slots and drops the
    # trailing cached block) and its ``num_speculative_tokens`` k; None and
    # 0: no speculation. ``draft_acceptance``: how many drafts the rejection
    # sampler accepts at each verification, cycled over the step's requests
    # (see :meth:`accepted`).
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    draft_acceptance: tuple[int, ...] = ()
    # ``--enable-lora --max-loras N`` (0: LoRA off): the scheduler batches
    # requests of at most N adapters (a request's adapter is in AddRequest.lora).
    max_loras: int = 0
    connector: bool = True  # --kv-transfer-config; False only where a repro's shrinking drops it
    # The engine's metrics, as ``vllm serve`` runs by default (no
    # ``--disable-log-stats``): the scheduler is built with ``log_stats=True``
    # and returns SchedulerStats (prefix-cache and connector hit counts)
    # after each step; with it ``--kv-cache-metrics`` (every block sampled)
    # and per-request speculative-decoding metrics ("detailed"). Off: the
    # offline ``LLM`` default. None of it changes what is scheduled.
    metrics: bool = False
    # A data-parallel engine core behind the DP coordinator (internal load
    # balancing): the scheduler is built with ``include_finished_set=True``
    # and returns the ids of requests finished since its last output, per
    # front-end client.
    finished_sets: bool = False
    # ``--enable-prefix-caching`` (vLLM's default) or ``--no-enable-prefix-caching``:
    # off, the pool caches no block, so nothing is ever found local (a
    # connector may still supply external tokens). Only for layouts without
    # a Mamba group: vLLM then runs Mamba in its "none" mode, one state
    # block of max_model_len tokens, a layout the adapter does not build.
    # And with a connector: with neither, EngineCore builds no block hasher,
    # and the harness's requests always carry block hashes.
    prefix_caching: bool = True
    # ``--no-enable-chunked-prefill`` when False: a prompt is scheduled whole
    # or not at all (schedule() stops at the first waiting request whose
    # prompt exceeds the step's token budget). vLLM then refuses a
    # max_model_len above max_num_batched_tokens, and Mamba prefix caching
    # needs chunked prefill: only for layouts without a Mamba group.
    chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.engine is not None and self.engine.enable_prefix_caching != self.prefix_caching:
            raise ValueError(f"prefix_caching={self.prefix_caching} disagrees with the engine draw's "
                             f"enable_prefix_caching={self.engine.enable_prefix_caching}")
        if not self.chunked_prefill and (self.layout.max_model_len > self.max_num_batched_tokens
                                         or self.layout.has_mamba):
            raise ValueError("chunked_prefill=False needs max_model_len <= max_num_batched_tokens "
                             "and a layout without a Mamba group")
        if not self.prefix_caching and (not self.connector or self.layout.has_mamba):
            raise ValueError("prefix_caching=False needs a KV connector and a layout without a Mamba group")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role={self.kv_role!r} is not one of {KV_ROLES}")
        if not self.connector and (self.divergent_hits or self.kv_role != "kv_both"):  # vLLM asks the connector
            raise ValueError(f"connector=False needs divergent_hits=False, kv_role='kv_both' "
                             f"(got divergent_hits={self.divergent_hits}, kv_role={self.kv_role!r})")
        if (self.speculative_method is None) != (self.num_speculative_tokens == 0):
            raise ValueError(
                f"speculative_method={self.speculative_method!r} needs num_speculative_tokens > 0 "
                f"and the other way round (got {self.num_speculative_tokens})"
            )
        if self.speculative_method is not None and not self.draft_acceptance:
            raise ValueError("a speculative draw needs a non-empty draft_acceptance")

    def accepted(self, step: int, position: int, verifiable: int) -> int:
        """Drafts the rejection sampler accepts for the ``position``-th
        request (in the output's order) that had ``verifiable`` drafts
        verified in ``step``: the draw's acceptance schedule, cycled, capped
        at what could be accepted."""
        if not self.draft_acceptance:
            return 0
        return min(verifiable, self.draft_acceptance[(step + position) % len(self.draft_acceptance)])

    @property
    def reach(self) -> tuple[str, str]:
        """(label, reason): engine-reachable or scheduler-API, and why."""
        return reach_label(self.engine)

    @property
    def model(self) -> str:
        """The engine draw's architecture family; else a hybrid model for
        layouts with a whole-state (Mamba-like) group, else a plain decoder."""
        if self.engine is not None:
            return self.engine.name

        whole_state = any(
            classification_of_kind(g.kind).behaviour is Behaviour.MAY_BE_SHORT for g in self.layout.groups
        )
        return "hybrid" if whole_state else "plain"

    def __repr__(self) -> str:
        connector = (f"connector.supports_divergent_local_hybrid_hits={self.divergent_hits}, "
                     f"kv_load_failure_policy={self.kv_load_failure_policy!r}" if self.connector else "no KV connector")
        return (
            f"Scheduler({self.model}, {self.layout!r}, "
            f"max_num_batched_tokens={self.max_num_batched_tokens}, "
            f"max_num_seqs={self.max_num_seqs}, "
            f"long_prefill_token_threshold={self.long_prefill_token_threshold}, "
            f"{connector}"
            f"{'' if self.model_runner is None else f', model_runner={self.model_runner!r}'}"
            f"{', async_scheduling=True' if self.async_scheduling else ''}"
            f"{'' if self.prefill_schedule_interval == 1 else f', prefill_schedule_interval={self.prefill_schedule_interval}'}"
            f"{'' if self.kv_role == 'kv_both' else f', kv_role={self.kv_role!r}'}"
            f"{', log_stats=True' if self.metrics else ''}"
            f"{', include_finished_set=True' if self.finished_sets else ''}"
            f"{'' if self.prefix_caching else ', enable_prefix_caching=False'}"
            f"{'' if self.chunked_prefill else ', enable_chunked_prefill=False'}"
            f"{'' if self.speculative_method is None else f', speculative_config={{method={self.speculative_method!r}, num_speculative_tokens={self.num_speculative_tokens}}}, draft_acceptance={self.draft_acceptance}'}"
            f"{'' if self.engine is None else f', engine={self.engine!r}'})"
        )


@dataclasses.dataclass(frozen=True)
class AdmissionObservation:
    """One waiting request's trip through the prefix-cache branch of
    ``schedule()``: the local lookup, the connector's answer, the allocation.

    Block ids are per KV-cache group; ``null_block_id`` marks padding (skipped
    sliding-window blocks, Mamba interior states).
    """

    request_id: str
    step: int
    num_tokens: int
    groups: tuple[GroupInfo, ...]
    # Per group, the attention span parameter that lets it skip old tokens:
    # ("sliding_window", W), ("attention_chunk_size", C), or None.
    spans: tuple[tuple[str, int] | None, ...]
    # Per group, the spec-kind table's verdict: how it must truncate, and how
    # its attention span skips old tokens (None: it reads every earlier token).
    behaviours: tuple[Behaviour, ...]
    span_rules: tuple[Span | None, ...]
    scheduler_block_size: int
    hash_block_size: int
    null_block_id: int
    divergent_capable: bool  # the connector's supports_divergent_local_hybrid_hits
    # The scheduler's local lookup (what _get_local_prefix_cache_hit returned).
    local_hit: int
    local_blocks: tuple[tuple[int, ...], ...]
    hit_diverged: bool
    # Side lookups taken at the same instant (pure; nothing is touched).
    per_group_hits: tuple[int, ...]
    joint_hit: int
    joint_blocks: tuple[tuple[int, ...], ...]
    # The connector's side.
    asked_with: int | None = None
    reply: int | None = None
    reply_honest: bool = True
    reply_async: bool = False
    # What the scheduler handed to allocate_slots (None: never got that far).
    alloc_local_tokens: int | None = None
    alloc_local_blocks: tuple[tuple[int, ...], ...] | None = None
    alloc_external_tokens: int | None = None
    alloc_ok: bool = False
    alloc_raised: bool = False
    # The outcome.
    admitted: bool = False
    num_computed_tokens: int | None = None
    connector_external_tokens: int | None = None
    block_table: tuple[tuple[int, ...], ...] = ()
    cow_dst_ids: frozenset[int] = frozenset()
    # Admitted again after a preemption (reported among the cached requests).
    resumed: bool = False
    # Labels only (the invariants never trust these).
    truncated_at: int | None = None
    fell_back: bool = False
    # Per group, the block ids update_state_after_alloc handed the connector
    # (None: it was not called for this admission).
    connector_block_ids: tuple[tuple[int, ...], ...] | None = None
    # The harness built the request with SamplingParams(skip_reading_prefix_cache=True)
    # (what it asked for, not what vLLM's Request says): it reads no cached tokens.
    skips_prefix_cache: bool = False
    # The model's index at the lookup (fuzz/adapter/_hits.py): per group, the prefix
    # lengths of the request the index holds an entry for; the hit alignment; the
    # caller's limit; per group, the sliding window, the attention chunk and the
    # EAGLE drop (0: none). None: a layout or request the claim makes no prediction for.
    index_hold: tuple[tuple[int, ...], ...] | None = None
    hit_alignment: int = 0
    hit_limit: int = 0
    hit_windows: tuple[int, ...] = ()
    hit_chunks: tuple[int, ...] = ()
    hit_drops: tuple[int, ...] = ()

    @property
    def partial_tail(self) -> int:
        return self.local_hit % self.scheduler_block_size

    def describe(self) -> str:
        kinds = [g.spec_class.rsplit(".", 1)[-1] for g in self.groups]
        lines = [
            f"request {self.request_id} (num_tokens={self.num_tokens}) admitted at step {self.step}:",
            f"  groups {list(zip(kinds, (g.block_size for g in self.groups)))}, "
            f"scheduler block {self.scheduler_block_size}, hash block {self.hash_block_size}",
            *(["  SamplingParams(skip_reading_prefix_cache=True)"] if self.skips_prefix_cache else []),
            f"  local lookup: hit={self.local_hit} (partial tail {self.partial_tail}), "
            f"hit_diverged={self.hit_diverged}, per-group hits={list(self.per_group_hits)}, "
            f"joint hit={self.joint_hit}",
            f"  connector: get_num_new_matched_tokens(req, {self.asked_with}) -> "
            f"({self.reply}, async={self.reply_async}){'' if self.reply_honest else ' [over-report]'}",
            f"  allocate_slots(num_new_computed_tokens={self.alloc_local_tokens}, "
            f"num_external_computed_tokens={self.alloc_external_tokens}) -> "
            f"{'blocks' if self.alloc_ok else 'raised' if self.alloc_raised else 'None'}",
            f"  outcome: admitted={self.admitted}, num_computed_tokens={self.num_computed_tokens}, "
            f"connector told external={self.connector_external_tokens}"
            f"{' (resumed after preemption)' if self.resumed else ''}",
            f"  lookup blocks={[list(g) for g in self.local_blocks]}",
            f"  adopted blocks={None if self.alloc_local_blocks is None else [list(g) for g in self.alloc_local_blocks]}",
            f"  block table={[list(g) for g in self.block_table]}, CoW destinations={sorted(self.cow_dst_ids)}",
        ]
        if self.connector_block_ids is not None:
            lines.append(
                f"  connector: update_state_after_alloc(req, blocks={[list(g) for g in self.connector_block_ids]}, "
                f"num_external_tokens={self.connector_external_tokens})"
            )
        if self.index_hold is not None:
            lines.append(
                f"  index at the lookup: prefix lengths held per group={[list(g) for g in self.index_hold]}, "
                f"hit alignment {self.hit_alignment}, limit {self.hit_limit}"
                + (f", sliding windows per group {list(self.hit_windows)}" if any(self.hit_windows) else "")
                + (f", attention chunks per group {list(self.hit_chunks)}" if any(self.hit_chunks) else "")
                + (f", EAGLE drop per group {list(self.hit_drops)}" if any(self.hit_drops) else "")
            )
        if self.truncated_at is not None:
            lines.append(f"  truncate_computed_blocks(blocks, {self.truncated_at}) was called")
        if self.fell_back:
            lines.append("  the divergent-hit fallback (get_computed_blocks) ran")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class StrandedRequest:
    """A RUNNING request the scheduler has left alone for ``quiet_steps``
    engine steps in a row in which nothing was scheduled, nothing was in
    flight (no step output pending, no async load, no producer hand-off)
    and nothing arrived: no later ``schedule()`` can see anything new, so it
    is never scheduled again."""

    request_id: str
    num_computed_tokens: int
    num_tokens: int
    num_prompt_tokens: int
    max_tokens: int
    num_output_placeholders: int  # AsyncScheduler's outputs it still expects
    quiet_steps: int
    # The harness's record: a synchronous load of it failed under the
    # recompute policy, so vLLM rolled it back to recompute the blocks.
    recomputed_failed_load: bool = False
    # The worker's encoder cache holds the output of one of its items that
    # lies past where it resumes, but not that of the item it reaches next.
    holds_later_encoder_output: bool = False
    # The next item it reaches has no output in the worker's encoder cache:
    # it waits for the encoder, and so for room in the cache.
    needs_encoder_output: bool = False

    def describe(self) -> str:
        return (
            f"request {self.request_id} RUNNING and unscheduled for {self.quiet_steps} quiet steps: "
            f"num_computed_tokens={self.num_computed_tokens}, num_tokens={self.num_tokens} "
            f"(prompt {self.num_prompt_tokens}, max_tokens {self.max_tokens}), "
            f"num_output_placeholders={self.num_output_placeholders}"
            + (", rolled back by a failed synchronous load (recompute)" if self.recomputed_failed_load else "")
            + (", the worker's encoder cache holding a later image's output and not the next one's"
               if self.holds_later_encoder_output else "")
            + (", waiting for its next image's encoder output"
               if self.needs_encoder_output and not self.holds_later_encoder_output else "")
        )


@dataclasses.dataclass(frozen=True)
class StepObservation:
    """One engine step: ``schedule()`` and the ``update_from_output()`` the
    engine makes in the same step (with async scheduling, possibly of the
    previous step's output: :attr:`fed_step`)."""

    step: int
    admissions: tuple[AdmissionObservation, ...]
    error: str | None  # "ExcType: message" from schedule()/update_from_output()
    error_type: str | None
    error_where: str | None  # "schedule", "update_from_output" or "reset_prefix_cache"
    dishonest_replies: tuple[str, ...]  # request ids given an over-report this step
    num_scheduled: dict[str, int]
    # (request id, num_computed_tokens, num_tokens) for each request scheduled
    # for the first time, or again after an async load or a preemption.
    newly_scheduled: tuple[tuple[str, int, int], ...]
    preempted: frozenset[str]
    finished: frozenset[str]
    context: str = dataclasses.field(default="", compare=False)
    copies: tuple[tuple[int, int], ...] = ()  # copy-on-write (source, destination), in the output's order
    # The error's innermost vLLM frames ("vllm/v1/core/block_pool.py:BlockPool.get_new_blocks") first.
    error_frames: tuple[str, ...] = ()
    error_statement: str = ""  # the vLLM statement that raised, whitespace collapsed
    vllm_version: str = dataclasses.field(default="", compare=False)
    # The connector protocol as the scheduled connector saw it in this step's
    # schedule(): every update_state_after_alloc, every build_connector_meta.
    connector_allocs: tuple[ConnectorAlloc, ...] = ()
    connector_metas: tuple[ConnectorMeta, ...] = ()
    loads_in_flight: frozenset[str] = frozenset()  # async loads not reported done as schedule() began
    # Since the previous step's observation (aborts between steps included):
    # every request_finished(_all_groups) call, and each request that left the
    # scheduler with how many times the connector had been told it finished.
    connector_finishes: tuple[ConnectorFinish, ...] = ()
    left_scheduler: tuple[tuple[str, int], ...] = ()
    # KV loads reported failed in this step, and failed async loads the
    # scheduler took back out of WAITING_FOR_REMOTE_KVS in this step.
    failed_loads: tuple[FailedLoad, ...] = ()
    # Requests recomputing what a failed synchronous load (invalid_block_ids,
    # recompute policy) had covered before vLLM rolled them back: from the step after
    # the rollback until they compute past the load and the failed step's tokens; and
    # those it rolled back past that end too (async scheduling: the tokens of
    # a step in flight), until they compute past where they had been.
    rolled_back: frozenset[str] = frozenset()
    rolled_back_in_flight: frozenset[str] = frozenset()
    # Requests whose async load of their whole prompt has landed (vLLM then
    # recomputes the last token: Scheduler._update_waiting_for_remote_kv
    # sets num_computed_tokens = num_tokens - 1; a 1-token prompt goes back
    # through admission from 0).
    whole_prompt_landed: frozenset[str] = frozenset()
    # Block ownership right after schedule() (when it raised: what it had
    # allocated and looked up before; None: no ownership spy).
    ownership: OwnershipObservation | None = dataclasses.field(default=None, compare=False)
    # Whose ModelRunnerOutput this step fed through update_from_output(): this
    # step's own (== step), the previous step's (async scheduling: the engine's
    # batch queue fed it one step late), or None (nothing fed: the output is
    # pending until the next step, or schedule() raised).
    fed_step: int | None = None
    async_scheduling: bool = False  # the scheduler is an AsyncScheduler
    # False: the engine step called no schedule() (async scheduling with no
    # request left: it only fed the queued output).
    schedule_called: bool = True
    # schedule() held prefills back this step (prefill_schedule_interval > 1:
    # the local prefill cadence's gate was closed with requests waiting).
    prefill_held: bool = False
    # Requests preempted after the step whose output this step fed (their
    # share of it is stale).
    stale_outputs: tuple[StaleOutput, ...] = ()
    # Speculative decoding: each request whose drafts the fed output verified.
    draft_verifications: tuple[DraftVerification, ...] = ()
    # RUNNING requests no later schedule() can pick up (see StrandedRequest).
    stranded: tuple[StrandedRequest, ...] = ()
    # Positions whose KV was computed from another token than the one vLLM
    # records there, found after this step's update_from_output().
    kv_from_other_tokens: tuple[KvFromOtherToken, ...] = ()
    # What the blocks hold (fuzz/adapter/_contents.py): positions a step read
    # that its blocks do not hold, and prefix-cache entries, after the step,
    # whose blocks do not hold what their keys cover, or hold the KV of
    # something else there.
    unwritten_reads: tuple[UnwrittenRead, ...] = ()
    unbacked_entries: tuple[UnbackedEntry, ...] = ()
    misnamed_entries: tuple[MisnamedEntry, ...] = ()
    # Each prefix-cache key a request carried that another request carried
    # first over another prefix (tokens or namespace), learnt this step.
    key_collisions: tuple[KeyCollision, ...] = ()
    # Each multimodal item whose placeholder the step computes positions of
    # while the worker's encoder cache lacks its output (fuzz/adapter/_encoder.py).
    missing_encoder_outputs: tuple[MissingEncoderOutput, ...] = ()
    # KV events on (SchedulerDraw.kv_events), after an update_from_output()
    # that published: each key where the replayed events and the index
    # disagree. Empty where no update ran, or events are off.
    event_gaps: tuple[EventGap, ...] = ()
    # ... and each BlockStored event the update published whose parent no
    # event published before it announced in its group.
    event_orphans: tuple[EventOrphan, ...] = ()
    # ... and each block a BlockStored event announced whose payload (tokens,
    # block size, LoRA, extra keys, medium) is not what the harness knows of it.
    event_payloads: tuple[EventPayload, ...] = ()
    events_replayed: bool = False
    # Blocks the step's admissions adopted (what schedule() handed to
    # allocate_slots as computed) that were written under another salt.
    foreign_hits: tuple[ForeignHit, ...] = ()
    hits_across_reset: tuple[HitAcrossReset, ...] = ()  # ... or KV computed before a reset
    # Requests whose table the drafter's lookahead writes run past.
    missing_lookahead: tuple[MissingLookahead, ...] = ()
    # Each request this step's schedule() preempted, as it left it.
    preemptions: tuple[PreemptedRequest, ...] = ()
    # Each cached block an allocation took from the pool since the last step.
    evictions: tuple[Eviction, ...] = ()
    # Every request not settled in exactly one place after the step, and the
    # waiting ones whose blockers were gone (fuzz/model/_fate.py).
    places: tuple[RequestPlaces, ...] = ()
    waiting_unblocked: tuple[WaitingRequest, ...] = ()
    # The harness's own model of the prefix cache (fuzz/adapter/_cache_model.py):
    # entries it files that the index lacks after the step, and the step's
    # lookups that served less than it guarantees.
    forgotten_entries: tuple[ForgottenEntry, ...] = ()
    short_hits: tuple[ShortHit, ...] = ()
    # With prefix caching off (the draw's flag, not vLLM's): every entry the
    # index holds after the step (there must be none).
    cached_while_off: tuple[CachedWhileOff, ...] = ()
    # The operation-log entry of this step, the very object the harness's log
    # holds: one record of the step (see recorded). None: built by hand.
    op: Step | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def recorded(cls, op: Step, **fields: Any) -> StepObservation:
        """The observation of the step the log entry ``op`` records: its
        index, error and where it was raised, and the requests that left in
        ``update_from_output``, are the entry's own; ``fields`` the rest."""
        return cls(step=op.index, error=op.error, error_where=op.error_where, finished=frozenset(op.left), op=op,
                   **fields)

    def __post_init__(self) -> None:
        op = self.op
        if op is not None and (op.index, op.error, op.error_where, op.left) != (
                self.step, self.error, self.error_where, tuple(sorted(self.finished))):
            raise ValueError(f"the observation of step {self.step} disagrees with the log entry of step {op.index} "
                             "it carries (error, where it was raised, or the requests that left)")

    @property
    def fed_late(self) -> bool:
        """The step fed the previous step's output, after its own schedule()."""
        return self.fed_step is not None and self.fed_step < self.step

    def describe(self) -> str:
        lines = [f"step {self.step} on vLLM {self.vllm_version}: scheduled {self.num_scheduled}"]
        if self.fed_step != self.step:
            lines.append(
                "  update_from_output(): "
                + ("nothing fed (this step's output pending)" if self.fed_step is None
                   else f"fed step {self.fed_step}'s output (one step late)")
            )
        if self.preempted:
            lines.append(f"  preempted: {sorted(self.preempted)}")
        if self.error:
            lines.append(f"  {self.error_where}() raised {self.error}")
            if self.error_frames:
                lines.append("  innermost vLLM frames: " + " <- ".join(self.error_frames))
            if self.error_statement:
                lines.append(f"  raised by: {self.error_statement}")
        if self.copies:
            lines.append("  block copies (src->dst): " + ", ".join(f"{a}->{b}" for a, b in self.copies))
        if self.loads_in_flight:
            lines.append(f"  async loads in flight at the start: {sorted(self.loads_in_flight)}")
        lines += [f"  connector: {a.describe()}" for a in self.connector_allocs]
        lines += [f"  connector: {m.describe()}" for m in self.connector_metas]
        lines += [
            f"  connector: {f.method}({f.request_id}) with status {f.status} (call #{f.nth} for it)"
            for f in self.connector_finishes
        ]
        lines += [f"  failed load: {f.describe()}" for f in self.failed_loads]
        lines += [f"  stale output: {o.describe()}" for o in self.stale_outputs]
        lines += [f"  drafts: {v.describe()}" for v in self.draft_verifications]
        lines += [f"  stranded: {r.describe()}" for r in self.stranded]
        lines += [a.describe() for a in self.admissions]
        if self.context:
            lines.append(f"  scenario: {self.context}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class PoolObservation:
    """The block pool once no request holds blocks."""

    num_blocks: int
    num_free: int
    referenced: tuple[tuple[int, int], ...]  # (block_id, ref_cnt) with ref_cnt != 0
    live_requests: tuple[str, ...]
    context: str = dataclasses.field(default="", compare=False)
