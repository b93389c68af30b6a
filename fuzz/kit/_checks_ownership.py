"""The claims a standalone repro states of block ownership
(:mod:`invariants.ownership`'s): the blocks a step reads are held, nothing
is read before this step writes it, allocations stay within their count,
and lookups within their limit.

Called as ``check(scheduler, out, watch, step)`` like every kit check
(:mod:`fuzz.kit._checks_scheduler`). Which blocks a step reads is the
suite's own rule (``read_indices``); the reads of the step still in flight
are the suite's check itself (:mod:`fuzz.kit._ownership`).
"""

from __future__ import annotations

from fuzz.kit._build import _describe_groups
from fuzz.kit._params import NULL_BLOCK, READ_RULES, SPECS
from invariants.ownership import read_indices


def _step_reads(managers, held):
    """For each request a step scheduled (``held``: _Watch.hold's record) and
    each group: (request, group, spec, read rule, table, start, end, block
    size, the block indices the step reads)."""
    for rid, row in held.items():
        if not row["scheduled"]:
            continue
        start = row["computed_before"]
        end = start + row["scheduled"]
        for g, (spec, rule, table) in enumerate(zip(SPECS, READ_RULES, row["tables"])):
            block_size = managers[g].block_size
            wanted = read_indices(rule, block_size, start, end, row["num_prompt_tokens"], len(table))
            yield rid, g, spec, rule, table, start, end, block_size, wanted


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
    for rid, g, spec, rule, table, start, end, block_size, wanted in _step_reads(managers, watch.held):
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
    written = {bid: (rid, "a new block") for bid, rid, _ in watch.fresh}
    for rid, row in watch.held.items():
        for table in row["tables"]:
            written.update({dst: (rid, "a copy-on-write destination") for _, dst in copies if dst in table})
    for src, dst in copies:
        assert src not in written, (
            f"step {step}: the copy {src}->{dst} reads block {src}, which this step writes as "
            f"{written[src][1]} of request {written[src][0]}: the copy runs before the write; "
            f"copies {copies}; groups: {_describe_groups()}"
        )
    for rid, adm in watch.admitting.items():
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
