"""The claims a standalone repro states of the KV-connector protocol
(:mod:`invariants.connector`'s): what the scripted connector was asked,
told, handed and heard, and what a failed load leaves behind.

Called as ``check(scheduler, out, watch, step)`` like every kit check
(:mod:`fuzz.kit._checks_scheduler`).
"""

from __future__ import annotations

from fuzz.kit._build import _describe_groups
from fuzz.kit._params import KV_LOAD_FAILURE_POLICY, ROLES, SCHEDULER_BLOCK_SIZE, SPECS
from fuzz.kit._watch import _still_cached
from fuzz.model._kv import cdiv


def _check_external_range_contiguous(scheduler, out, watch, step):
    """A load starts where the local part ends: the local tokens kept equal
    the num_computed_tokens the connector was asked with, the external count
    equals its answer, and local + external stays within the prompt."""
    connector = scheduler.connector
    for rid, adm in watch.admitting.items():
        ext = adm["external"]
        if not ext:
            continue
        local, asked, answer = adm["local"], connector.asked_with.get(rid), connector.answers.get(rid)
        assert asked is not None and local == asked, (
            f"step {step}, request {rid}: the scheduler kept {local} local tokens but asked the connector "
            f"from {asked}: the load [{local}, {local + ext}) does not start where the answer starts"
        )
        assert answer is None or ext == answer, (
            f"step {step}, request {rid}: the connector answered {answer} tokens but was told to load {ext}"
        )
        assert local + ext <= adm["num_tokens"], (
            f"step {step}, request {rid}: the load ends at {local + ext}, past the prompt "
            f"(num_tokens={adm['num_tokens']})"
        )


def _check_load_blocks_cover_range(scheduler, out, watch, step):
    """The blocks update_state_after_alloc hands the connector hold the
    external range [local, local + external) at each group's block size (a
    whole-state group: its state block at the resume boundary)."""
    null = scheduler.kv_cache_manager.block_pool.null_block.block_id
    for rid, adm in watch.admitting.items():
        ext = adm["external"]
        if not ext:
            continue
        local = adm["local"]
        total = local + ext
        handed = scheduler.connector.told_blocks[rid]
        for g, (spec, role) in enumerate(zip(SPECS, ROLES)):
            b = spec.block_size
            if role == "whole-state":
                needed = [cdiv(total, b) - 1]
            elif role == "must-cover":
                needed = list(range(local // b, cdiv(total, b)))
            else:
                continue
            ids = handed[g]
            missing = [i for i in needed if i >= len(ids) or ids[i] == null]
            assert not missing, (
                f"step {step}, request {rid}: group {g} {type(spec).__name__} (block_size={b}): the connector "
                f"is told to load {ext} tokens after {local} local ones, so it needs block indices {needed}, "
                f"but was handed blocks {ids}: indices {missing} are missing or the null block ({null})"
            )


def _check_dropped_answer_loads_nothing(scheduler, out, watch, step):
    """When the local hit ends in a sub-block tail P and the connector's
    answer does not exceed it (0 < answer <= P), the scheduler keeps the tail
    and loads nothing: update_state_after_alloc and allocate_slots both get 0
    external tokens."""
    for rid, adm in watch.admitting.items():
        tail = adm["local_hit"] % SCHEDULER_BLOCK_SIZE
        answer = 0 if adm["skips"] else adm["answer"]  # vLLM drops a skipping request's answer
        if not (tail and answer is not None and 0 < answer <= tail):
            continue
        assert not adm["external"] and not adm.get("alloc_external"), (
            f"step {step}, request {rid}: the local hit {adm['local_hit']} ends in a sub-block tail of {tail} "
            f"tokens and the answer {answer} does not exceed it, yet update_state_after_alloc got "
            f"num_external_tokens={adm['external']} and allocate_slots num_external_computed_tokens="
            f"{adm.get('alloc_external')}"
        )


def _check_told_external_accounted(scheduler, out, watch, step):
    """update_state_after_alloc tells the connector the external count the
    request's allocate_slots call just before it accounted."""
    last_alloc = {}
    for event in scheduler.connector.events:
        if event[0] == "alloc":
            last_alloc[event[1]] = event
            continue
        _, rid, told = event
        alloc = last_alloc.get(rid)
        assert alloc is not None and alloc[3] == told, (
            f"step {step}: update_state_after_alloc told the connector to load {told} external tokens for "
            f"request {rid}, but its allocate_slots call "
            + ("was missing" if alloc is None else f"accounted num_external_computed_tokens={alloc[3]} "
               f"(num_new_computed_tokens={alloc[2]})")
        )


def _check_meta_built_once(scheduler, out, watch, step):
    """Every schedule() that returns calls build_connector_meta exactly once,
    empty steps included."""
    metas = scheduler.connector.metas
    assert len(metas) == 1, (
        f"step {step}: schedule() returned after calling build_connector_meta {len(metas)} times "
        f"(expected once; {out.total_num_scheduled_tokens} tokens scheduled)"
    )


def _check_meta_names_scheduled(scheduler, out, watch, step):
    """The output build_connector_meta receives names (as new or cached
    requests) exactly the requests with tokens scheduled, and none the
    connector was already told had finished."""
    for meta in scheduler.connector.metas:
        extra = sorted(meta["named"] - meta["scheduled"])
        unnamed = sorted(meta["scheduled"] - meta["named"])
        assert not (extra or unnamed or meta["already_finished"]), (
            f"step {step}: the output handed to build_connector_meta names {extra} with no tokens scheduled, "
            f"schedules {unnamed} without naming them, names {meta['already_finished']} already finished"
        )


def _check_sync_load_announced(scheduler, out, watch, step):
    """A request told to load external tokens synchronously is scheduled in
    the output build_connector_meta receives, and that output says
    has_sync_kv_loads."""
    connector = scheduler.connector
    sync = [r for r, ext in connector.told.items() if ext and not connector.async_answers.get(r)]
    for meta in connector.metas:
        for rid in sync:
            assert rid in meta["named"] and rid in meta["scheduled"], (
                f"step {step}: request {rid} was told to load {connector.told[rid]} external tokens "
                f"synchronously, but the step's output does not schedule it"
            )
            assert meta["has_sync_kv_loads"] is not False, (
                f"step {step}: request {rid} was told to load {connector.told[rid]} external tokens "
                f"synchronously, but the step's output says has_sync_kv_loads=False"
            )


def _check_async_load_lands_first(scheduler, out, watch, step):
    """No request whose async load is in flight (from an earlier step, not
    yet reported, or started in this one) has tokens scheduled."""
    connector = scheduler.connector
    started = {r for r, ext in connector.told.items() if ext and connector.async_answers.get(r)}
    early = sorted(r for r in out.num_scheduled_tokens if r in watch.loads_in_flight | started)
    assert not early, (
        f"step {step}: requests {early} have tokens scheduled "
        f"({ {r: out.num_scheduled_tokens[r] for r in early} }) while their async load is in flight"
    )


def _check_finished_once(scheduler, out, watch, step):
    """The connector hears request_finished exactly once per request, for a
    finished request, and no request leaves the scheduler without it."""
    connector = scheduler.connector
    for rid, nth, status in connector.finish_calls:
        assert nth == 1 and status.startswith("FINISHED"), (
            f"step {step}: request_finished({rid}) was called "
            + (f"again (call #{nth} for it)" if nth != 1 else f"while the request was {status}")
        )
    untold = sorted(r for r in watch.seen if r not in scheduler.requests and not connector.finished.get(r))
    assert not untold, f"step {step}: requests {untold} left the scheduler without request_finished"


def _check_failed_load_recomputed(scheduler, out, watch, step):
    """A load reported failed is never taken as computed: policy "fail" ends
    its request (FINISHED_ERROR); "recompute" sends it back to at most its
    first failed block, and with a whole-state (Mamba) group to at most the
    load's start (that group holds one state, at the load's end)."""
    for rid, f in watch.failed.items():
        if f["finished_before"]:  # aborted while the step ran: vLLM leaves it finished
            continue
        request = f["request"]
        status, computed = request.status.name, request.num_computed_tokens
        if KV_LOAD_FAILURE_POLICY == "fail":
            assert status == "FINISHED_ERROR", (
                f"step {step}: request {rid}'s load failed ({f['how']}) under kv_load_failure_policy='fail', "
                f"but the request is {status}; groups: {_describe_groups()}"
            )
            continue
        bound = f["start"] if "whole-state" in ROLES else f["first"]
        assert status != "FINISHED_ERROR" and computed <= bound, (
            f"step {step}: request {rid}'s load of tokens from {f['start']} failed ({f['how']}, first failed "
            f"token {f['first']}) under kv_load_failure_policy='recompute', but it is {status} with "
            f"num_computed_tokens={computed} (at most {bound} expected); groups: {_describe_groups()}"
        )


def _check_failed_load_not_cached(scheduler, out, watch, step):
    """No block a failed load was written into keeps a prefix-cache hash:
    after the report, and as a failed async load's request leaves
    WAITING_FOR_REMOTE_KVS (vLLM keeps a failed sync load's blocks cached
    under "recompute", on purpose: that case is left out)."""
    mgr = scheduler.kv_cache_manager
    for rid, f in watch.failed.items():
        if f["how"] == "invalid_block_ids" and KV_LOAD_FAILURE_POLICY == "recompute":
            continue
        cached = [g for g in _still_cached(mgr, f["blocks"]) if g]
        assert not cached, (
            f"step {step}: request {rid}'s load failed ({f['how']}, policy {KV_LOAD_FAILURE_POLICY!r}), but "
            f"blocks {cached} it was written into still carry a prefix-cache hash; groups: {_describe_groups()}"
        )
    for rid, (f, still) in watch.landed.items():
        cached = [g for g in still if g]
        assert not cached, (
            f"step {step}: request {rid}'s async load failed, but as it left WAITING_FOR_REMOTE_KVS blocks "
            f"{cached} it was written into carry a prefix-cache hash; groups: {_describe_groups()}"
        )
