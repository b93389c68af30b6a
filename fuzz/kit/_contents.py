"""What each block holds, kept by a standalone repro from what it drives.

The model is the suite's own BlockContents (fuzz/adapter/_contents.py),
fed as the worker sees each step: block tables and copies, the loads the
connector was told to do, the positions each request computes.
"""

from __future__ import annotations

from vllm.v1.core.kv_cache_utils import get_group_id

from fuzz.adapter._contents import BlockContents, checkpoint_params, entries_of, namespace_of, records_state
from fuzz.adapter._reports import computed_before
from fuzz.model._contents import (
    ForeignHit, UnbackedEntry, hits_across_reset_of, key_collisions_of, missing_lookahead_of, unwritten_reads_of,
)
from fuzz.kit._index import _misnamed_entries
from fuzz.kit._params import (
    CONNECTOR,
    HASH_BLOCK_SIZE,
    READ_RULES,
    ROLES,
    SPECS,
    SPECULATIVE_METHOD,
    WATCH_INDEX,
    WATCH_LOOKAHEAD,
    WATCH_NAMESPACES,
    WATCH_RESETS,
    WATCH_READS,
    WATCH_UNBACKED,
    WATCH_UNWRITTEN,
)


def _make_contents(scheduler):
    """What each block holds, per group whose blocks hold per-position KV or
    (as far as the file reads them) a recurrent state."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return BlockContents(
        [m.block_size for m in managers],
        [role in ("must-cover", "windowed") for role in ROLES],
        scheduler.kv_cache_manager.block_pool.null_block.block_id,
        [records_state(rule, spec, SPECULATIVE_METHOD is not None, scheduler.cache_config.block_size)
         for rule, spec in zip(READ_RULES, SPECS)],
        [checkpoint_params(spec, HASH_BLOCK_SIZE, getattr(scheduler.kv_cache_config, "cache_hit_alignment_tokens", None))
         for spec in SPECS],
    )


def _contents_issue(scheduler, watch, out, sampled, failing):
    """The step as the worker runs it. Before the forward pass, what it takes
    from the output: its block tables and copies, and the loads the
    connector was told to do (a sync one lands now, but into the blocks the
    worker fails; an async one when it is reported landed; a divergent
    hybrid hit's lagging group is filled from the blocks it adopted). Then
    the positions each request computes (its drafts only as far as they
    were accepted). Then, as far as the claim needs them, as the suite's
    records (fuzz.model): the tables short of the drafter's lookahead; the
    blocks adopted across namespaces or a reset; what
    each request reads below where it starts that its blocks do not hold,
    the prefix-cache entries ahead of their blocks' contents, and those
    naming blocks that hold other KV."""
    contents, tokens = watch.contents, watch.worker.tokens
    if WATCH_NAMESPACES:  # each request's namespace: cache salt, LoRA adapter, embeddings, images ("" for none)
        for rid, request in scheduler.requests.items():
            lora = request.lora_request.lora_name if request.lora_request else None
            # Two embeddings tags differ at every position: the first row names them.
            embeds = None if request.prompt_embeds is None else repr(request.prompt_embeds[0].tolist())
            items = [(f.identifier, f.mm_position.offset) for f in request.mm_features or ()]
            contents.namespaces.setdefault(rid, namespace_of(request.cache_salt, lora, embeds, items))
    contents.forget(out.finished_req_ids or ())
    contents.take_tables(out)
    if WATCH_LOOKAHEAD:
        watch.missing_lookahead = _missing_lookahead(scheduler, out, sampled, contents)
    if CONNECTOR:
        for rid, adm in watch.admitting.items():
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
                contents.load(blocks, starts, end, watch.step, tokens.get(rid, []), failed=set(failing),
                              request_id=rid)
    if WATCH_UNWRITTEN and WATCH_READS:  # the state each recurrent group's step starts from, read before it writes
        watch.unread_states = [(rid, *m) for rid, start in watch.starts.items()
                               for m in contents.unread_states(rid, start, tokens.get(rid, []))]
    for rid, new in zip(out.num_scheduled_tokens, sampled):
        if rid not in watch.starts:
            continue
        drafts = len((out.scheduled_spec_decode_tokens or {}).get(rid) or ())
        end = watch.starts[rid] + out.num_scheduled_tokens[rid] - drafts + max(len(new) - 1, 0)
        # Its KV from the tokens the worker had before this step's samples.
        known = tokens.get(rid, [])[: len(tokens.get(rid, [])) - len(new)]
        contents.write(rid, watch.starts[rid], end, watch.step, known)
    contents.settle_copies(watch.step)
    if WATCH_NAMESPACES:  # after the step's loads and forward pass: a block filled in it may be adopted in it
        watch.foreign_hits = [
            ForeignHit(rid, contents.namespaces.get(rid, ""), *hit)
            for rid, adm in watch.admitting.items()
            if adm.get("adopted") is not None
            for hit in contents.foreign_blocks(rid, adm["adopted"], adm.get("table"), adm.get("local"))
        ]
    if WATCH_RESETS:  # after the step's forward pass, as for namespaces
        watch.hits_across_reset = [
            hit
            for rid, adm in watch.admitting.items()
            if adm.get("adopted") is not None and watch.reset_before
            for hit in hits_across_reset_of(
                rid, contents.written_before(adm["adopted"], adm["local"], watch.reset_before, adm.get("table")),
                watch.reset_before,
            )
        ]
    if WATCH_UNWRITTEN and WATCH_READS:
        # (The file does not tell apart a read by the recompute after a
        # rollback or a whole-prompt load: the suite's check names such a
        # read's cause, and reports it here as a plain one.)
        watch.unwritten_reads = [
            read
            for rid, start in watch.starts.items()
            for read in unwritten_reads_of(rid, start, [
                *contents.unread(rid, start, watch.worker.prompt.get(rid, 0), READ_RULES, tokens.get(rid, []), failing),
                *(m[1:] for m in watch.unread_states if m[0] == rid),
            ], [type(spec).__name__ for spec in SPECS], other_prefix=contents.other_prefix)
        ]
    if WATCH_UNWRITTEN and WATCH_UNBACKED:
        cached = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block._cache
        watch.unbacked_entries = [
            UnbackedEntry(group, block, n, tuple(missing), contents.whole_state[group])
            for group, block, n, missing in contents.unbacked_entries(entries_of(cached, get_group_id))
        ]
    if WATCH_INDEX:  # what each key names, against what the key stands for
        watch.misnamed_entries = _misnamed_entries(scheduler, contents, watch.keys)
        watch.key_collisions, watch.keys.collisions = key_collisions_of(watch.keys.collisions), []


def _missing_lookahead(scheduler, out, sampled, contents):
    """A drafter with its own forward pass (EAGLE) writes KV
    num_lookahead_tokens positions past each step it drafts from: per
    request whose step reaches its end (the worker samples for it), each
    per-position group's table handed to the runner that covers fewer than
    min(num_computed_tokens + scheduled + lookahead, max_model_len)
    positions. A step that skips drafting (V2 runner: skip_drafts) writes none."""
    lookahead = scheduler.num_lookahead_tokens
    if not lookahead or getattr(out, "skip_drafts", False):
        return []
    before = computed_before(out)
    short = []
    for rid, new in zip(out.num_scheduled_tokens, sampled):
        tables = contents.tables.get(rid)
        if not new or rid not in before or tables is None:
            continue
        short += missing_lookahead_of(rid, tables, contents.block_sizes, contents.per_position, before[rid],
                                      out.num_scheduled_tokens[rid], lookahead, scheduler.max_model_len)
    return short
