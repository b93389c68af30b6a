"""Invariants of ``Scheduler.schedule()``'s external-hit branch.

Each ``check_*`` makes one claim about one observation (a
:class:`fuzz.model.StepObservation` and its admissions) and raises
:class:`fuzz.model.InvariantViolation` naming the request, the groups, the
block ids and the numbers that disagree.
Expected per-group behaviour comes from :mod:`fuzz.model._classification`.
Step checks (:data:`STEP_CHECKS`) see a whole ``schedule()`` +
``update_from_output()``; admission checks (:data:`ADMISSION_CHECKS`) one
waiting request's trip through the prefix-cache branch; the pool check runs
once every request has finished. ``check_step`` runs a selection of them.
The connector-protocol checks of :mod:`invariants.connector` are among the
step and admission checks, and so are the block-ownership checks of
:mod:`invariants.ownership`.

Vocabulary for one admission (a waiting request's prefix-cache lookup):

* ``H``: the local hit the scheduler's lookup returned; ``S``: the scheduler
  block (LCM of group blocks); ``P = H % S``: the sub-block ("partial") tail;
  ``A = H - P``: the block-aligned local hit the connector is asked about.
* ``E``: the connector's answer; ``ext``: the external tokens the scheduler
  finally told the connector to load; ``N``: the request's
  ``num_computed_tokens``; ``local = N - ext``: the local tokens kept.
* ``J``: the joint hit, the boundary every group agrees on
  (``get_computed_blocks``).

Block arithmetic: a prefix-cacheable group with block ``b`` covers ``local``
tokens with ``ceil(local / b)`` blocks (the last one partly, for a sub-block
hit); a Mamba group may hold fewer, as its blocks are whole recurrent states.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from fuzz.model import (
    AdmissionObservation,
    Behaviour,
    Fact,
    GroupInfo,
    Instance,
    InvariantViolation,
    PoolObservation,
    StepObservation,
    StrandedRequest,
    answer_acted_on,
    cdiv,
    first_needed_token,
    group_kind,
    group_name,
)
from invariants.cache import (
    CACHE_CHECKS,  # what the prefix cache must still serve (the harness's model)
)
from invariants.connector import CONNECTOR_ADMISSION_CHECKS, CONNECTOR_STEP_CHECKS
from invariants.contents import (  # WHERE: the vLLM call every check here judges too
    WHERE,
    chained_copies,
    check_copy_sources_ready,
    check_index_names_its_prefix,
    check_index_written,
    check_keys_name_one_prefix,
    check_kv_matches_tokens,
    check_reads_written,
)
from invariants.encoder import check_encoder_outputs_held  # the worker's encoder cache
from invariants.fate import (
    FATE_CHECKS,  # where each request is; waiting requests admitted
)
from invariants.handoff import check_hand_off_names_computed_blocks
from invariants.hits import (
    HIT_CHECKS,
    HIT_STEP_CHECKS,
    adopted_fact,
    first_difference,
    served_fact,
    state_bound,
)
from invariants.outputs import (  # the fed outputs
    check_rejected_drafts_rolled_back,
    check_stale_output_dropped,
)
from invariants.ownership import OWNERSHIP_CHECKS
from invariants.promises import PROMISE_CHECKS
from invariants.stranded import (  # noqa: F401 - the liveness claim's states, matched by known-bug signatures
    STRANDED,
    STRANDED_ENCODER_AFTER_FAILED_LOAD,
    STRANDED_PLACEHOLDERS,
    STRANDED_PLACEHOLDERS_AFTER_FAILED_LOAD,
    stranded_states,
    stranded_where,
    stranded_why,
)

__all__ = [
    "ADMISSION_CHECKS", "STEP_CHECKS", "WHERE", "chained_copies", "check_admission",
    "check_computed_below_num_tokens", "check_computed_tokens_add_up", "check_copy_sources_ready",
    "check_diverged_hit_falls_back", "check_kv_matches_tokens", "check_local_part_covered",
    "check_mamba_state_at_resume_boundary", "check_no_exception_escapes", "check_no_leaked_blocks",
    "check_rejected_drafts_rolled_back", "check_running_requests_progress", "check_skipping_request_reads_no_cache",
    "check_stale_output_dropped", "check_step", "check_truncated_view", "expects_truncation", "step_violations",
]


def _fail(invariant: str, adm: AdmissionObservation, message: str, context: str = "", group: GroupInfo | None = None,
          facts: tuple[Fact, ...] = ()) -> None:
    text = f"{message}\n{adm.describe()}"
    if context:
        text += f"\n  scenario: {context}"
    raise InvariantViolation(
        invariant, text, where=WHERE, group_kind=None if group is None else group_kind(group), facts=facts
    )


def _settled(adm: AdmissionObservation) -> bool:
    """Admitted with a known external count (the branch ran to allocation)."""
    return adm.admitted and adm.num_computed_tokens is not None and adm.connector_external_tokens is not None


def _local_kept(adm: AdmissionObservation) -> int:
    assert adm.num_computed_tokens is not None and adm.connector_external_tokens is not None
    return adm.num_computed_tokens - adm.connector_external_tokens


def expects_truncation(adm: AdmissionObservation) -> bool:
    """The external-hit branch must drop the sub-block tail: the local hit has
    one (``P > 0``) and the connector's answer, as the scheduler acts on it
    (none for a request skipping the prefix cache), strictly exceeds it."""
    answer = answer_acted_on(adm)
    return answer is not None and adm.partial_tail > 0 and answer > adm.partial_tail


# ---------------------------------------------------------------------------
# Step-level
# ---------------------------------------------------------------------------


def check_no_exception_escapes(step: StepObservation) -> None:
    """No exception escapes ``schedule()``, ``update_from_output()`` or a
    ``reset_prefix_cache()`` between them for a configuration vLLM accepted.
    The one excuse: an ``AssertionError`` in a step where the connector
    over-reported (a contract breach vLLM may refuse loudly)."""
    if step.error is None:
        return
    if step.error_type == "AssertionError" and step.dishonest_replies:
        return
    raise InvariantViolation(
        "no-exception",
        f"{step.error_where}() raised {step.error}\n{step.describe()}",
        # A reset between steps is a call of its own (the engine core's utility call).
        where="Scheduler.reset_prefix_cache" if step.error_where == "reset_prefix_cache" else WHERE,
        exception=step.error_type, frames=step.error_frames, statement=step.error_statement,
        facts=() if step.error_where != "schedule" else (Fact("raises", (step.error_type, tuple(
            a.request_id for a in step.admissions if not a.admitted)), step.error, None, "is", step.step, "schedule"),),
    )


def check_computed_below_num_tokens(step: StepObservation) -> None:
    """Every request scheduled this step for the first time (or again, after
    an async load or a preemption) leaves at least one token to compute:
    ``num_computed_tokens < num_tokens``."""
    for request_id, num_computed, num_tokens in step.newly_scheduled:
        if num_computed >= num_tokens:
            admission = next((a for a in step.admissions if a.request_id == request_id), None)
            raise InvariantViolation(
                "computed-below-num-tokens",
                f"request {request_id} was scheduled with num_computed_tokens={num_computed} "
                f">= num_tokens={num_tokens}: nothing left to compute, no logits to sample from\n"
                + (admission.describe() if admission is not None else step.describe())
                + (f"\n  scenario: {step.context}" if step.context else ""),
                where=WHERE,
                facts=(Fact("started-from", (request_id,), num_computed, num_tokens, "<", after="schedule"),),
            )


# ---------------------------------------------------------------------------
# Admission-level
# ---------------------------------------------------------------------------


def check_computed_tokens_add_up(adm: AdmissionObservation, context: str = "") -> None:
    """``num_computed_tokens == local kept + external``: the local part the
    scheduler handed to ``allocate_slots`` plus the external tokens it told
    the connector to load, and no group adopted a cached block past the
    local part (``ceil(local / b)`` at most; none for a scratch group)."""
    if not _settled(adm) or adm.alloc_local_blocks is None:
        return
    local = _local_kept(adm)
    if adm.alloc_local_tokens is not None and adm.alloc_local_tokens != local:
        _fail(
            "computed-adds-up",
            adm,
            f"num_computed_tokens={adm.num_computed_tokens} - external "
            f"{adm.connector_external_tokens} = {local} local tokens, but allocate_slots "
            f"was told num_new_computed_tokens={adm.alloc_local_tokens}",
            context,
        )
    for g, behaviour, adopted in zip(adm.groups, adm.behaviours, adm.alloc_local_blocks):
        limit = 0 if behaviour is Behaviour.SCRATCH else cdiv(local, g.block_size)
        if len(adopted) > limit:
            _fail(
                "computed-adds-up",
                adm,
                f"{group_name(g)} adopted {len(adopted)} cached blocks {list(adopted)} but the local "
                f"part is {local} tokens (num_computed_tokens={adm.num_computed_tokens} = local "
                f"{local} + external {adm.connector_external_tokens}): at most {limit} "
                f"= ceil({local} / {g.block_size}) may be adopted",
                context,
                group=g,
                facts=adopted_fact(adm, g.index, limit, f"a cached block past its {local} local tokens"),
            )


def check_local_part_covered(adm: AdmissionObservation, context: str = "") -> None:
    """Every must-cover group has real KV, or KV on its way, for each block
    the resumed request reads inside the local part (from the first token its
    attention span needs at the resume point: 0 for full attention, the
    window or chunk start otherwise). Such a block is an adopted cached
    block, or, only for a connector that declared
    ``supports_divergent_local_hybrid_hits`` and loads external tokens, a
    real block in the request's table handed to the connector to fill."""
    if not _settled(adm) or adm.alloc_local_blocks is None:
        return
    local = _local_kept(adm)
    resume = adm.num_computed_tokens or 0
    completes = adm.divergent_capable and bool(adm.connector_external_tokens)
    for g, behaviour, span, rule, adopted, table, hit in zip(
        adm.groups,
        adm.behaviours,
        adm.spans,
        adm.span_rules,
        adm.alloc_local_blocks,
        adm.block_table or [()] * len(adm.groups),
        adm.per_group_hits,
    ):
        if behaviour is not Behaviour.MUST_COVER:
            continue
        # Only a group whose own hit lags the local part can be completed by
        # the connector; the group that reached it must hold it.
        lagging = completes and hit < local
        first = first_needed_token(span, rule, resume)
        missing = []
        for i in range(first // g.block_size, cdiv(local, g.block_size)):
            cached = i < len(adopted) and adopted[i] != adm.null_block_id
            handed = lagging and i < len(table) and table[i] != adm.null_block_id
            if not (cached or handed):
                missing.append(i)
        if missing:
            _fail(
                "local-part-covered",
                adm,
                f"{group_name(g)}{'' if span is None else f' {span[0]}={span[1]}'} must hold the "
                f"local tokens [{first}, {local}) the request reads when it resumes at {resume}, "
                f"but block indices {missing} are neither adopted cached blocks {list(adopted)} "
                + (
                    f"nor real blocks handed to the divergence-completing connector (table {list(table)})"
                    if lagging
                    else f"(this group's own hit is {hit}; no connector completes it)"
                ),
                context,
                group=g,
                facts=adopted_fact(adm, g.index, missing[0], f"a fresh block in the local part [{first}, {local})"),
            )


def _truncated_view(group: GroupInfo, behaviour: Behaviour, looked_up: tuple[int, ...], aligned: int) -> tuple[int, ...]:
    """The blocks ``group`` adopts from its lookup when the local part is
    cut to ``aligned`` (must-cover: ``[:A/b]``; whole-state: at most what it
    holds; scratch: none)."""
    keep = aligned // group.block_size
    if behaviour is Behaviour.SCRATCH:
        return ()
    if behaviour is Behaviour.MAY_BE_SHORT:
        return tuple(looked_up[: min(keep, len(looked_up))])
    return tuple(looked_up[:keep])


def check_truncated_view(adm: AdmissionObservation, context: str = "") -> None:
    """When the external answer exceeds the sub-block tail, the local part is
    the block-aligned ``A = H - P``, each group's adopted blocks are exactly
    the truncated view of the lookup (must-cover: ``[:A/b]``, whole-state:
    ``[:min(A/b, len)]``, scratch: none), and no sub-block tail is adopted
    (no copy-on-write into the request's blocks)."""
    if not _settled(adm) or not expects_truncation(adm):
        return
    s = adm.scheduler_block_size
    aligned = adm.local_hit - adm.partial_tail
    local = _local_kept(adm)
    if local != aligned or local % s:
        _fail(
            "truncated-view",
            adm,
            f"external answer {adm.reply} > partial tail {adm.partial_tail}, so the local "
            f"part must be the aligned {aligned} (= {adm.local_hit} - {adm.partial_tail}); "
            f"got {local} (num_computed_tokens={adm.num_computed_tokens} - external "
            f"{adm.connector_external_tokens})",
            context,
            facts=served_fact(adm, adm.num_computed_tokens - local + aligned, "==", f"{aligned} local tokens, aligned"),
        )
    views = [_truncated_view(g, behaviour, looked_up, aligned)
             for g, behaviour, looked_up in zip(adm.groups, adm.behaviours, adm.local_blocks)]
    if adm.alloc_local_blocks is not None:
        for g, looked_up, expected, adopted in zip(adm.groups, adm.local_blocks, views, adm.alloc_local_blocks):
            if tuple(adopted) != tuple(expected):
                _fail(
                    "truncated-view",
                    adm,
                    f"{group_name(g)} adopted blocks {list(adopted)}, not the view truncated at "
                    f"{aligned} of its lookup {list(looked_up)}: expected {list(expected)}",
                    context,
                    group=g,
                    facts=adopted_fact(adm, g.index, first_difference(adopted, expected), f"outside its truncated view {list(expected)}"),
                )
    # A full cached block of the view may itself be another request's
    # copy-on-write destination this step (that request's forward fills it
    # and vLLM keys it at allocation, so a later admission of the same step
    # hits it): only a block past the view is this request's own tail copy.
    fresh = {b for group, view in zip(adm.block_table, views) for b in group[len(view):]}
    adopted_tail = sorted(fresh & adm.cow_dst_ids)
    if adopted_tail:
        _fail(
            "truncated-view",
            adm,
            f"the request's blocks {adopted_tail} are copy-on-write destinations this step: "
            f"a sub-block tail was adopted although the external answer {adm.reply} "
            f"exceeds the partial tail {adm.partial_tail}",
            context,
        )


def check_mamba_state_at_resume_boundary(adm: AdmissionObservation, context: str = "") -> None:
    """The request resumes where a valid recurrent state exists: either the
    connector supplies external tokens (and the state at their end), or each
    whole-state group's adopted blocks end in a real (non-null) state block
    exactly at the local boundary."""
    if not _settled(adm) or adm.alloc_local_blocks is None:
        return
    local = _local_kept(adm)
    if adm.connector_external_tokens or local == 0:
        return
    for g, behaviour, adopted in zip(adm.groups, adm.behaviours, adm.alloc_local_blocks):
        if behaviour is not Behaviour.MAY_BE_SHORT:
            continue
        idx = cdiv(local, g.block_size) - 1
        state = adopted[idx] if idx < len(adopted) else None
        if state is None or state == adm.null_block_id:
            _fail(
                "mamba-state-at-boundary",
                adm,
                f"the request resumes at {local} with no external tokens, but {group_name(g)} has "
                f"no state there: its adopted blocks are {list(adopted)} (index {idx} is "
                f"{'missing' if state is None else 'the null block'})",
                context,
                group=g,
                facts=served_fact(adm, state_bound(adm, g, adopted[:idx]), "<=", f"group {g.index} holds no state at {local}"),
            )


def check_diverged_hit_falls_back(adm: AdmissionObservation, context: str = "") -> None:
    """With no external tokens the local part is at most the boundary every
    group agrees on; a deeper (diverged) local hit falls back to exactly that
    joint hit and its blocks."""
    if not _settled(adm) or adm.connector_external_tokens:
        return
    local = _local_kept(adm)
    if adm.local_hit <= adm.joint_hit:
        return  # nothing diverged; the other checks cover this admission
    if local != adm.joint_hit or (
        adm.alloc_local_blocks is not None and tuple(adm.alloc_local_blocks) != tuple(adm.joint_blocks)
    ):
        _fail(
            "diverged-falls-back",
            adm,
            f"the local hit {adm.local_hit} runs deeper than the joint hit {adm.joint_hit} "
            f"(per-group hits {list(adm.per_group_hits)}) and no external tokens back it, so "
            f"the scheduler must fall back to {adm.joint_hit} with blocks "
            f"{[list(g) for g in adm.joint_blocks]}; it kept {local} local tokens",
            context,
            facts=served_fact(adm, adm.joint_hit, "==", "the joint hit, nothing backs more") if local != adm.joint_hit else (),
        )


SKIPS_CACHE = "it was built with skip_reading_prefix_cache=True: it reads no cached tokens, local or external"


def check_skipping_request_reads_no_cache(adm: AdmissionObservation, context: str = "") -> None:
    """A request built with ``SamplingParams(skip_reading_prefix_cache=True)``
    reads no cached tokens, local or external: its lookup finds nothing,
    ``allocate_slots`` adopts no cached block and gets 0 local and 0
    external tokens, the connector is told to load 0 tokens, and it is
    admitted with ``num_computed_tokens == 0`` (it computes from token 0).

    vLLM: ``KVCacheManager.get_computed_blocks`` (and
    ``get_computed_blocks_for_connector``) return no hit when
    ``prefix_cache_lookup_enabled(request)`` is false; ``Scheduler.schedule``
    still asks the connector (``get_num_new_matched_tokens``) and then
    replaces its answer: ``if request.skip_reading_prefix_cache: ext_tokens,
    load_kv_async = 0, False``. The request still writes the cache."""
    if not adm.skips_prefix_cache:
        return
    problems = []
    if adm.local_hit or any(adm.local_blocks):
        problems.append(
            f"the local lookup returned a hit of {adm.local_hit} tokens "
            f"(blocks {[list(g) for g in adm.local_blocks]})"
        )
    if adm.alloc_local_tokens or any(adm.alloc_local_blocks or ()):
        problems.append(
            f"allocate_slots got num_new_computed_tokens={adm.alloc_local_tokens} and adopted cached "
            f"blocks {[list(g) for g in adm.alloc_local_blocks or ()]}"
        )
    if adm.alloc_external_tokens or adm.connector_external_tokens:
        problems.append(
            f"the connector's answer {adm.reply} (async={adm.reply_async}) was taken: allocate_slots got "
            f"num_external_computed_tokens={adm.alloc_external_tokens}, update_state_after_alloc "
            f"num_external_tokens={adm.connector_external_tokens}"
        )
    if adm.admitted and adm.num_computed_tokens:
        problems.append(f"it was admitted with num_computed_tokens={adm.num_computed_tokens}, not 0")
    if problems:
        _fail(
            "skip-reads-no-cache",
            adm,
            f"request {adm.request_id} set SamplingParams(skip_reading_prefix_cache=True), so it reads "
            f"neither the local prefix cache nor an external hit and computes from token 0 (a side "
            f"lookup finds per-group hits {list(adm.per_group_hits)} for its prompt); but "
            + "; ".join(problems),
            context,
            # What the admitting schedule() told the connector to load, and counted computed for it: nothing.
            facts=(*[Fact("connector-told", (adm.request_id, SKIPS_CACHE), adm.connector_external_tokens, 0,
                          step=adm.step, after="schedule")] * bool(adm.connector_external_tokens),
                   Fact("hit-tokens", (adm.request_id, SKIPS_CACHE), (adm.alloc_local_tokens or 0)
                        + (adm.alloc_external_tokens or 0), 0, "<=", step=adm.step, after="schedule")),
        )


def check_running_requests_progress(step: StepObservation) -> None:
    """Liveness: a RUNNING request is scheduled again or finishes. Once
    several engine steps in a row have scheduled nothing with nothing in
    flight (no step output pending, no async load, no producer hand-off)
    and nothing arriving, every later ``schedule()`` sees the same state:
    a request still RUNNING then holds its sequence slot and its blocks
    forever, and its client never gets an answer.

    Each stranded request is an instance with its own state
    (:mod:`invariants.stranded`), one violation per vLLM call blamed: the
    async scheduler's output placeholders when a request still has some
    (``AsyncScheduler._update_after_schedule`` reserved outputs no step in
    flight will deliver, and ``schedule()`` reads them), the requests
    stranded behind it included."""
    for violation in _stranded_violations(step):
        raise violation


def _stranded_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    by_where: dict[str, list[tuple[StrandedRequest, str]]] = {}
    for r, state in zip(step.stranded, stranded_states(step.stranded)):
        by_where.setdefault(stranded_where(state, WHERE), []).append((r, state))
    for where, found in by_where.items():
        yield InvariantViolation(
            "running-request-progresses",
            "\n".join(r.describe() for r, _ in found) + f"\n{step.describe()}"
            + (f"\n  scenario: {step.context}" if step.context else ""),
            where=where, state=found[0][1], instances=tuple(Instance(s, requests=(r.request_id,)) for r, s in found),
            # The first quiet step's schedule() left it out: it saw all any later one sees.
            facts=tuple(Fact("scheduled", (r.request_id, stranded_why(r)), False, True,
                             step=step.step - r.quiet_steps + 1, after="schedule") for r, _ in found),
        )


check_running_requests_progress.violations = _stranded_violations  # type: ignore[attr-defined]


# The connector-protocol checks (invariants/connector.py) run with the others.
STEP_CHECKS: tuple[Callable[[StepObservation], None], ...] = (
    check_no_exception_escapes,
    check_computed_below_num_tokens,
    check_copy_sources_ready,
    check_stale_output_dropped,
    check_rejected_drafts_rolled_back,
    check_running_requests_progress,
    check_kv_matches_tokens,
    *CONNECTOR_STEP_CHECKS,
    # The shadow model of block ownership (invariants/ownership.py).
    *OWNERSHIP_CHECKS,
    # What the cache announces (invariants/promises.py).
    *PROMISE_CHECKS,
    check_encoder_outputs_held,
    # What the blocks hold (fuzz/adapter/_contents.py).
    check_keys_name_one_prefix,
    check_reads_written,
    check_index_written,
    check_index_names_its_prefix,
    # Where each request is (invariants/fate.py): a lost or stalled request is
    # the broadest symptom, reported after every narrower claim of the step.
    *FATE_CHECKS,
    *HIT_STEP_CHECKS,
    *CACHE_CHECKS,
)

# Reported after every other step and admission check of the step: a bug a
# narrower claim names (a wrong count, a block not held, a load not covered)
# also leaves blocks without their contents, and is reported by that claim.
CONTENTS_CHECKS: tuple[Callable[[StepObservation], None], ...] = (
    check_keys_name_one_prefix, check_reads_written, check_index_written, check_index_names_its_prefix,
)
# Missed hits after those: a violation the same step shows is reported first.
# What request_finished hands over is read off the same contents: after them.
_LAST = CONTENTS_CHECKS + (check_hand_off_names_computed_blocks,) + FATE_CHECKS + HIT_STEP_CHECKS + CACHE_CHECKS

ADMISSION_CHECKS: tuple[Callable[..., None], ...] = (
    check_computed_tokens_add_up,
    check_local_part_covered,
    check_truncated_view,
    check_mamba_state_at_resume_boundary,
    check_diverged_hit_falls_back,
    check_skipping_request_reads_no_cache,
    *CONNECTOR_ADMISSION_CHECKS, *HIT_CHECKS,
)


def check_admission(adm: AdmissionObservation, context: str = "") -> None:
    for check in ADMISSION_CHECKS:
        check(adm, context)


def step_violations(
    step: StepObservation, checks: tuple[Callable[..., None], ...] | None = None
) -> list[InvariantViolation]:
    """Every violation the selected (default: every) step and admission
    checks find in ``step``, each check run on its own: one failing claim
    never hides another."""
    selected = set(STEP_CHECKS + ADMISSION_CHECKS if checks is None else checks)
    last = set(_LAST)
    found: list[InvariantViolation] = []

    def run(check: Callable[[StepObservation], None]) -> None:
        each = getattr(check, "violations", None)  # a check that reports every violation it finds
        if each is not None:
            found.extend(each(step))
            return
        try:
            check(step)
        except InvariantViolation as v:
            found.append(v)

    for check in STEP_CHECKS:
        if check in selected and check not in last:
            run(check)
    for adm in step.admissions:
        for check in ADMISSION_CHECKS:
            if check in selected:
                try:
                    check(adm, step.context)
                except InvariantViolation as v:
                    found.append(v)
    for check in _LAST:
        if check in selected:
            run(check)
    return found


def check_step(step: StepObservation, checks: tuple[Callable[..., None], ...] | None = None) -> None:
    """The selected (default: every) step checks on the step, then the
    selected admission checks on each of its admissions; raises the first
    violation."""
    for violation in step_violations(step, checks):
        raise violation


# ---------------------------------------------------------------------------
# Pool-level
# ---------------------------------------------------------------------------


def check_no_leaked_blocks(pool: PoolObservation) -> None:
    """Once every request has finished and been freed, every block except the
    null block is free again and no block keeps a reference."""
    if pool.live_requests:
        return
    if pool.num_free != pool.num_blocks - 1 or pool.referenced:
        raise InvariantViolation(
            "no-leaked-blocks",
            f"after every request finished: {pool.num_free} free blocks, expected "
            f"{pool.num_blocks - 1} (num_blocks - 1 for the null block); blocks still "
            f"referenced (block_id, ref_cnt): {list(pool.referenced)[:20]}"
            + (f"\n  scenario: {pool.context}" if pool.context else ""),
            where="KVCacheManager.free",
            facts=(*((Fact("free-blocks", (), pool.num_free, pool.num_blocks - 1),) if pool.num_free != pool.num_blocks - 1
                     else ()), *(Fact("ref-cnt", (block,), ref, 0) for block, ref in pool.referenced[:2])),
        )
