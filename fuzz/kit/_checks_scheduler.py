"""The claims a standalone repro states of admission and the step loop
(:mod:`invariants.scheduler`'s): the local part a request resumes from, its
truncation, stale output, rejected drafts and liveness.

Each kit check restates one suite invariant on vLLM's own objects and the
watch (``fuzz.repro_scheduler._check_of`` pairs them); it is called as
``check(scheduler, out, watch, step)`` right after the step where the
invariant broke, and raises AssertionError naming the step, the request,
the group and the numbers that disagree. The other rooms of checks follow
the suite's: ``_checks_connector``, ``_checks_ownership``. A claim whose
records the watch keeps as the suite does needs no restating: the file
carries the suite's check (:data:`fuzz.kit.SUITE_CHECK_MODULES`).
"""

from __future__ import annotations

from vllm.v1.request import RequestStatus

from fuzz.kit._build import _describe_groups
from fuzz.kit._driver import _step
from fuzz.kit._params import CONNECTOR, DIVERGENT_HITS, ROLES, SCHEDULER_BLOCK_SIZE, SPECS
from fuzz.model._kv import cdiv


def _check_computed_below_num_tokens(scheduler, out, watch, step):
    """A request scheduled for the first time (or resumed) leaves at least
    one token to compute: num_computed_tokens < num_tokens."""
    cached = out.scheduled_cached_reqs
    rows = [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs]
    rows += [(r, cached.num_computed_tokens[i]) for i, r in enumerate(cached.req_ids) if r in cached.resumed_req_ids]
    for rid, computed in rows:
        num_tokens = watch.scheduled_num_tokens[rid]
        assert computed < num_tokens, (
            f"step {step}: request {rid} scheduled with num_computed_tokens={computed} >= "
            f"num_tokens={num_tokens}: nothing left to compute; groups: {_describe_groups()}"
        )


def _check_computed_tokens_add_up(scheduler, out, watch, step):
    """num_computed_tokens == local tokens handed to allocate_slots + external
    tokens the connector was told to load, and no group adopts a cached block
    past the local part: at most ceil(local / block_size) (none for scratch)."""
    for rid, adm in watch.admissions.items():
        local = adm["num_computed_tokens"] - adm["external"]
        assert adm["local"] == local, (
            f"step {step}, request {rid}: num_computed_tokens={adm['num_computed_tokens']} - external "
            f"{adm['external']} = {local} local tokens, but allocate_slots got "
            f"num_new_computed_tokens={adm['local']}"
        )
        for g, (spec, role, adopted) in enumerate(zip(SPECS, ROLES, adm["adopted"])):
            limit = 0 if role == "scratch" else cdiv(local, spec.block_size)
            assert len(adopted) <= limit, (
                f"step {step}, request {rid}: group {g} {type(spec).__name__} (block_size="
                f"{spec.block_size}) adopted {len(adopted)} cached blocks {adopted}, but the local "
                f"part is {local} tokens (num_computed_tokens={adm['num_computed_tokens']} = local "
                f"{local} + external {adm['external']}): at most ceil({local} / {spec.block_size}) "
                f"= {limit}"
            )


def _check_local_part_covered(scheduler, out, watch, step):
    """Every must-cover group holds each block of the local part the request
    resumes from: an adopted cached block, or (only for a connector that
    completes divergent hits and loads external tokens, for a group whose
    own hit lags) a real block handed to the connector."""
    null = scheduler.kv_cache_manager.block_pool.null_block.block_id
    for rid, adm in watch.admissions.items():
        local = adm["num_computed_tokens"] - adm["external"]
        completes = DIVERGENT_HITS and adm["external"] > 0
        for g, (spec, role) in enumerate(zip(SPECS, ROLES)):
            if role != "must-cover":
                continue
            adopted, table = adm["adopted"][g], adm["table"][g]
            lagging = completes and adm["per_group"][g] < local
            missing = [
                i for i in range(cdiv(local, spec.block_size))
                if not ((i < len(adopted) and adopted[i] != null) or (lagging and i < len(table) and table[i] != null))
            ]
            assert not missing, (
                f"step {step}, request {rid}: group {g} {type(spec).__name__} (block_size={spec.block_size}) "
                f"must hold the local tokens [0, {local}) it resumes from at {adm['num_computed_tokens']}, "
                f"but block indices {missing} are not held: adopted {adopted}, table {table}, "
                f"own hit {adm['per_group'][g]}"
            )


def _check_truncated_view(scheduler, out, watch, step):
    """When the connector's answer exceeds the local sub-block tail P = H % S,
    the local part is the aligned H - P and each group adopts exactly its
    lookup truncated there (whole-state groups: at most what they hold)."""
    for rid, adm in watch.admissions.items():
        hit = adm["local_hit"]
        tail = hit % SCHEDULER_BLOCK_SIZE
        answer = 0 if adm["skips"] else adm["answer"]  # vLLM drops a skipping request's answer
        if not tail or answer is None or answer <= tail:
            continue
        aligned = hit - tail
        local = adm["num_computed_tokens"] - adm["external"]
        assert local == aligned, (
            f"step {step}, request {rid}: the answer {answer} exceeds the sub-block tail {tail} of the "
            f"local hit {hit}, so the local part must be {aligned}; it is {local}"
        )
        for g, (spec, role) in enumerate(zip(SPECS, ROLES)):
            keep = aligned // spec.block_size
            looked_up = adm["lookup"][g]
            expected = [] if role == "scratch" else looked_up[: min(keep, len(looked_up))]
            assert adm["adopted"][g] == expected, (
                f"step {step}, request {rid}: group {g} {type(spec).__name__} (block_size={spec.block_size}) "
                f"adopted {adm['adopted'][g]}, not its lookup {looked_up} truncated at {aligned}: {expected}"
            )


def _check_mamba_state_at_resume_boundary(scheduler, out, watch, step):
    """With no external tokens, each whole-state (Mamba) group's adopted
    blocks end in a real state block exactly at the local boundary."""
    null = scheduler.kv_cache_manager.block_pool.null_block.block_id
    for rid, adm in watch.admissions.items():
        local = adm["num_computed_tokens"] - adm["external"]
        if adm["external"] or local == 0:
            continue
        for g, (spec, role) in enumerate(zip(SPECS, ROLES)):
            if role != "whole-state":
                continue
            adopted = adm["adopted"][g]
            idx = cdiv(local, spec.block_size) - 1
            state = adopted[idx] if idx < len(adopted) else None
            assert state is not None and state != null, (
                f"step {step}, request {rid}: it resumes at {local} with no external tokens, but group {g} "
                f"{type(spec).__name__} (block_size={spec.block_size}) has no state there: adopted "
                f"{adopted} (index {idx} is {'missing' if state is None else 'the null block'})"
            )


def _check_diverged_hit_falls_back(scheduler, out, watch, step):
    """With no external tokens, a local hit deeper than the joint hit every
    group agrees on falls back to exactly that joint hit and its blocks."""
    for rid, adm in watch.admissions.items():
        local = adm["num_computed_tokens"] - adm["external"]
        if adm["external"] or adm["local_hit"] <= adm["joint_hit"]:
            continue
        assert local == adm["joint_hit"] and adm["adopted"] == adm["joint"], (
            f"step {step}, request {rid}: the local hit {adm['local_hit']} runs deeper than the joint hit "
            f"{adm['joint_hit']} (per-group hits {adm['per_group']}) with no external tokens, so the "
            f"scheduler must fall back to {adm['joint_hit']} with blocks {adm['joint']}; it kept {local} "
            f"local tokens, blocks {adm['adopted']}; groups: {_describe_groups()}"
        )


def _check_skipping_request_reads_no_cache(scheduler, out, watch, step):
    """A request with SamplingParams(skip_reading_prefix_cache=True) reads no
    cached tokens, local or external: its lookup finds nothing, it adopts no
    cached block, the connector is told to load 0 tokens (vLLM asks it, then
    drops the answer), and it is admitted at num_computed_tokens 0."""
    for rid, adm in watch.admissions.items():
        if not adm["skips"]:
            continue
        adopted = [g for g in adm["adopted"] if g]
        assert not (adm["local_hit"] or adm["local"] or adopted or adm["alloc_external"] or adm["external"]
                    or adm["num_computed_tokens"]), (
            f"step {step}, request {rid} set skip_reading_prefix_cache=True, so it reads neither the local "
            f"prefix cache nor an external hit and computes from token 0; but its lookup hit "
            f"{adm['local_hit']} tokens, allocate_slots got {adm['local']} local tokens (adopted blocks "
            f"{adopted}) and {adm['alloc_external']} external, the connector (answer {adm['answer']}) was told "
            f"to load {adm['external']}, and it was admitted at num_computed_tokens="
            f"{adm['num_computed_tokens']} (per-group hits {adm['per_group']}); groups: {_describe_groups()}"
        )


def _check_stale_output_dropped(scheduler, out, watch, step):
    """A request preempted while a step that scheduled it was still running
    (async scheduling) gets none of that step's sampled tokens when the
    scheduler drops stale output (its connector hands KV off:
    requires_kv_delivery): the preemption freed the blocks that output's KV
    was in, and the resumed request samples those positions again."""
    if not scheduler.requires_kv_delivery:
        return
    for rid, (request, before) in watch.stale.items():
        assert request.num_tokens == before, (
            f"step {step}: request {rid}, preempted after the step whose output was fed, "
            f"went from {before} to {request.num_tokens} tokens: its stale output was appended"
        )


def _check_rejected_drafts_rolled_back(scheduler, out, watch, step):
    """A running request whose k drafts the fed output verified with a
    accepted loses exactly k - a from num_computed_tokens in
    update_from_output (the rejected positions are not computed). A share
    of the output made stale by a preemption since makes no claim."""
    for rid, (num_drafts, accepted, before) in watch.verified.items():
        req = scheduler.requests.get(rid)
        if req is None or req.status != RequestStatus.RUNNING or rid in watch.failed or rid in watch.stale:
            continue
        assert before - req.num_computed_tokens == num_drafts - accepted, (
            f"step {step}: update_from_output() verified {num_drafts} drafts of request {rid} and accepted "
            f"{accepted}, so {num_drafts - accepted} positions must leave num_computed_tokens; it went "
            f"{before} -> {req.num_computed_tokens}; groups: {_describe_groups()}"
        )


def _check_running_requests_progress(scheduler, out, watch, step):
    """Liveness: a RUNNING request is scheduled again or finishes. From this
    step on, three more steps that schedule nothing, with nothing in flight
    (no queued step output with tokens, no async load, no producer hand-off)
    and no request arriving or leaving, show that no later schedule() sees
    anything new: a request still RUNNING then is stranded."""
    for more in range(4):
        requests = set(scheduler.requests)
        transfers = False
        if CONNECTOR:
            transfers = bool(scheduler.connector.loads_in_flight or scheduler.connector.sends_in_flight)
        if (
            (out is not None and out.total_num_scheduled_tokens > 0)
            or any(queued[1].total_num_scheduled_tokens > 0 for queued in watch.queue)
            or transfers
            or not scheduler.running
        ):
            return
        if more == 3:
            break
        out = _step(scheduler, watch)
        if set(scheduler.requests) != requests:
            return
    stranded = [
        (r.request_id, r.num_computed_tokens, r.num_tokens, getattr(r, "num_output_placeholders", 0))
        for r in scheduler.running
    ]
    raise AssertionError(
        f"step {step}: it and the 3 steps after it scheduled nothing with nothing in flight, yet requests "
        f"(id, num_computed_tokens, num_tokens, num_output_placeholders) {stranded} are RUNNING: no later "
        f"schedule() picks them up"
    )
