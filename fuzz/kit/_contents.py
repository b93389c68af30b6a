"""What each block holds, kept by a standalone repro from what it drives.

The model is the suite's own BlockContents (fuzz/adapter/_contents.py),
fed as the worker sees each step: block tables and copies, the loads the
connector was told to do, the positions each request computes.
"""

from __future__ import annotations

from vllm.v1.core.kv_cache_utils import get_group_id

from fuzz.adapter._contents import BlockContents, entries_of
from fuzz.kit._params import READ_RULES, ROLES


def _make_contents(scheduler):
    """What each block holds, per group whose blocks hold per-position KV."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return BlockContents(
        [m.block_size for m in managers],
        [role in ("must-cover", "windowed") for role in ROLES],
        scheduler.kv_cache_manager.block_pool.null_block.block_id,
    )


def _contents_issue(scheduler, watch, out, sampled, failing):
    """The step as the worker runs it. Before the forward pass, what it takes
    from the output: its block tables and copies, and the loads the
    connector was told to do (a sync one lands now, but into the blocks the
    worker fails; an async one when it is reported landed; a divergent
    hybrid hit's lagging group is filled from the blocks it adopted). Then
    the positions each request computes (its drafts only as far as they
    were accepted); then what each reads below where it starts that its
    blocks do not hold, and the prefix-cache entries ahead of their blocks'
    contents."""
    contents, tokens = watch.contents, watch.worker.tokens
    contents.forget(out.finished_req_ids or ())
    contents.take_tables(out)
    for rid, adm in watch.admissions.items():
        if not adm.get("external"):
            continue
        start, end = adm["local"], adm["local"] + adm["external"]
        starts = [start] * len(contents.block_sizes)
        if adm.get("diverged"):
            starts = [min(start, len(a) * size) for a, size in zip(adm["adopted"], contents.block_sizes)]
        blocks = scheduler.connector.told_blocks[rid]
        if rid in scheduler.connector.loads_in_flight:
            contents.start_async_load(rid, blocks, starts, end, tokens.get(rid, []))
        else:
            contents.load(blocks, starts, end, watch.step, tokens.get(rid, []), failed=set(failing))
    for rid, new in zip(out.num_scheduled_tokens, sampled):
        if rid not in watch.starts:
            continue
        drafts = len((out.scheduled_spec_decode_tokens or {}).get(rid) or ())
        end = watch.starts[rid] + out.num_scheduled_tokens[rid] - drafts + max(len(new) - 1, 0)
        # Its KV from the tokens the worker had before this step's samples.
        known = tokens.get(rid, [])[: len(tokens.get(rid, [])) - len(new)]
        contents.write(rid, watch.starts[rid], end, watch.step, known)
    contents.settle_copies(watch.step)
    watch.unwritten_reads = [
        (rid, *missing)
        for rid, start in watch.starts.items()
        for missing in contents.unread(
            rid, start, watch.worker.prompt.get(rid, 0), READ_RULES, tokens.get(rid, []), failing
        )
    ]
    cached = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block._cache
    watch.unbacked = contents.unbacked_entries(entries_of(cached, get_group_id))
