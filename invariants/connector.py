"""Invariants of the scheduler's side of the KV-connector protocol.

The scripted connector (``fuzz/adapter/_connector.py``) records every call
the scheduler makes on it; each ``check_*`` here makes one claim about those
calls against the scheduler's own accounting, and raises
:class:`fuzz.model.InvariantViolation` naming the request, the group, the
block ids and the numbers that disagree. A connector in production acts on
exactly these calls (it loads the token range and into the blocks it was
given), so a scheduler that accounts one thing and tells the connector
another corrupts KV silently, whatever the other invariants see.

The rules are vLLM 0.33.0's, read from ``Scheduler.schedule`` (the waiting
loop's connector branch, ``vllm/v1/core/sched/scheduler.py``), the manager's
``allocate_slots`` / ``allocate_external_computed_blocks``
(``vllm/v1/core/kv_cache_manager.py``,
``vllm/v1/core/single_type_kv_cache_manager.py``) and the docstrings of
``KVConnectorBase_V1`` / ``SupportsHMA``
(``vllm/distributed/kv_transfer/kv_connector/v1/base.py``). They hold for the
configurations this suite builds: no DSV4.1 sliding-window bounded replay
(``prefix_replay_tokens``), no aux-output connector (``cap_external_hit``), no
deferred async loads (``defer_async_loads``); each of those may legitimately
shrink or drop an answer. Requests with ``skip_reading_prefix_cache`` are
drawn: the scheduler still asks the connector about them and then drops the
answer (``ext_tokens, load_kv_async = 0, False``), so they load nothing and
the load checks here do not apply to them; what they must read instead (no
cached tokens at all) is :func:`invariants.scheduler.check_skipping_request_reads_no_cache`.

Admission checks (:data:`CONNECTOR_ADMISSION_CHECKS`) see one waiting
request's trip through the connector branch (an
:class:`fuzz.model.AdmissionObservation`); step checks
(:data:`CONNECTOR_STEP_CHECKS`) a whole ``schedule()`` + ``update_from_output()``.
Vocabulary as in :mod:`invariants.scheduler`: ``local`` is what the scheduler
adopted from the prefix cache (``num_new_computed_tokens`` of
``allocate_slots``), ``ext`` what ``update_state_after_alloc`` told the
connector to load, ``total = local + ext`` the request's resume point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from fuzz.model import AdmissionObservation, Fact, FailedLoad, GroupInfo, Instance, InvariantViolation, StepObservation
from fuzz.model import answer_acted_on
from fuzz.model import cdiv as _cdiv
from fuzz.model import group_behaviour as _behaviour
from fuzz.model import group_kind, group_name as _name
from fuzz.model import Behaviour, first_needed_token
from invariants.handoff import check_hand_off_names_computed_blocks  # what request_finished names

__all__ = [
    "CONNECTOR_ADMISSION_CHECKS",
    "CONNECTOR_STEP_CHECKS",
    "LOAD_FAILURE_NOT_FAILED",
    "RECOMPUTE_FAILED_REQUEST",
    "RESUMED_INSIDE_LOAD_WITHOUT_STATE",
    "RESUMED_PAST_FAILED_TOKEN",
    "check_async_load_lands_first",
    "check_dropped_answer_loads_nothing",
    "check_external_range_contiguous",
    "check_failed_load_not_cached",
    "check_failed_load_recomputed",
    "check_finished_once",
    "check_load_blocks_cover_range",
    "check_meta_built_once",
    "check_meta_names_scheduled",
    "check_sync_load_announced",
    "check_told_external_accounted",
]

SCHEDULE = "Scheduler.schedule"


def _fail_admission(
    invariant: str, adm: AdmissionObservation, message: str, context: str = "", group: GroupInfo | None = None,
    facts: tuple[Fact, ...] = (),
) -> None:
    text = f"{message}\n{adm.describe()}"
    if context:
        text += f"\n  scenario: {context}"
    raise InvariantViolation(
        invariant, text, where=SCHEDULE, group_kind=None if group is None else group_kind(group), facts=facts
    )


def _fail_step(
    invariant: str, step: StepObservation, message: str, where: str = SCHEDULE, group: GroupInfo | None = None,
    state: str = "", request: str | None = None, facts: tuple[Fact, ...] = (),
) -> None:
    raise _step_violation(invariant, step, message, where, group, state, request, facts)


def _step_violation(
    invariant: str, step: StepObservation, message: str, where: str = SCHEDULE, group: GroupInfo | None = None,
    state: str = "", request: str | None = None, facts: tuple[Fact, ...] = (),
) -> InvariantViolation:
    """One instance: ``request`` in ``group`` (None: the claim names none)."""
    text = f"{message}\n{step.describe()}"
    kind = None if group is None else group_kind(group)
    instance = Instance(state, kind, None if group is None else group.index, () if request is None else (request,))
    return InvariantViolation(invariant, text, where=where, group_kind=kind, state=state, instances=(instance,),
                              facts=facts)


def _told(adm: AdmissionObservation, subject: str, observed: int, expected: int, why: str, rel: str = "==") -> Fact:
    """What the admitting ``schedule()`` passed the connector (``connector-asked``, ``connector-told``)."""
    return Fact(subject, (adm.request_id, why), observed, expected, rel, step=adm.step, after="schedule")


def _loads(adm: AdmissionObservation) -> bool:
    """The connector was told to load external tokens for this admission."""
    return adm.connector_block_ids is not None and bool(adm.connector_external_tokens)


# ---------------------------------------------------------------------------
# Admission-level
# ---------------------------------------------------------------------------


def check_external_range_contiguous(adm: AdmissionObservation, context: str = "") -> None:
    """When the scheduler takes external tokens, the connector loads exactly
    the range ``[local, local + ext)`` of the answer acted on: the local part
    kept equals the ``num_computed_tokens`` the scheduler passed to
    ``get_num_new_matched_tokens`` (the load starts where the local part
    ends), ``ext`` equals the count the connector answered (no more, no less),
    and ``local + ext`` never passes the prompt (``num_tokens``).

    vLLM: ``Scheduler.schedule`` asks with ``block_aligned_local`` and, when
    the answer is taken, sets ``num_new_local_computed_tokens =
    block_aligned_local`` (truncating a sub-block tail) or keeps an aligned
    hit, and ``num_external_computed_tokens = ext_tokens``; it asserts
    ``num_computed_tokens <= request.num_tokens``. ``base.py:
    KVConnectorBase_V1.get_num_new_matched_tokens``: the answer counts tokens
    "beyond the num_computed_tokens"."""
    if not _loads(adm) or adm.alloc_local_tokens is None:
        return
    ext = adm.connector_external_tokens or 0
    local = adm.alloc_local_tokens
    problems, facts = [], []
    if adm.asked_with is None:
        problems.append("the connector was never asked about this request in the step")
    elif local != adm.asked_with:
        problems.append(
            f"the scheduler kept {local} local tokens (allocate_slots num_new_computed_tokens) but "
            f"asked the connector from {adm.asked_with}: the load [{local}, {local + ext}) does not "
            f"start where the connector's answer starts ({adm.asked_with})"
        )
        facts.append(_told(adm, "connector-asked", adm.asked_with, local,
                           f"the scheduler kept {local} local tokens and loads {ext} external ones after them"))
    if adm.reply is not None and ext != adm.reply:
        problems.append(f"the connector answered {adm.reply} tokens but was told to load {ext}")
        facts.append(_told(adm, "connector-told", ext, adm.reply, f"the connector answered {adm.reply}"))
    if local + ext > adm.num_tokens:
        problems.append(f"the load ends at {local + ext}, past the prompt (num_tokens={adm.num_tokens})")
        facts.append(_told(adm, "connector-told", ext, adm.num_tokens - local, f"{local} tokens are local and the "
                           f"prompt has {adm.num_tokens}", "<="))
    if problems:
        _fail_admission("external-contiguous", adm, "; ".join(problems), context, facts=tuple(facts))


def check_load_blocks_cover_range(adm: AdmissionObservation, context: str = "") -> None:
    """The blocks ``update_state_after_alloc`` hands the connector hold the
    external range ``[local, total)`` in every group the connector loads,
    at that group's block size: a token-per-slot group a real block at each
    index from ``max(local, first needed token) // b`` to
    ``ceil(total / b) - 1`` (the first needed token is 0 for full attention,
    the window or chunk start at ``total`` otherwise); a whole-state (Mamba)
    group a real state block at the resume boundary, index
    ``ceil(total / b) - 1``. Scratch (not prefix-cacheable) groups are not
    loaded.

    vLLM: ``SingleTypeKVCacheManager.add_local_computed_blocks`` pads the
    skipped prefix with the null block and ``allocate_external_computed_blocks``
    takes new blocks up to ``cdiv(total, block_size)``; ``MambaManager``
    skips ``total - 1`` tokens, so it holds the one state block at the
    boundary. ``KVConnectorBase_V1.get_loaded_kv_cache_group_ids``: a load
    restores the prefix-cacheable groups. The scheduler then calls
    ``update_state_after_alloc(request, kv_cache_manager.get_blocks(request_id),
    num_external_computed_tokens)``."""
    if not _loads(adm) or adm.alloc_local_tokens is None or adm.connector_block_ids is None:
        return
    local = adm.alloc_local_tokens
    total = local + (adm.connector_external_tokens or 0)
    for g, behaviour, span, rule, ids in zip(adm.groups, adm.behaviours, adm.spans, adm.span_rules,
                                             adm.connector_block_ids):
        b = g.block_size
        if behaviour is Behaviour.MAY_BE_SHORT:
            needed = [_cdiv(total, b) - 1]
            what = f"the state block at the resume boundary {total}"
        elif behaviour is Behaviour.MUST_COVER:
            first = max(local, first_needed_token(span, rule, total))
            needed = list(range(first // b, _cdiv(total, b)))
            what = f"the external range [{first}, {total})"
        else:
            continue
        missing = [i for i in needed if i >= len(ids) or ids[i] == adm.null_block_id]
        if missing:
            _fail_admission(
                "load-blocks-cover",
                adm,
                f"{_name(g)}{'' if span is None else f' {span[0]}={span[1]}'}: the connector is told to "
                f"load {adm.connector_external_tokens} tokens after {local} local ones, so it needs "
                f"{what} in block indices {needed}, but it was handed blocks {list(ids)}: indices "
                f"{missing} are {'missing or ' if any(i >= len(ids) for i in missing) else ''}the null block "
                f"(id {adm.null_block_id})",
                context,
                group=g,
                facts=(Fact("connector-load-blocks", (adm.request_id, g.index, needed[0], needed[-1] + 1,
                                                      adm.null_block_id, f"{what} after {local} local tokens"),
                            list(ids[needed[0]:needed[-1] + 1]), len(needed), "len", step=adm.step,
                            after="schedule"),),
            )


def check_dropped_answer_loads_nothing(adm: AdmissionObservation, context: str = "") -> None:
    """An answer the scheduler drops is never loaded: when the local hit ends
    in a sub-block tail ``P`` and the connector's answer does not exceed it
    (``0 < E <= P``), the scheduler keeps the tail, and both
    ``update_state_after_alloc`` and ``allocate_slots`` get 0 external
    tokens.

    vLLM: ``Scheduler.schedule``, ``elif partial_tail:`` "Remote does not
    exceed the full local hit: keep the local sub-block tail and load nothing
    external" (``num_external_computed_tokens = 0``). ``base.py:
    update_state_after_alloc``: "num_external_tokens ... 0 means nothing
    should be loaded"."""
    answer = answer_acted_on(adm)  # none for a request skipping the prefix cache
    if adm.connector_block_ids is None or answer is None:
        return
    if not (adm.partial_tail and 0 < answer <= adm.partial_tail):
        return
    if adm.connector_external_tokens or adm.alloc_external_tokens:
        _fail_admission(
            "dropped-answer-loads-nothing",
            adm,
            f"the local hit {adm.local_hit} ends in a sub-block tail of {adm.partial_tail} tokens and "
            f"the connector's answer {adm.reply} does not exceed it, so the scheduler keeps the tail "
            f"and loads nothing; yet update_state_after_alloc got num_external_tokens="
            f"{adm.connector_external_tokens} and allocate_slots num_external_computed_tokens="
            f"{adm.alloc_external_tokens}",
            context,
            facts=(_told(adm, "connector-told", adm.connector_external_tokens, 0, (
                f"its local hit of {adm.local_hit} tokens ends in a sub-block tail of {adm.partial_tail} that the "
                f"connector's answer of {answer} does not exceed, so the scheduler keeps the tail and loads "
                "nothing")),) if adm.connector_external_tokens else (),
        )


# ---------------------------------------------------------------------------
# Step-level
# ---------------------------------------------------------------------------


def check_told_external_accounted(step: StepObservation) -> None:
    """Every ``update_state_after_alloc`` of a step tells the connector the
    external count the scheduler accounted: ``num_external_tokens`` equals the
    ``num_external_computed_tokens`` of the request's ``allocate_slots`` call
    just before it (0 when an async load lands and the request is admitted
    again).

    vLLM: ``Scheduler.schedule`` passes the same ``num_external_computed_tokens``
    to ``KVCacheManager.allocate_slots`` and to
    ``connector.update_state_after_alloc``; a request admitted after its async
    load keeps it 0 (``base.py: update_state_after_alloc`` "may be called twice
    ... second when any additional blocks are allocated")."""
    for a in step.connector_allocs:
        if a.alloc_external_tokens is None or a.num_external_tokens != a.alloc_external_tokens:
            why = f"allocate_slots got num_external_computed_tokens={a.alloc_external_tokens}"
            _fail_step(
                "told-external-accounted",
                step,
                f"update_state_after_alloc told the connector to load {a.num_external_tokens} external "
                f"tokens for request {a.request_id}, but the scheduler's allocate_slots call for it "
                + (
                    "was missing in this step"
                    if a.alloc_external_tokens is None
                    else f"accounted num_external_computed_tokens={a.alloc_external_tokens} "
                    f"(num_new_computed_tokens={a.alloc_local_tokens})"
                ),
                facts=() if a.alloc_external_tokens is None else (
                    Fact("connector-told", (a.request_id, why), a.num_external_tokens, a.alloc_external_tokens,
                         step=step.step, after="schedule"),),
            )


def check_meta_built_once(step: StepObservation) -> None:
    """Every ``schedule()`` that returns calls ``build_connector_meta``
    exactly once, empty steps included (an async load admitted in a step
    that schedules no tokens is started from that step's metadata).

    vLLM: ``Scheduler.schedule`` ends with ``meta =
    self._build_kv_connector_meta(self.connector, scheduler_output)`` whenever
    a connector is configured; ``base.py: build_connector_meta`` "Calling
    this function will reset the state of the connector"."""
    if step.error_where == "schedule":
        return
    if not step.schedule_called:
        # Async scheduling: EngineCore.step_with_batch_queue calls schedule()
        # only `if self.scheduler.has_requests():`; an engine step that just
        # feeds the queued output (`batch_queue.pop()`) builds no metadata.
        if step.connector_metas:
            _fail_step("meta-built-once", step, "build_connector_meta was called in a step without schedule()")
        return
    if len(step.connector_metas) != 1:
        _fail_step(
            "meta-built-once",
            step,
            f"schedule() returned after calling build_connector_meta {len(step.connector_metas)} times "
            f"(expected once; {sum(n for _, n in step.num_scheduled.items())} tokens scheduled)",
            facts=(Fact("connector-meta", (), False, True, after="schedule"),) if not step.connector_metas else (),
        )


def check_meta_names_scheduled(step: StepObservation) -> None:
    """The scheduler output ``build_connector_meta`` receives names (as new or
    cached requests) exactly the requests with tokens scheduled this step,
    and none the connector was already told had finished.

    vLLM: ``Scheduler.schedule`` builds ``scheduled_new_reqs`` /
    ``scheduled_cached_reqs`` from the requests it gives
    ``num_scheduled_tokens`` (a preempted one is removed from both); connectors
    look each named request up in ``num_scheduled_tokens``. ``base.py:
    request_finished`` is called "exactly once when a request has finished"."""
    for meta in step.connector_metas:
        named = meta.named
        scheduled = {r for r, _ in meta.num_scheduled}
        extra, unnamed = sorted(named - scheduled), sorted(scheduled - named)
        if extra or unnamed or meta.already_finished:
            parts = []
            if extra:
                parts.append(f"names {extra} with no tokens scheduled")
            if unnamed:
                parts.append(f"schedules tokens for {unnamed} without naming them as new or cached requests")
            if meta.already_finished:
                parts.append(f"names {list(meta.already_finished)}, already reported finished to the connector")
            _fail_step(
                "meta-names-scheduled", step, "the scheduler output handed to build_connector_meta " + "; ".join(parts),
                facts=tuple(Fact("scheduled", (r, "the output names it neither as a new nor as a cached request"),
                                 True, False, after="schedule") for r in unnamed),
            )


def check_sync_load_announced(step: StepObservation) -> None:
    """A synchronous load allocated in a step runs in that step: the request
    told to load external tokens synchronously is scheduled in the output
    ``build_connector_meta`` receives, and that output says
    ``has_sync_kv_loads``.

    vLLM: ``Scheduler.schedule``, after ``update_state_after_alloc`` for a
    non-async load, appends the request to the scheduled ones and sets
    ``has_sync_kv_loads = True`` ("load_kv_async is False here"); the worker
    loads during that step's forward pass (``base.py: start_load_kv``).
    Releases whose ``SchedulerOutput`` has no ``has_sync_kv_loads`` (0.28.0)
    are held to the first half only."""
    sync = [a for a in step.connector_allocs if a.num_external_tokens and not a.reply_async]
    if not sync or step.error_where == "schedule":
        return
    for meta in step.connector_metas:
        scheduled = {r for r, _ in meta.num_scheduled}
        for a in sync:
            flag_missing = meta.has_sync_kv_loads is False  # None: the release has no such flag
            if a.request_id not in meta.named or a.request_id not in scheduled or flag_missing:
                _fail_step(
                    "sync-load-announced",
                    step,
                    f"request {a.request_id} was told to load {a.num_external_tokens} external tokens "
                    f"synchronously, but the step's output "
                    + (
                        "does not schedule it"
                        if a.request_id not in meta.named or a.request_id not in scheduled
                        else "says has_sync_kv_loads=False"
                    ),
                    facts=(Fact("sync-loads-flag", (a.request_id, a.num_external_tokens), False, True,
                                after="schedule"),) if flag_missing else (),
                )


def check_async_load_lands_first(step: StepObservation) -> None:
    """A request computes only after its async load was reported finished:
    no request whose async load is in flight (allocated in an earlier step
    and not yet reported through ``finished_recving`` / ``failed_recving``,
    or allocated in this one) has tokens scheduled.

    vLLM: ``Scheduler.schedule`` puts an async-loading request into
    ``WAITING_FOR_REMOTE_KVS`` with ``num_new_tokens = 0``;
    ``_handle_blocked_waiting_request`` admits it again only once its id is
    in ``finished_recving_kv_req_ids`` (``_update_from_kv_xfer_finished``).
    ``base.py: get_num_new_matched_tokens``: True means the tokens "will be
    loaded asynchronously (between scheduler steps)"."""
    started = {a.request_id for a in step.connector_allocs if a.num_external_tokens and a.reply_async}
    pending = set(step.loads_in_flight) | started
    early = sorted(r for r in step.num_scheduled if r in pending)
    if early:
        _fail_step(
            "async-load-lands-first",
            step,
            f"requests {early} have tokens scheduled ("
            + ", ".join(f"{r}: {step.num_scheduled[r]}" for r in early)
            + ") while their async load is in flight ("
            + ", ".join(
                f"{r}: {'allocated this step' if r in started else 'not yet reported finished'}" for r in early
            )
            + ")",
            facts=tuple(Fact("scheduled", (r, "its async load is in flight"), True, False, after="schedule")
                        for r in early),
        )


def check_finished_once(step: StepObservation) -> None:
    """The connector hears ``request_finished`` (``_all_groups`` for an HMA
    connector) exactly once per request: each call is the first for its
    request and comes for a finished request, and no request leaves the
    scheduler without it.

    vLLM: ``Scheduler._free_request`` calls ``_connector_finished`` once,
    before the blocks are freed; ``base.py: request_finished`` /
    ``SupportsHMA.request_finished_all_groups``: "Called exactly once when a
    request has finished ... before its blocks are freed"."""
    for f in step.connector_finishes:
        if f.nth != 1 or not f.status.startswith("FINISHED"):
            _fail_step(
                "finished-once",
                step,
                f"{f.method}({f.request_id}) was called "
                + (f"again (call #{f.nth} for it)" if f.nth != 1 else f"while the request was {f.status}"),
                where="Scheduler._free_request",
                facts=(Fact("finished-calls", (f.request_id, f.method), f.nth, 1),) if f.nth != 1 else (),
            )
    untold = [r for r, told in step.left_scheduler if told == 0]
    if untold:
        _fail_step(
            "finished-once",
            step,
            f"requests {untold} left the scheduler without the connector being told they finished",
            where="Scheduler._free_request",
            facts=tuple(Fact("finished-calls", (r, "request_finished"), 0, 1) for r in untold),
        )


def check_failed_load_recomputed(step: StepObservation) -> None:
    """A load reported failed is never taken as computed: with
    ``kv_load_failure_policy="fail"`` its request ends as
    ``FINISHED_ERROR`` in the step that reported it; with ``"recompute"`` it
    stays, and its ``num_computed_tokens`` goes back to at most the first
    token of the first failed block, and, with a whole-state (Mamba) group,
    to at most the load's start: the group's only state inside the load is
    the one at its end, so no later point has a valid state.

    vLLM: ``Scheduler.update_from_output`` hands ``failed_recving`` to
    ``_handle_failed_recving`` (recompute: ``num_computed_tokens = 0``; fail:
    the request is failed) and ``invalid_block_ids`` to
    ``_handle_invalid_blocks`` / ``_update_requests_with_invalid_blocks``
    ("Truncate the computed tokens at the first failed block"; with the fail
    policy the affected requests are failed); ``KVConnectorOutput``
    (``vllm/v1/outputs.py``) documents both reports; the policy is
    ``KVTransferConfig.kv_load_failure_policy``. One violation per failed
    load, each naming its state."""
    for violation in _recomputed_violations(step):
        raise violation


def _recomputed_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    for f in step.failed_loads:
        if f.stage != "reported":
            continue
        if f.status_before.startswith("FINISHED"):
            # Aborted while the model ran the step (EngineCore applies such
            # aborts "Before processing the model output", then calls
            # update_from_output): the request is finished, and a late failure
            # report leaves it so. vLLM, _handle_failed_recving: `if request
            # is not None and request.status ==
            # RequestStatus.WAITING_FOR_REMOTE_KVS:` (nothing else is failed
            # or reset). Its blocks must still all come back (no-leaked-blocks).
            continue
        # A whole-state (Mamba) group holds one state at the load's end, none
        # inside it: past the load's start no point has a state to resume
        # from, whichever block failed.
        whole = [g for g in f.groups if _behaviour(g) is Behaviour.MAY_BE_SHORT]
        bound = f.load_start if whole else f.first_failed_token
        if f.policy == "fail" and f.status_after != "FINISHED_ERROR":
            yield _step_violation(
                "failed-load-recomputed",
                step,
                f"request {f.request_id}'s load failed under kv_load_failure_policy='fail', but the request "
                f"is {f.status_after} after the step, not FINISHED_ERROR",
                where="Scheduler.update_from_output",
                state=LOAD_FAILURE_NOT_FAILED,
                request=f.request_id,
                facts=(Fact("status", (f.request_id, "its load failed under kv_load_failure_policy='fail'"),
                            f.status_after, "FINISHED_ERROR"),),
            )
        if f.policy == "recompute" and (f.status_after == "FINISHED_ERROR" or f.computed_after > bound):
            why = (
                f"{_name(whole[0])} has no valid state past the load's start {f.load_start}"
                if whole
                else "the failed tokens must be computed again"
            )
            yield _step_violation(
                "failed-load-recomputed",
                step,
                f"request {f.request_id}'s load failed from token {f.first_failed_token} under "
                f"kv_load_failure_policy='recompute', but after the step it is {f.status_after} with "
                f"num_computed_tokens={f.computed_after} (at most {bound} expected: {why})",
                where="Scheduler.update_from_output",
                group=whole[0] if whole else None,
                state=RECOMPUTE_FAILED_REQUEST if f.status_after == "FINISHED_ERROR"
                else RESUMED_PAST_FAILED_TOKEN if f.computed_after > f.first_failed_token
                else RESUMED_INSIDE_LOAD_WITHOUT_STATE,
                request=f.request_id,
                facts=(Fact("computed-tokens", (f.request_id, f"its load failed from token {f.first_failed_token} under "
                                                "kv_load_failure_policy='recompute': " + why), f.computed_after, bound,
                            "<="),),
            )


check_failed_load_recomputed.violations = _recomputed_violations  # type: ignore[attr-defined]


# failed-load-recomputed's states (matched by known-bug signatures): the
# request kept running under "fail", was failed under "recompute", resumes
# past the first failed token (a garbage block taken as computed), or, with
# a whole-state group, resumes inside the load where that group keeps no state.
LOAD_FAILURE_NOT_FAILED = "a load failed under 'fail' that left the request unfailed"
RECOMPUTE_FAILED_REQUEST = "a load failed under 'recompute' that failed the request"
RESUMED_PAST_FAILED_TOKEN = "a recompute resuming past the first failed token"
RESUMED_INSIDE_LOAD_WITHOUT_STATE = "a recompute resuming inside the load where a whole-state group keeps no state"


def check_failed_load_not_cached(step: StepObservation) -> None:
    """The blocks a failed load was written into never stay in the prefix
    cache: after the report (and, for an async load, once the scheduler takes
    its request out of ``WAITING_FOR_REMOTE_KVS``) none of them carries a
    block hash, so no other request can adopt their garbage as a cache hit.

    vLLM: an async load's blocks are cached only when it lands
    (``allocate_slots(..., delay_cache_blocks=load_kv_async)``), and
    ``_update_waiting_for_remote_kv`` caches a failed one only up to the
    reset ``num_computed_tokens``; a failed synchronous load's blocks, cached
    at allocation, are evicted from the first invalid one on
    (``_handle_invalid_blocks``: ``kv_cache_manager.evict_blocks``). The one
    documented exception is left out: a failed synchronous load under the
    ``"recompute"`` policy keeps its blocks cached "where blocks will be
    recomputed and reused by other requests sharing them". One violation
    per failed load (a known bug's never hides another's)."""
    for violation in _not_cached_violations(step):
        raise violation


def _not_cached_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    for f in step.failed_loads:
        if f.how == "invalid_block_ids" and f.policy == "recompute":
            continue
        cached = [list(g) for g in f.cached_after if g]
        if cached:
            yield _step_violation(
                "failed-load-not-cached",
                step,
                f"request {f.request_id}'s load failed ({f.how}, kv_load_failure_policy={f.policy!r}), but "
                f"blocks {cached} it was written into still carry a prefix-cache hash "
                + ("after the report" if f.stage == "reported" else "after the request left WAITING_FOR_REMOTE_KVS"),
                where=_failed_load_where(f),
                request=f.request_id,
                # Each block the failed load was written into carries no hash after the step.
                facts=tuple(Fact("block-hash", (b, f.request_id, f.how, f.policy), True, False)
                            for g in f.cached_after for b in g),
            )


check_failed_load_not_cached.violations = _not_cached_violations  # type: ignore[attr-defined]


def _failed_load_where(f: FailedLoad) -> str:
    """The vLLM call to blame for a failed load's state: the report
    (``update_from_output``), the landing (``_update_waiting_for_remote_kv``),
    or, when an abort finished the request while the model ran the step that
    reports the failure, that abort (``finish_requests``): vLLM's
    ``_handle_invalid_blocks`` looks for the failed blocks' owners only among
    running and async-loading requests, so an aborted owner's blocks are
    neither evicted nor recomputed."""
    if f.stage != "reported":
        return "Scheduler._update_waiting_for_remote_kv"
    return "Scheduler.finish_requests" if f.status_before.startswith("FINISHED") else "Scheduler.update_from_output"


CONNECTOR_ADMISSION_CHECKS: tuple[Callable[..., None], ...] = (
    check_external_range_contiguous,
    check_load_blocks_cover_range,
    check_dropped_answer_loads_nothing,
)

CONNECTOR_STEP_CHECKS: tuple[Callable[[StepObservation], None], ...] = (
    check_told_external_accounted,
    check_meta_built_once,
    check_meta_names_scheduled,
    check_sync_load_announced,
    check_async_load_lands_first,
    check_finished_once,
    check_hand_off_names_computed_blocks,
    check_failed_load_recomputed,
    check_failed_load_not_cached,
)
