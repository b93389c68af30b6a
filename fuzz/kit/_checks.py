"""The claims a standalone repro states, on vLLM's own objects and the watch.

One function per claim, each named in :data:`fuzz.repro_scheduler.CHECK_OF`
beside the suite's invariant it restates; each is called as
``check(scheduler, out, watch, step)`` right after the step where the
invariant broke, and raises AssertionError naming the step, the request,
the group and the numbers that disagree.
"""

from __future__ import annotations

from vllm.v1.request import RequestStatus

from fuzz.kit._build import _cdiv, _describe_groups
from fuzz.kit._driver import _step
from fuzz.kit._params import (
    DIVERGENT_HITS,
    KV_LOAD_FAILURE_POLICY,
    NULL_BLOCK,
    READ_RULES,
    ROLES,
    SCHEDULER_BLOCK_SIZE,
    SPECS,
)
from fuzz.kit._watch import _still_cached


def _check_computed_below_num_tokens(scheduler, out, watch, step):
    """A request scheduled for the first time (or resumed) leaves at least
    one token to compute: num_computed_tokens < num_tokens."""
    cached = out.scheduled_cached_reqs
    rows = [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs]
    rows += [(r, cached.num_computed_tokens[i]) for i, r in enumerate(cached.req_ids) if r in cached.resumed_req_ids]
    for rid, computed in rows:
        num_tokens = watch.num_tokens[rid]
        assert computed < num_tokens, (
            f"step {step}: request {rid} scheduled with num_computed_tokens={computed} >= "
            f"num_tokens={num_tokens}: nothing left to compute; groups: {_describe_groups()}"
        )


def _check_copy_sources_ready(scheduler, out, watch, step):
    """No copy-on-write copy of a step reads another copy's destination."""
    copies = [(c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or []]
    written = {dst for _, dst in copies}
    chained = [c for c in copies if c[0] in written]
    assert not chained, f"step {step}: copies {chained} read blocks written by copies of the same step: {copies}"


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
            limit = 0 if role == "scratch" else _cdiv(local, spec.block_size)
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
                i for i in range(_cdiv(local, spec.block_size))
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
            idx = _cdiv(local, spec.block_size) - 1
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


def _check_external_range_contiguous(scheduler, out, watch, step):
    """A load starts where the local part ends: the local tokens kept equal
    the num_computed_tokens the connector was asked with, the external count
    equals its answer, and local + external stays within the prompt."""
    connector = scheduler.connector
    for rid, adm in watch.admissions.items():
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
    for rid, adm in watch.admissions.items():
        ext = adm["external"]
        if not ext:
            continue
        local = adm["local"]
        total = local + ext
        handed = scheduler.connector.told_blocks[rid]
        for g, (spec, role) in enumerate(zip(SPECS, ROLES)):
            b = spec.block_size
            if role == "whole-state":
                needed = [_cdiv(total, b) - 1]
            elif role == "must-cover":
                needed = list(range(local // b, _cdiv(total, b)))
            else:
                continue
            ids = handed[g]
            missing = [i for i in needed if i >= len(ids) or ids[i] == null]
            assert not missing, (
                f"step {step}, request {rid}: group {g} {type(spec).__name__} (block_size={b}): the connector "
                f"is told to load {ext} tokens after {local} local ones, so it needs block indices {needed}, "
                f"but was handed blocks {ids}: indices {missing} are missing or the null block ({null})"
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


def _check_dropped_answer_loads_nothing(scheduler, out, watch, step):
    """When the local hit ends in a sub-block tail P and the connector's
    answer does not exceed it (0 < answer <= P), the scheduler keeps the tail
    and loads nothing: update_state_after_alloc and allocate_slots both get 0
    external tokens."""
    for rid, adm in watch.admissions.items():
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


def _read_indices(rule, block_size, start, end, num_prompt_tokens, table_len):
    """Block indices a step computing tokens [start, end) reads (READ_RULES)."""
    kind, value = rule
    last = _cdiv(end, block_size)
    if kind == "full":
        return list(range(last))
    if kind == "window":  # the window of the first computed token
        return list(range(max(0, start - value + 1) // block_size, last))
    if kind == "chunk":  # the current chunk
        return list(range(start // value * value // block_size, last))
    if kind == "rswa":  # the prompt, and the last `value` tokens
        head = _cdiv(num_prompt_tokens, block_size)
        tail = max(num_prompt_tokens, start - value) // block_size
        return list(range(min(head, last))) + list(range(max(head, tail), last))
    if kind == "state":  # the state it resumes from, and the one it writes
        # With `value` speculative state blocks the worker resumes from the
        # state index it recorded the step before (plus the drafts accepted):
        # only the state it writes is claimed, the first of the table's last
        # 1 + value blocks (MambaManager.allocate_new_blocks).
        if value:
            return [table_len - 1 - value if table_len > value else last - 1]
        return sorted({last - 1} | ({_cdiv(start, block_size) - 1} if start > 0 else set()))
    return []


def _check_read_blocks_held(scheduler, out, watch, step):
    """Every block a request scheduled in this step reads is a real block of
    its table that it holds: not the null block, ref_cnt > 0, not in the free
    queue, and shared with another request only as a cached prefix block
    whose ref_cnt counts every holder."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    holders = {}
    for row in watch.held.values():
        for table in row["tables"]:
            for bid in set(table) - {NULL_BLOCK}:
                holders[bid] = holders.get(bid, 0) + 1
    for rid, row in watch.held.items():
        if not row["scheduled"]:
            continue
        start = row["computed_before"]
        end = start + row["scheduled"]
        for g, (spec, rule, table) in enumerate(zip(SPECS, READ_RULES, row["tables"])):
            block_size = managers[g].block_size
            wanted = _read_indices(rule, block_size, start, end, row["num_prompt_tokens"], len(table))
            problems = []
            for i in wanted:
                bid = table[i] if i < len(table) else None
                ref_cnt, free, cached = watch.blocks.get(bid, (0, False, False))
                if bid is None:
                    problems.append(f"index {i} is past the table's {len(table)} blocks")
                elif bid == NULL_BLOCK:
                    problems.append(f"index {i} is the null block")
                elif ref_cnt <= 0:
                    problems.append(f"block {bid} (index {i}) has ref_cnt {ref_cnt}")
                elif free:
                    problems.append(f"block {bid} (index {i}) sits in the free queue")
                elif holders[bid] > 1 and not cached:
                    problems.append(f"block {bid} (index {i}) is in {holders[bid]} block tables but is no "
                                    f"cached prefix block")
                elif holders[bid] > ref_cnt:
                    problems.append(f"block {bid} (index {i}) is in {holders[bid]} block tables but has "
                                    f"ref_cnt {ref_cnt}")
            assert not problems, (
                f"step {step}: request {rid} computes tokens [{start}, {end}) and reads block indices "
                f"{wanted} of group {g} {type(spec).__name__} (block_size={block_size}, reads {rule}), but "
                f"they are not all held by it: " + "; ".join(problems) + f" (table {table}); "
                f"groups: {_describe_groups()}"
            )


def _check_no_same_step_hazard(scheduler, out, watch, step):
    """No block written in this step (a new block, a copy-on-write
    destination) is read by another request before the write: no
    copy-on-write copy reads it (the model runner applies the copies before
    the forward pass), and no recurrent-state group adopts it as a cached
    state (a state is read at the start of the step's scan, written at its
    end)."""
    copies = [(c.src_block_id, c.dst_block_id) for c in getattr(out, "kv_cache_block_copies", None) or []]
    written = {bid: (rid, "a new block") for bid, rid in watch.fresh}
    for rid, row in watch.held.items():
        for table in row["tables"]:
            written.update({dst: (rid, "a copy-on-write destination") for _, dst in copies if dst in table})
    for src, dst in copies:
        assert src not in written, (
            f"step {step}: the copy {src}->{dst} reads block {src}, which this step writes as "
            f"{written[src][1]} of request {written[src][0]}: the copy runs before the write; "
            f"copies {copies}; groups: {_describe_groups()}"
        )
    for rid, adm in watch.admissions.items():
        for g, (spec, rule, adopted) in enumerate(zip(SPECS, READ_RULES, adm["adopted"])):
            if rule[0] != "state":
                continue
            # A state dropped again in the same allocation is never read.
            kept = set(watch.held[rid]["tables"][g]) if rid in watch.held else set()
            early = [b for b in adopted if b != NULL_BLOCK and b in kept and written.get(b, (rid,))[0] != rid]
            assert not early, (
                f"step {step}: request {rid} adopts blocks {early} of group {g} {type(spec).__name__} "
                f"(block_size={spec.block_size}) as a cached state (adopted {adopted}), but "
                + ", ".join(f"request {written[b][0]} writes block {b} as {written[b][1]}" for b in early)
                + f" in this same step: the state is read before it exists; groups: {_describe_groups()}"
            )


def _check_reservation_covers_allocation(scheduler, out, watch, step):
    """Every allocate_slots that passed its free-block check took from the
    pool, per group, no more than that group's get_num_blocks_to_allocate
    counted (a negative count covers nothing), and in all no more than the
    sum the free-block check compared with the pool (a negative sum admits
    what a zero sum admits)."""
    for a in watch.allocations:
        call = (
            f"allocate_slots({a['request']}, num_new_tokens={a['num_new_tokens']}, num_new_computed_tokens="
            f"{a['kwargs'].get('num_new_computed_tokens', 0)}, num_external_computed_tokens="
            f"{a['kwargs'].get('num_external_computed_tokens', 0)})" + (" (it raised)" if a["raised"] else "")
        )
        counted, taken = a["counted"], a["taken"]
        for g, (spec, n, took, takers) in enumerate(zip(SPECS, counted, taken, a["takers"])):
            assert took <= max(n or 0, 0), (
                f"step {step}: {call} counted {n} blocks for group {g} {type(spec).__name__} "
                f"(block_size={spec.block_size}) in get_num_blocks_to_allocate but took {took} from the pool "
                f"({', '.join(sorted(takers))}): a pool holding exactly the count runs dry; "
                f"groups: {_describe_groups()}"
            )
        # The free-block check compared this sum with the free blocks (never
        # negative): a negative sum admits no less than a zero one.
        total = sum(n or 0 for n in counted)
        assert sum(taken) <= max(total, 0), (
            f"step {step}: {call} counted {total} blocks in all (per group {counted}) but took {sum(taken)} "
            f"(per group {taken}): a negative per-group count hides blocks another group takes; "
            f"groups: {_describe_groups()}"
        )


def _check_lookup_within_limit(scheduler, out, watch, step):
    """No prefix-cache lookup of the step returns a hit, joint or per group,
    longer than the max_cache_hit_length its caller passed, and no local hit
    of an admitted request reaches the prompt's last token (num_tokens - 1)."""
    for call, limit, hits in watch.lookups:
        over = [(g, hit) for g, hit in enumerate(hits) if hit > limit]
        assert not over, (
            f"step {step}: coordinator.{call}(block_hashes, max_cache_hit_length={limit}) returned "
            + ", ".join(
                f"the joint hit {hit}" if call == "find_longest_cache_hit"
                else f"group {g} {type(SPECS[g]).__name__} (block_size={SPECS[g].block_size}) hit {hit}"
                for g, hit in over
            )
            + f", past the limit {limit}; groups: {_describe_groups()}"
        )
    for rid, hit, num_tokens in watch.local_hits:
        assert hit <= num_tokens - 1, (
            f"step {step}: request {rid}'s local prefix-cache hit is {hit} tokens of a {num_tokens}-token "
            f"prompt, past the limit num_tokens - 1 = {num_tokens - 1}; groups: {_describe_groups()}"
        )


def _check_rejected_drafts_rolled_back(scheduler, out, watch, step):
    """A running request whose k drafts the fed output verified with a
    accepted loses exactly k - a from num_computed_tokens in
    update_from_output (the rejected positions are not computed)."""
    for rid, (num_drafts, accepted, before) in watch.verified.items():
        req = scheduler.requests.get(rid)
        if req is None or req.status != RequestStatus.RUNNING or rid in watch.failed:
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
    connector = scheduler.connector
    for more in range(4):
        requests = set(scheduler.requests)
        if (
            (out is not None and out.total_num_scheduled_tokens > 0)
            or any(queued[1].total_num_scheduled_tokens > 0 for queued in watch.queue)
            or connector.loads_in_flight
            or connector.sends_in_flight
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


def _check_kv_matches_tokens(scheduler, out, watch, step):
    """What a block holds: every position the model runner computed, below a
    request's num_computed_tokens, was computed from the token vLLM records
    there (Request.all_token_ids). The runner feeds each position the token
    it has: the prompt and what it sampled (async: steps in flight too)."""
    assert not watch.kv_wrong, (
        f"step {step}: (request, position, token the model runner computed its KV from, token vLLM "
        f"records there, step that computed it): {watch.kv_wrong}; the request's later tokens are "
        f"sampled from a context that is not its sequence; groups: {_describe_groups()}"
    )


def _check_reads_written(scheduler, out, watch, step):
    """What a hit adopts: every position below a scheduled request's start
    that its step reads (by its group's span) is held, in the block the
    runner's table names, as that position's KV: computed by an earlier
    step, copied there, or loaded by a load that landed."""
    assert not watch.unwritten_reads, (
        f"step {step}: (request, group, block, position it reads, what the block holds there: (position, "
        f"step written), -1 or -2 lost to a same-step block copy): {watch.unwritten_reads}; "
        f"groups: {_describe_groups()}"
    )


def _check_index_written(scheduler, out, watch, step):
    """What the prefix cache promises: as a step runs, every entry of the
    index names a block holding the KV of every position its key covers
    there (an async load's blocks count once it is reported landed)."""
    assert not watch.unbacked, (
        f"step {step}: (group, block, tokens its key covers, [(position it lacks, what it holds there: "
        f"(position, step written))]): {watch.unbacked}; groups: {_describe_groups()}"
    )


def _check_hits_within_namespace(scheduler, out, watch, step):
    """Isolation: every block a request adopts from the prefix cache as
    computed (the local blocks handed to allocate_slots) was last written
    for a request with the same cache_salt (none is a namespace of its
    own): vLLM folds the salt into the first block's hash and chains every
    later hash on it, so no lookup may cross salts."""
    hits = [
        f"request {rid} (cache_salt {mine!r}) adopted block {block} of group {g} {type(SPECS[g]).__name__} "
        f"(block_size={SPECS[g].block_size}) as computed (adopted {watch.admissions[rid]['adopted'][g]}), last "
        f"written for a request with cache_salt {theirs!r}"
        for rid, mine, g, block, theirs in watch.foreign
    ]
    assert not hits, (
        f"step {step}: a prefix-cache hit crosses cache salts ('' for none): " + "; ".join(hits)
        + f"; a tenant is served another tenant's KV; groups: {_describe_groups()}"
    )


def _check_lookahead_allocated(scheduler, out, watch, step):
    """A drafter with its own forward pass (EAGLE) writes KV
    num_lookahead_tokens positions past each step it drafts from: for each
    request whose step reaches its end, every per-position group's table
    handed to the runner already covers min(num_computed_tokens + scheduled
    + lookahead, max_model_len) positions, or the drafter writes into
    blocks the request does not own."""
    short = [
        f"request {rid}: group {g} {type(SPECS[g]).__name__} (block_size={SPECS[g].block_size}) table covers "
        f"{covered} positions, but num_computed_tokens={computed} + {n} scheduled + lookahead "
        f"{scheduler.num_lookahead_tokens} needs {needed} (max_model_len={scheduler.max_model_len})"
        for rid, g, computed, n, needed, covered in watch.short_tables
    ]
    assert not short, (
        f"step {step}: the drafter writes past the blocks allocated: " + "; ".join(short)
        + f"; groups: {_describe_groups()}"
    )


def _check_events_replay_index(scheduler, out, watch, step):
    """After update_from_output() published the step's KV events, replaying
    every BlockStored, BlockRemoved and AllBlocksCleared so far counts,
    under each (group, key), as many blocks as the prefix-cache index files
    there: a KV-aware router never reads the block pool, only the events."""
    assert not watch.event_gaps, (
        f"step {step}: the replayed KV events disagree with the prefix-cache index at (group, key, blocks the "
        f"events announce, block ids the index files there): {watch.event_gaps}; events seen so far: "
        f"{dict(watch.events.events_seen)}; a router routes to hits that are gone, or never to hits that are "
        f"there; groups: {_describe_groups()}"
    )
