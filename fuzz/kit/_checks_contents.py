"""The claims a standalone repro states of what blocks hold
(:mod:`invariants.contents`'s), read off the watch's model of block
contents: copies read ready sources, KV matches the tokens, reads and the
prefix-cache index find what was written.

Called as ``check(scheduler, out, watch, step)`` like every kit check
(:mod:`fuzz.kit._checks_scheduler`).
"""

from __future__ import annotations

from fuzz.kit._build import _describe_groups


def _check_copy_sources_ready(scheduler, out, watch, step):
    """No copy-on-write copy of a step reads another copy's destination."""
    copies = [(c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or []]
    written = {dst for _, dst in copies}
    chained = [c for c in copies if c[0] in written]
    assert not chained, f"step {step}: copies {chained} read blocks written by copies of the same step: {copies}"


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
    step, copied there, or loaded by a load that landed. A recurrent group
    reads the state at the start, from its block (start - 1) // block_size."""
    assert not watch.unwritten_reads, (
        f"step {step}: (request, group, block, position it reads, what the block holds there: (position, "
        f"step written), -1 or -2 lost to a same-step block copy): {watch.unwritten_reads}; "
        f"groups: {_describe_groups()}"
    )


def _check_index_written(scheduler, out, watch, step):
    """What the prefix cache promises: as a step runs, every entry of the
    index names a block holding the KV of every position its key covers
    there (an async load's blocks count once it is reported landed); a
    recurrent group's block, the state at the key's end."""
    assert not watch.unbacked, (
        f"step {step}: (group, block, tokens its key covers, [(position it lacks, what it holds there: "
        f"(position, step written))]): {watch.unbacked}; groups: {_describe_groups()}"
    )
