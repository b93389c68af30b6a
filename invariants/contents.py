"""What the blocks hold: claims on the model of block contents the
harness keeps from what a worker sees (``fuzz/adapter/_contents.py``).

Reported after every other step and admission check of the step
(:data:`invariants.scheduler.CONTENTS_CHECKS`): a bug a narrower claim
names (a wrong count, a block not held, a load not covered) also leaves
blocks without their contents, and is reported by that claim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fuzz.model import Fact, Instance, InvariantViolation, OwnershipObservation, StepObservation, group_kind

__all__ = [
    "COPY_OF_OTHER_REQUESTS_COPY",
    "COPY_OF_OWN_COPY",
    "LOST_TO_COPY_BEFORE_FILL",
    "LOST_TO_COPY_OF_COPY",
    "MAMBA_EARLIER_STATE",
    "MISNAMED_AFTER_FAILED_LOAD",
    "KEY_NAMES_TWO_PREFIXES",
    "MISNAMED_ENTRY",
    "OTHER_TOKENS",
    "OTHER_TOKENS_AFTER_FAILED_LOAD",
    "READ_OTHER_PREFIX",
    "READ_OTHER_TOKENS_AFTER_FAILED_LOAD",
    "UNBACKED_ENTRY",
    "UNWRITTEN_READ",
    "UNWRITTEN_READ_AFTER_ROLLBACK",
    "UNWRITTEN_READ_AFTER_ROLLBACK_IN_FLIGHT",
    "UNWRITTEN_READ_AFTER_WHOLE_LOAD",
    "chained_copies",
    "check_copy_sources_ready",
    "check_index_names_its_prefix",
    "check_index_written",
    "check_keys_name_one_prefix",
    "check_kv_matches_tokens",
    "check_reads_written",
]

# The vLLM call every check here judges, but where a state names another.
WHERE = "Scheduler.schedule"
# Where the async scheduler reserves the output placeholders.
_PLACEHOLDERS = "AsyncScheduler._update_after_schedule"


def chained_copies(step: StepObservation) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Pairs (copy A, copy B) of the step where B reads what A writes."""
    writers = {dst: (src, dst) for src, dst in step.copies}
    return [(writers[src], (src, dst)) for src, dst in step.copies if src in writers]


def check_copy_sources_ready(step: StepObservation) -> None:
    """Every copy-on-write block copy of a step reads a block whose contents
    exist before the step: no copy's source is the destination of another
    copy in the same step. The copies run together before the step's forward
    pass; a request whose copy reads another copy's destination starts from
    whatever that block held before (stale or zeroed KV / state)."""
    chains = chained_copies(step)
    if not chains:
        return
    text = "; ".join(f"copy {b[0]}->{b[1]} reads block {b[0]}, which copy {a[0]}->{a[1]} writes in the same step" for a, b in chains)
    instances = tuple(_chain_instance(step, a, b) for a, b in chains)
    raise InvariantViolation(
        "copy-source-ready",
        f"{text}\n{step.describe()}" + (f"\n  scenario: {step.context}" if step.context else ""),
        where=WHERE,
        group_kind=instances[0].group_kind,
        state=instances[0].state,
        instances=instances,
    )


def _holder(step: StepObservation, block: int) -> tuple[str, Any]:
    """(request, group) whose table holds ``block`` after schedule() (``"?"``
    and None where the step has no ownership record of it)."""
    own = step.ownership
    for t in () if own is None else own.tables:
        for g, table in zip(own.groups, t.tables):
            if block in table:
                return t.request_id, g
    return "?", None


def _chain_instance(step: StepObservation, first: tuple[int, int], second: tuple[int, int]) -> Instance:
    """One chain: the second copy's request and group, the first copy's request."""
    reader, g = _holder(step, second[1])
    writer, _ = _holder(step, first[1])
    state = COPY_OF_OWN_COPY if reader == writer != "?" else COPY_OF_OTHER_REQUESTS_COPY
    return Instance(state, None if g is None else group_kind(g), None if g is None else g.index,
                    (reader, writer), (first[0], first[1], second[1]))


# copy-source-ready's states: whose same-step copy destination a copy reads.
COPY_OF_OTHER_REQUESTS_COPY = "a copy reads another request's same-step copy destination"
COPY_OF_OWN_COPY = "a copy reads its own request's same-step copy destination"


def check_kv_matches_tokens(step: StepObservation) -> None:
    """What a block holds: every position of a request's KV that the model
    runner computed was computed from the token vLLM records at that
    position (``Request.all_token_ids``). The runner feeds each scheduled
    position the token it has there (the prompt, and the tokens it sampled:
    under async scheduling those of steps still in flight too); when vLLM's
    token list and the runner's disagree, the request's later tokens are
    sampled from a context that is not its sequence, and a block hashed
    from vLLM's tokens holds KV of others.

    Blamed on the async scheduler's output placeholders when the request
    had a failed synchronous load rolled back under the recompute policy:
    ``Scheduler._update_requests_with_invalid_blocks`` resets
    ``num_computed_tokens`` but leaves the placeholders the failed step
    reserved, and vLLM sends them to the runner in ``num_output_tokens``,
    so the runner keeps the token vLLM discarded."""
    for violation in _kv_violations(step):
        raise violation


def _kv_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    """One violation per cause, one instance per request and position."""
    return _by_cause("kv-matches-tokens", step, step.kv_from_other_tokens,
                     lambda w: (OTHER_TOKENS_AFTER_FAILED_LOAD, _PLACEHOLDERS) if w.recomputed_failed_load
                     else (OTHER_TOKENS, WHERE),
                     # The token the runner computed the position from (the worker's record).
                     fact=lambda w: Fact("recorded-token", (w.request_id, w.position, w.written_at), w.recorded,
                                         w.computed_from))


check_kv_matches_tokens.violations = _kv_violations  # type: ignore[attr-defined]


def check_reads_written(step: StepObservation) -> None:
    """What a hit adopts: every position below a scheduled request's start
    that its step reads (all of them under full attention, the window or
    chunk under sliding-window or chunked attention, the prompt and the
    window under R-SWA) is held, in the block the runner's table names for
    it, as KV of that position computed under the reader's whole prefix
    (every token before it and its own, and the namespace vLLM hashes beside
    them: cache salt, LoRA, prompt embeddings, the images placed so far):
    computed by an earlier step, copied there,
    loaded by a synchronous load that did not fail, or by an async load
    reported landed (fuzz/adapter/_contents.py). A position it lacks is
    read as whatever the block holds: a local or external hit adopted a
    block that was never filled, or whose load is still in flight.

    One violation per cause (:func:`_read_cause`): a step showing two known
    bugs at once is two known bugs, and one showing a known bug beside an
    unexplained read still reports the unexplained one."""
    for violation in _reads_violations(step):
        raise violation


def _read_cause(step: StepObservation, read: Any) -> tuple[str, str]:
    """(state, where) of one unwritten read."""
    state, where = _contents_blame((read,), UNWRITTEN_READ)
    if state != UNWRITTEN_READ:
        return state, where
    # The request's recompute after a whole-prompt async load landed, or
    # after a failed synchronous load rolled it back (the ownership model
    # blames the same two places for what the request reads).
    if read.after_whole_prompt_load:
        return UNWRITTEN_READ_AFTER_WHOLE_LOAD, "Scheduler._update_waiting_for_remote_kv"
    if read.request_id in step.rolled_back_in_flight:
        # ... rolled back past the load's end, over a step in flight (async).
        return UNWRITTEN_READ_AFTER_ROLLBACK_IN_FLIGHT, "Scheduler._update_requests_with_invalid_blocks"
    if read.request_id in step.rolled_back:
        return UNWRITTEN_READ_AFTER_ROLLBACK, "Scheduler._update_requests_with_invalid_blocks"
    # KV computed from the token the runner kept after a failed-load
    # recompute (the output placeholder kv-matches-tokens blames), read later.
    if read.recomputed_failed_load and read.other_tokens_only:
        return READ_OTHER_TOKENS_AFTER_FAILED_LOAD, _PLACEHOLDERS
    # A Mamba state from before the boundary the request resumes at: a
    # prefill chunk ran past that boundary and left the block behind.
    if read.earlier_state:
        return MAMBA_EARLIER_STATE, _MAMBA_SPLIT
    # The same tokens at the same positions, computed under another prefix
    # or namespace: a hit whose key does not name the whole prefix.
    if read.other_prefix:
        return READ_OTHER_PREFIX, where
    return state, where


def _by_cause(invariant: str, step: StepObservation, found: Sequence[Any],
              cause: Callable[[Any], tuple[str, str]], kinds: bool = False,
              fact: Callable[[Any], Fact | None] | None = None) -> Iterator[InvariantViolation]:
    """One ``invariant`` violation per (state, where) that ``cause`` gives
    ``found``, in the order the causes first appear, with one instance per
    finding (its request, group and block); with ``kinds``, naming the group
    kind its findings share."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for f in found:
        groups.setdefault(cause(f), []).append(f)
    for (state, where), items in groups.items():
        instances = tuple(_instance(step, state, f) for f in items)
        yield InvariantViolation(
            invariant,
            "\n".join(f.describe() for f in items)
            + f"\n{step.describe()}"
            + (f"\n  scenario: {step.context}" if step.context else ""),
            where=where,
            state=state,
            group_kind=_shared_kind(instances) if kinds else None,
            instances=instances,
            facts=() if fact is None else tuple(f for f in map(fact, items) if f is not None),
        )


def _instance(step: StepObservation, state: str, found: Any) -> Instance:
    """A finding as an instance: its request, group (and the group's kind,
    from the step's ownership record where the finding does not name it)
    and block."""
    group = getattr(found, "group", None)
    kind = getattr(found, "group_kind", None)
    if kind is None and group is not None and step.ownership is not None and group < len(step.ownership.groups):
        kind = group_kind(step.ownership.groups[group])
    request = getattr(found, "request_id", None)
    block = getattr(found, "block_id", None)
    return Instance(state, kind, group, () if request is None else (request,), () if block is None else (block,))


def _shared_kind(found: Sequence[Instance]) -> str | None:
    """The group kind every one of ``found`` names (None: they differ)."""
    kinds = {f.group_kind for f in found}
    return kinds.pop() if len(kinds) == 1 else None


def _reads_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    return _by_cause("reads-written", step, step.unwritten_reads, lambda r: _read_cause(step, r), kinds=True,
                     fact=lambda r: _read_fact(step, r))


def _read_fact(step: StepObservation, read: Any) -> Fact | None:
    """The block the request's table names where the step reads what it
    does not hold: right after its ``schedule()``, another block must be there."""
    own = step.ownership
    if own is None or read.group >= len(own.groups) or not read.missing:
        return None
    writer = _sharing_writer(step, own, read)
    if writer is not None:  # the block is fine where the reader has it: the writer's copy is missing
        return writer
    index = read.missing[0][0] // own.groups[read.group].block_size
    held = own.table_of(read.request_id)
    if held is not None and read.block_id in held.tables[read.group]:  # a state group's block: where it sits
        index = list(held.tables[read.group]).index(read.block_id)
    return Fact("table-block", (read.request_id, read.group, index, read.start, tuple(p for p, _ in read.missing)),
                read.block_id, read.block_id, "!=", after="schedule")


def _sharing_writer(step: StepObservation, own: OwnershipObservation, read: Any) -> Fact | None:
    """Where this step's write over what the reader reads comes from a
    request that adopted the reader's block as (part of) its hit and writes
    into it, the block at that place of the writer's table: it must be the
    writer's own copy (a partial hit is copied on write)."""
    size = own.groups[read.group].block_size
    written = [p for p, held in read.missing if held is not None and held[1] == step.step]
    for t in own.tables if written else ():
        table = t.tables[read.group] if read.group < len(t.tables) else ()
        if t.request_id == read.request_id or read.block_id not in table:
            continue
        index = list(table).index(read.block_id)
        end = t.computed_before + t.num_scheduled
        if index * size < t.computed_before and all(t.computed_before <= p < end for p in written):
            return Fact("table-block", (t.request_id, read.group, index, t.computed_before, tuple(
                range(index * size, t.computed_before)), f"{read.request_id}'s block, into which {t.request_id} "
                f"writes positions {written} while {read.request_id} reads them"), read.block_id, read.block_id, "!=",
                after="schedule")
    return None


check_reads_written.violations = _reads_violations  # type: ignore[attr-defined]


def check_index_written(step: StepObservation) -> None:
    """What the prefix cache promises: after every step, each entry of the
    prefix-cache index (a full block, or a partial entry for a prefix inside
    one) names a block that holds the KV of every position its key covers
    in that block. vLLM registers a block in the schedule() of the step
    that fills it (that step runs before any later reader on the device);
    an async load fills its blocks only when the worker reports it landed,
    and a failed load fills nothing. An entry ahead of its contents serves
    the next hit garbage. One violation per cause, as for reads-written."""
    for violation in _entries_violations(step):
        raise violation


def _entry_cause(entry: Any) -> tuple[str, str]:
    state, where = _contents_blame((entry,), UNBACKED_ENTRY)
    if state == UNBACKED_ENTRY and entry.earlier_state:
        return MAMBA_EARLIER_STATE, _MAMBA_SPLIT
    return state, where


def _entries_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    return _by_cause("index-written", step, step.unbacked_entries, _entry_cause, kinds=True, fact=_unbacked_fact)


def _unbacked_fact(entry: Any) -> Fact | None:
    """The blocks the index files under the entry's key after the step:
    not the block the harness saw lacking what the key covers."""
    if not entry.request_id:
        return None
    why = (f"block {entry.block_id} does not hold the KV of positions {[p for p, _ in entry.missing]}"
           + (" (a Mamba block: it must hold the state at the key's end)" if entry.whole_state else ""))
    return Fact("cached-blocks", (entry.request_id, entry.num_tokens, entry.group, why), (entry.block_id,),
                (entry.block_id,), "!=")


check_index_written.violations = _entries_violations  # type: ignore[attr-defined]


def check_index_names_its_prefix(step: StepObservation) -> None:
    """The index mirrored: after every step, each entry of the prefix-cache
    index (full or partial, a block's own key or one it carries beside it)
    names a block whose contents, at every position its key covers inside
    the block that the block holds anything at, are the KV of exactly the
    key's prefix: that position, computed from the token the key hashed
    there under the tokens and namespace before it. A key is a hash over a request's tokens; what it stands for is
    learnt from the requests that carried it, never from the cache. A
    block that is freed and reused, evicted or overwritten must leave no
    key of its old prefix behind: the next lookup of that prefix adopts the
    new owner's KV."""
    for violation in _misnamed_violations(step):
        raise violation


def _misnamed_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    """One violation per cause: an entry keyed for a request a failed sync
    load rolled back (recompute) is blamed on the async scheduler's kept
    output placeholder (a known bug), which made the runner compute a
    position from the token vLLM then discarded."""
    return _by_cause("index-names-its-prefix", step, step.misnamed_entries,
                     lambda e: (MISNAMED_AFTER_FAILED_LOAD, _PLACEHOLDERS) if e.recomputed_failed_load
                     else (MISNAMED_ENTRY, "BlockPool"), kinds=True, fact=_misnamed_fact)


def _misnamed_fact(entry: Any) -> Fact:
    """The blocks the index files under the entry's key after the step:
    not the block the harness saw written with other KV there."""
    position, token, (held, written, computed_from) = entry.wrong[0]
    why = (f"position {position} of block {entry.block_id} holds the KV computed at step {written} from token "
           f"{computed_from} at position {held}, not from {entry.request_id}'s token {token}")
    return Fact("cached-blocks", (entry.request_id, entry.num_tokens, entry.group, why), (entry.block_id,),
                (entry.block_id,), "!=")


check_index_names_its_prefix.violations = _misnamed_violations  # type: ignore[attr-defined]


def check_keys_name_one_prefix(step: StepObservation) -> None:
    """A prefix-cache key names one prefix: no two requests carry one key
    (the hash vLLM's request hasher gives a request at a hash-block
    boundary) over different tokens up to there, or under different
    namespaces as far as they go (cache salt, LoRA adapter, prompt
    embeddings, the images placed before the boundary). Judged on what the
    harness gave each request, never on the index: a key naming two
    prefixes serves one's KV to the other whenever a lookup meets it,
    whatever layout looks it up."""
    if not step.key_collisions:
        return
    raise InvariantViolation(
        "keys-name-one-prefix",
        "\n".join(c.describe() for c in step.key_collisions)
        + f"\n{step.describe()}"
        + (f"\n  scenario: {step.context}" if step.context else ""),
        where=_HASHER,
        state=KEY_NAMES_TWO_PREFIXES,
        # One instance per key carried over two prefixes: the two requests (a
        # request's key is the hasher's, no group's).
        instances=tuple(Instance(KEY_NAMES_TWO_PREFIXES, requests=(c.first_request, c.request))
                        for c in step.key_collisions),
        # The request hasher's keys for the two prefixes: they must differ.
        facts=tuple(Fact("same-key", (c.first_request, c.num_tokens, c.request, c.other_tokens), True, False)
                    for c in step.key_collisions),
    )


KEY_NAMES_TWO_PREFIXES = "a prefix-cache key carried over two prefixes"
_HASHER = "request_block_hasher"


# What a block lacks (matched by known-bug signatures): plain, or every
# missing position lost to a copy-on-write copy made before the step filled
# its source (blamed on the partial-hit copy-on-write).
UNWRITTEN_READ = "a read of a position its block does not hold"
READ_OTHER_PREFIX = "a read of KV computed under another prefix"
UNBACKED_ENTRY = "a prefix-cache entry ahead of its block's contents"
MISNAMED_ENTRY = "a prefix-cache key naming a block that holds other KV"
MISNAMED_AFTER_FAILED_LOAD = "a prefix-cache key naming KV from other tokens after a failed-load recompute"
UNWRITTEN_READ_AFTER_WHOLE_LOAD = "a read by the last-token recompute after a whole-prompt async load"
UNWRITTEN_READ_AFTER_ROLLBACK = "a read by the recompute after a failed-load rollback"
UNWRITTEN_READ_AFTER_ROLLBACK_IN_FLIGHT = "a read by the recompute after a rollback over a step in flight"
READ_OTHER_TOKENS_AFTER_FAILED_LOAD = "a read of KV from other tokens after a failed-load recompute"
# A Mamba block holding the state of an earlier position than its key's end
# or its reader's start (blamed on the split that sets where states land).
MAMBA_EARLIER_STATE = "a Mamba state from before its boundary"
_MAMBA_SPLIT = "Scheduler._mamba_block_aligned_split"
LOST_TO_COPY_BEFORE_FILL = "lost to a same-step copy made before its source was filled"
LOST_TO_COPY_OF_COPY = "lost to a same-step copy of another copy's destination"
_COPY_ON_WRITE = "SingleTypeKVCacheManager._apply_cow"


def _contents_blame(found: tuple[Any, ...], plain: str) -> tuple[str, str]:
    """(state, where) of a contents failure: ``plain`` at the scheduler
    unless every one was lost to a same-step copy."""
    causes = {f.copy_cause for f in found}
    if "" in causes:
        return plain, WHERE
    if "copy of a copy" in causes:
        return LOST_TO_COPY_OF_COPY, _COPY_ON_WRITE
    return LOST_TO_COPY_BEFORE_FILL, _COPY_ON_WRITE


# Whose KV disagrees with vLLM's tokens (matched by known-bug signatures).
OTHER_TOKENS_AFTER_FAILED_LOAD = "KV from other tokens after a failed-load recompute"
OTHER_TOKENS = "KV from other tokens"
