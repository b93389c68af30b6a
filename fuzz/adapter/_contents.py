"""What each KV-cache block holds, as the model runner and its connector's
worker wrote it.

The record is kept from what a worker sees, never from vLLM's bookkeeping:
the block tables the ``SchedulerOutput`` hands the runner (a new request's
``block_ids``, a cached one's ``new_block_ids`` appended, a resumed one's
replacing its table), the block copies it is told to make before the step
(``kv_cache_block_copies``), the positions each step computes, the drafts
the rejection sampler accepted, and the external loads the connector was
told to do (``update_state_after_alloc``: a synchronous one lands in the
step that admitted it unless the worker fails its blocks; an async one when
the worker reports it landed).

For each block of a group whose blocks hold per-position KV (attention of
any span), :class:`BlockContents` keeps, per offset, the request position
whose KV was written there, the step that wrote it, and the token it was
computed from (None where the worker cannot name it: an accepted draft's). A block's contents
outlive its owner: a freed block that stays in the prefix cache holds what
was last written into it. Scratch groups are not recorded here.

For a recurrent-state (Mamba, align mode) group, each block holds at most
one state: the position it is the state at, the step that wrote it, and
the tokens it was computed from. A step computing positions [start, end)
writes the state at ``end`` into the table's block ``cdiv(end, size) - 1``
(the runner's ``preprocess_mamba`` copies the running state there first),
and reads the state at ``start`` from block ``(start - 1) // size``; a
load up to ``end`` writes the state at ``end`` where a step would. A
prefill checkpoint is written where the worker puts it (see
:func:`prefill_checkpoint`); speculative state blocks are not modelled: a
group that has them is not recorded.

Each block also keeps the namespace of the request that last wrote it: what
vLLM folds into a block's hash besides the tokens (its cache salt, LoRA
adapter, prompt embeddings, and the multimodal items placed before the
block's end), so that a hit can be held to the namespace it was cached under.

A block counts as written once the step that computes it has been handed
to the runner: vLLM registers a block in its prefix cache in the
``schedule()`` of the step that fills it, and a later step that reads it
runs after it on the device. An async load has no such order: only its
reported landing writes its positions.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fuzz.adapter._clean_reads import CleanReads, read_runs
from fuzz.adapter._reports import take_handed_tables
from fuzz.adapter._identity import PrefixIdentities, lora_identity, namespace_of, namespace_within, prompt_embedding_rows

__all__ = [
    "COPIED_BEFORE_FILL", "COPIED_FROM_COPY", "FAILED_LOAD", "BlockContents", "KeyPrefixes", "all_entries_of",
    "checkpoint_params",
    "entries_of", "lora_identity", "namespace_of", "namespace_within", "prefill_checkpoint", "prompt_embedding_rows", "read_positions",
    "records_state",
]

# What a block copy's destination holds where its source was filled only
# later in the same step (the runner copies before the step's loads and
# forward pass, all copies from the contents before the step): the
# "position" recorded at that offset, beside the step.
COPIED_BEFORE_FILL = -1  # the source was filled by the step's load or forward pass
COPIED_FROM_COPY = -2  # the source was itself another copy's destination in the step
# What a block holds where the connector's worker failed to load into it.
FAILED_LOAD = -3


def _prefix(tokens: Sequence[int], n: int) -> tuple[int, ...] | None:
    """The first ``n`` of ``tokens`` (what a state at ``n`` was computed
    from), or None where they are not all known."""
    return tuple(tokens[:n]) if len(tokens) >= n else None


def records_state(rule: tuple[str, int], spec: Any, speculating: bool, cache_block_size: int) -> bool:
    """Whether a group of read ``rule`` and ``spec`` gets its states
    recorded: a recurrent-state group in align mode, in a configuration
    that does not speculate, without speculative state blocks (the runner
    moves states through them in ways this model does not follow), whose
    block is ``cache_config.block_size``
    (``cache_block_size``). The engine makes it so in align mode
    (``mamba_block_size = cache_config.block_size``), and the scheduler
    cuts prefill chunks at multiples of ``cache_config.block_size`` for the
    states to land on block ends: a layout that breaks that is not one an
    engine builds."""
    return (
        rule[0] == "state" and not speculating and getattr(spec, "mamba_cache_mode", "align") == "align"
        and not getattr(spec, "num_speculative_blocks", 0) and getattr(spec, "block_size", None) == cache_block_size
    )


def checkpoint_params(spec: Any, hash_block_size: int, hit_alignment: int | None) -> tuple[int, int, int] | None:
    """A Mamba group's prefill checkpoint settings, as the worker reads them
    (its checkpoint alignment, the hash block size, the cache-hit
    alignment), or None where its spec exports no checkpoint."""
    alignment = getattr(spec, "prefill_checkpoint_alignment", None)
    if not getattr(spec, "num_prefill_checkpoint_blocks", 0) or alignment is None:
        return None
    return alignment, hash_block_size, hit_alignment or hash_block_size


def prefill_checkpoint(start: int, end: int, size: int, alignment: int, hash_block_size: int,
                       hit_alignment: int) -> tuple[int, int] | None:
    """Where a Mamba group with prefill checkpoint blocks (checkpoint
    ``alignment``) also writes a state inside a prefill chunk [start, end),
    as vLLM's worker decides it (``compute_mamba_prefill_checkpoints``,
    no EAGLE block drop, no hash lookahead): the last ``hit_alignment``
    boundary that leaves at least one token to compute, if the chunk starts
    on a hash boundary, the boundary is at least a hash block past the start
    and strictly inside the chunk, a whole number of alignments from the
    start, and its table column is past the one the chunk starts from. As
    (the position the state is at, the table column it lands in), or None."""
    position = max((end - 1) // hit_alignment * hit_alignment, 0)
    column = -(-end // size) - 2
    if (
        start % hash_block_size == 0 and column > (start - 1) // size and start + hash_block_size <= position
        and start < position < end and (position - start) % alignment == 0
    ):
        return position, column
    return None


def read_positions(rule: tuple[str, int], start: int, prompt: int) -> range | list[int]:
    """:func:`fuzz.adapter._clean_reads.read_runs`, as one range or list."""
    runs = read_runs(rule, start, prompt)
    return runs[0] if len(runs) == 1 else [p for run in runs for p in run]


class BlockContents:
    """Per block, per offset: (the position whose KV is there, the step that
    wrote it, the token it was computed from), for the groups in
    ``per_position`` (their block sizes in ``block_sizes``)."""

    def __init__(self, block_sizes: Sequence[int], per_position: Sequence[bool], null_block_id: int,
                 whole_state: Sequence[bool] = (), checkpoints: Sequence[tuple[int, int, int] | None] = ()) -> None:
        self.block_sizes = tuple(block_sizes)
        self.per_position = tuple(per_position)
        self.whole_state = tuple(whole_state) or (False,) * len(self.block_sizes)
        # Per state group with prefill checkpoint blocks: (checkpoint
        # alignment, hash block size, cache-hit alignment); None without.
        self.checkpoints = tuple(checkpoints) or (None,) * len(self.block_sizes)
        self.null_block_id = null_block_id
        # Block id -> (the position it holds the state at, the step that
        # wrote it, the tokens before that position or None), for the
        # groups in ``whole_state``.
        self.states: dict[int, tuple[int, int, tuple[int, ...] | None]] = {}
        # Request id -> per group, the block table the runner holds.
        self.tables: dict[str, list[list[int]]] = {}
        # Block id -> offset -> (position, step, token or None).
        self.held: dict[int, dict[int, tuple[int, int, int | None]]] = {}
        # Request id -> (per-group block ids, per-group first position, end,
        # the request's tokens) of an async load in flight.
        self.loading: dict[str, tuple[tuple[tuple[int, ...], ...], tuple[int, ...], int, tuple[int, ...]]] = {}
        # The step's block copies (source, destination), in order.
        self.copies: list[tuple[int, int]] = []
        # Request id -> its namespace (cache salt; "" for none), as added;
        # block id -> the namespace of the request that last wrote it.
        self.namespaces: dict[str, str] = {}
        self.written_under: dict[int, str] = {}
        # Blocks whose contents changed since a reader last took this set
        # (a write, a load, a copy): what may now disagree with its keys.
        self.changed: set[int] = set()
        # Block id -> offset -> the whole-prefix identity of what is there
        # (fuzz.adapter._identity; None: not known), beside ``held``.
        self.identity: dict[int, dict[int, int | None]] = {}
        self.identities = PrefixIdentities()
        # (block id, position) of the last unread()'s positions whose block
        # holds their KV from the reader's token under another prefix.
        self.other_prefix: set[tuple[int, int]] = set()
        # The reads that found everything there, and each block's changes since.
        self.clean_reads = CleanReads()

    def digests(self, request_id: str | None, tokens: Sequence[int]) -> list[int] | None:
        """Per position of ``tokens``, the identity of ``request_id``'s KV
        there (its namespace folded in: none for a request added without
        one, which then names its tokens alone); None without a request."""
        if request_id is None:
            return None
        return self.identities.of(request_id, self.namespaces.get(request_id, ""), tokens)

    def take_tables(self, out: Any) -> None:
        """The block tables ``out`` hands the runner, and the copies it
        makes before the step runs (each whole block, source to destination)."""
        take_handed_tables(self.tables, out)
        self.copies = [(c.src_block_id, c.dst_block_id) for c in getattr(out, "kv_cache_block_copies", None) or ()]
        before = {src: dict(self.held.get(src, {})) for src, _ in self.copies}
        states = {src: self.states.get(src) for src, _ in self.copies}
        identity = {src: dict(self.identity.get(src, {})) for src, _ in self.copies}
        for src, dst in self.copies:
            self.held[dst] = dict(before[src])
            self.identity[dst] = dict(identity[src])
            self.clean_reads.changed(dst)
            if states[src] is not None:
                self.states[dst] = states[src]
            self.changed.add(dst)
            if src in self.written_under:
                self.written_under[dst] = self.written_under[src]

    def settle_copies(self, step: int) -> None:
        """After the step's loads and forward pass: each offset a copy's
        source was filled at in ``step`` and its destination was not is
        marked as lost to the copy (COPIED_BEFORE_FILL, or COPIED_FROM_COPY
        when the source was another copy's destination)."""
        destinations = {dst for _, dst in self.copies}
        for src, dst in self.copies:
            held = self.held.setdefault(dst, {})
            for offset, source in self.held.get(src, {}).items():
                mine = held.get(offset)
                if mine == source or (mine is not None and mine[1] == step):
                    continue  # the same contents, or the destination's own write
                if src in destinations:  # filled by its own copy (lost or not), after this one read it
                    held[offset] = (COPIED_FROM_COPY, step, None)
                    self.clean_reads.changed(dst)
                elif source[0] >= 0 and source[1] == step:  # filled by the step's load or forward pass
                    held[offset] = (COPIED_BEFORE_FILL, step, None)
                    self.clean_reads.changed(dst)
        self.copies = []

    def _put(self, tables: Sequence[Sequence[int]], positions: Sequence[Iterable[int]], step: int,
             failed: frozenset[int], tokens: Sequence[int], namespace: str | None = None,
             digests: Sequence[int] | None = None) -> None:
        """Write, per group, that group's ``positions`` through its table,
        each from its token in ``tokens`` (None past its end), for a request
        of ``namespace`` (None: unknown) whose positions have the whole-prefix
        identities ``digests`` (None: unknown)."""
        for table, size, recorded, state, group_positions in zip(
                tables, self.block_sizes, self.per_position, self.whole_state, positions):
            if state:
                self._put_state(table, size, group_positions, step, failed, tokens)
            if not recorded:
                continue
            for position in group_positions:
                index = position // size
                if index < len(table) and table[index] != self.null_block_id:
                    block = table[index]
                    if namespace is not None:
                        self.written_under[block] = namespace
                    token = tokens[position] if position < len(tokens) else None
                    self.changed.add(block)
                    self.clean_reads.changed(block)
                    self.held.setdefault(block, {})[position % size] = (
                        (FAILED_LOAD, step, None) if block in failed else (position, step, token)
                    )
                    self.identity.setdefault(block, {})[position % size] = (
                        digests[position] if digests is not None and position < len(digests)
                        and block not in failed else None)

    def _put_state(self, table: Sequence[int], size: int, positions: Iterable[int], step: int,
                   failed: frozenset[int], tokens: Sequence[int]) -> None:
        """The state at the end of ``positions`` (a range) lands in the
        block of ``table`` that holds it (none for an empty range). A block
        a load failed to fill stays so until a recompute writes the state at
        its end (vLLM keeps such a block cached under the recompute policy,
        to be refilled; what it holds before then is the failed-load
        claims' question)."""
        end = max(positions, default=-1) + 1
        index = -(-end // size) - 1
        if end > 0 and index < len(table) and table[index] != self.null_block_id:
            block = table[index]
            self.changed.add(block)
            held = self.states.get(block)
            if block in failed or (held is not None and held[0] == FAILED_LOAD and end < (index + 1) * size):
                self.states[block] = (FAILED_LOAD, step, None)
            else:
                self.states[block] = (end, step, _prefix(tokens, end))

    def unread_states(self, request_id: str, start: int, tokens: Sequence[int] = ()
                      ) -> list[tuple[int, int, int, tuple[int, int, int | None] | None]]:
        """For a step of ``request_id`` computing from ``start`` (asked
        before the step writes): each recorded state group whose block
        ``(start - 1) // size`` in the runner's table does not hold the
        state at ``start`` computed from ``tokens`` (a null block, or no
        block, holds none), as (group, block id, start, what it holds:
        (position, step, None)). What a load failed to fill is left out
        (the failed-load claims' question)."""
        tables = self.tables.get(request_id)
        missing: list[tuple[int, int, int, tuple[int, int, int | None] | None]] = []
        if tables is None or start <= 0:
            return missing
        for group, (table, size, state) in enumerate(zip(tables, self.block_sizes, self.whole_state)):
            if not state:
                continue
            index = (start - 1) // size
            block_id = table[index] if index < len(table) else self.null_block_id
            held = self.states.get(block_id) if block_id != self.null_block_id else None
            if held is not None and held[0] == FAILED_LOAD:
                continue
            mine = _prefix(tokens, start)
            if held is None or held[0] != start or (mine is not None and held[2] is not None and held[2] != mine):
                missing.append((group, block_id, start, None if held is None else (held[0], held[1], None)))
        return missing

    def write(self, request_id: str, start: int, end: int, step: int, tokens: Sequence[int]) -> None:
        """The runner computes positions [start, end) of ``request_id``
        from its ``tokens``."""
        if request_id in self.tables:
            self._put(self.tables[request_id], [range(start, end)] * len(self.block_sizes), step, frozenset(), tokens,
                      self.namespaces.get(request_id), self.digests(request_id, tokens))
            for table, size, state, checkpoint in zip(
                    self.tables[request_id], self.block_sizes, self.whole_state, self.checkpoints):
                found = prefill_checkpoint(start, end, size, *checkpoint) if state and checkpoint else None
                if found is not None and found[1] < len(table) and table[found[1]] != self.null_block_id:
                    position = found[0]
                    self.changed.add(table[found[1]])
                    self.states[table[found[1]]] = (position, step, _prefix(tokens, position))

    def load(self, block_ids: Sequence[Sequence[int]], starts: Sequence[int], end: int, step: int,
             tokens: Sequence[int], failed: Iterable[int] = (), request_id: str | None = None) -> None:
        """The connector's worker loads positions [starts[g], end) of a
        request whose tokens are ``tokens`` into ``block_ids`` (per group g:
        a connector completing a divergent hybrid hit also fills what a
        lagging group lacks below the local hit); the blocks it ``failed``
        hold nothing it can name (FAILED_LOAD). The blocks are written for
        ``request_id``, in its namespace."""
        self._put(block_ids, [range(start, end) for start in starts], step, frozenset(failed), tokens,
                  self.namespaces.get(request_id) if request_id is not None else None,
                  self.digests(request_id, tokens))

    def start_async_load(self, request_id: str, block_ids: Sequence[Sequence[int]], starts: Sequence[int],
                         end: int, tokens: Sequence[int]) -> None:
        self.loading[request_id] = (tuple(tuple(g) for g in block_ids), tuple(starts), end, tuple(tokens))

    def land_async_load(self, request_id: str, step: int, failed: bool) -> None:
        """The worker reports ``request_id``'s async load landed (or failed:
        its blocks hold nothing it can name)."""
        load = self.loading.pop(request_id, None)
        if load is not None and not failed:
            self.load(load[0], load[1], load[2], step, load[3], request_id=request_id)

    def unwritten(self, block_id: int, group: int, positions: Iterable[int], tokens: Sequence[int] = (),
                  digests: Sequence[int] | None = None) -> list[tuple[int, tuple[int, int, int | None] | None]]:
        """Of ``positions`` (each in ``block_id``'s span of a group-``group``
        table), those whose KV the block does not hold: (position, what the
        block holds at its offset: (position, step, token) or None). With a
        reader's ``tokens``, KV of that position computed from another token
        is not its either (a token either side cannot name is taken on trust);
        with its whole-prefix identities ``digests``, nor KV computed from
        its token under another prefix or namespace (those positions are
        also left in :attr:`other_prefix`)."""
        size = self.block_sizes[group]
        held = self.held.get(block_id, {})
        identity = self.identity.get(block_id, {}) if digests is not None else {}
        missing = []
        for p in positions:
            h = held.get(p % size)
            mine = tokens[p] if p < len(tokens) else None
            if h is None or h[0] != p or (mine is not None and h[2] is not None and h[2] != mine):
                missing.append((p, h))
            elif digests is not None and p < len(digests) and identity.get(p % size) not in (None, digests[p]):
                missing.append((p, h))
                self.other_prefix.add((block_id, p))
        return missing

    def unread(self, request_id: str, start: int, prompt: int, rules: Sequence[tuple[str, int]],
               tokens: Sequence[int] = (), failing: Iterable[int] = ()
               ) -> list[tuple[int, int, int, tuple[int, int, int | None] | None]]:
        """For a step of ``request_id`` (whose tokens are ``tokens``)
        computing from ``start``: each position below it the step reads
        whose block in the runner's table does not hold its KV (a null
        block, or no block, holds none), as (group, block id, position, what
        the block holds there). What a load failed to fill is left out, as are the
        blocks the worker fails in this very step (``failing``): the worker
        reports them with the step's output, and whether vLLM then rolls
        back, recomputes or fails every request that read them, and drops
        them from its cache, is the failed-load claims' question
        (invariants/connector.py)."""
        failing = frozenset(failing)
        missing: list[tuple[int, int, int, tuple[int, int, int | None] | None]] = []
        self.other_prefix = set()
        digests = self.digests(request_id, tokens) if tokens else None
        tables = self.tables.get(request_id)
        if tables is None:
            return missing
        for group, (table, size, recorded, rule) in enumerate(zip(tables, self.block_sizes, self.per_position, rules)):
            if not recorded:
                continue
            by_block: dict[int, list[range]] = {}  # each block's runs of read positions
            for run in read_runs(rule, start, prompt):
                for index in range(run.start // size, -(-run.stop // size)):
                    block_id = table[index] if index < len(table) else self.null_block_id
                    if block_id not in failing:
                        by_block.setdefault(block_id, []).append(
                            range(max(run.start, index * size), min(run.stop, (index + 1) * size)))
            for block_id, runs in by_block.items():
                if block_id == self.null_block_id:
                    missing += [(group, block_id, p, None) for run in runs for p in run]
                    continue
                positions = self.clean_reads.unseen((request_id, group, block_id), runs, tokens, digests)
                found = self.unwritten(block_id, group, positions, tokens, digests) if positions else []
                if found:
                    self.clean_reads.forget((request_id, group, block_id))
                missing += [(group, block_id, p, h) for p, h in found if h is None or h[0] != FAILED_LOAD]
        return missing


    def unbacked_entries(self, entries: Iterable[tuple[int, int, int]]
                         ) -> list[tuple[int, int, int, list[tuple[int, tuple[int, int, int | None] | None]]]]:
        """Of the prefix-cache ``entries`` (group, block id, tokens the
        entry's key covers), those of a recorded group whose block does not
        hold the KV of every position the key covers inside it: (group,
        block id, tokens, the positions it lacks with what it holds there).
        Positions a load failed to fill are left out: whether a failed
        load's blocks may stay cached is the failed-load claims' question
        (invariants/connector.py). An entry of a recorded state group
        lacks its key's last position where its block holds no state
        there."""
        bad = []
        for group, block_id, num_tokens in entries:
            if self.whole_state[group] and num_tokens > 0:
                held = self.states.get(block_id)
                if held is None or held[0] not in (num_tokens, FAILED_LOAD):
                    bad.append((group, block_id, num_tokens, [(num_tokens, None if held is None else
                                                               (held[0], held[1], None))]))
                continue
            if not self.per_position[group] or num_tokens <= 0:
                continue
            size = self.block_sizes[group]
            first = (num_tokens - 1) // size * size
            missing = [m for m in self.unwritten(block_id, group, range(first, num_tokens))
                       if m[1] is None or m[1][0] != FAILED_LOAD]
            if missing:
                bad.append((group, block_id, num_tokens, missing))
        return bad

    def misnamed(self, group: int, block_id: int, tokens: Sequence[int], request_id: str | None = None
                 ) -> list[tuple[int, int, tuple[int, int, int | None]]]:
        """Of the positions a key for the prefix ``tokens`` (of
        ``request_id``, whose namespace it is under) covers inside
        ``block_id`` (a group-``group`` block: the key's last block, from
        the block's first position to the prefix's end), each the block
        holds the KV of another position or another token at, or of that
        token under another prefix or namespace: (position, the key's token
        there, what the block holds). Positions it holds
        nothing at, or what a load failed or a same-step copy lost, are the
        other contents claims' (index-written's, the failed-load claims')."""
        n = len(tokens)
        if not self.per_position[group] or n <= 0:
            return []
        size = self.block_sizes[group]
        first = (n - 1) // size * size
        held = self.held.get(block_id, {})
        digests = self.digests(request_id, tokens)
        identity = self.identity.get(block_id, {}) if digests is not None else {}
        wrong = []
        for p in range(first, n):
            h = held.get(p % size)
            if h is None or h[0] < 0:
                continue
            if h[0] != p or (h[2] is not None and h[2] != tokens[p]) or (
                    digests is not None and identity.get(p % size) not in (None, digests[p])):
                wrong.append((p, tokens[p], h))
        return wrong

    def foreign_blocks(self, request_id: str, block_ids: Sequence[Sequence[int]],
                       tables: Sequence[Sequence[int]] | None = None, hit: int | None = None
                       ) -> list[tuple[int, int, str]]:
        """Of ``block_ids`` (per group, in table order) that ``request_id``
        adopts as a hit of ``hit`` tokens (None: whole blocks), each of a
        recorded group last written for a request of another namespace, as
        far as the adopted prefix goes (:func:`namespace_within`): (group,
        block id, that namespace). Blocks never written here (or a request
        added without a namespace) are taken on trust. Only adopted
        blocks still in the request's block table after its allocation
        (``tables``, per group; default: the table the runner holds) count:
        a window group drops blocks it adopted below its window, and the
        pool may hand one to another request in the same step."""
        mine = self.namespaces.get(request_id)
        if mine is None:
            return []
        if tables is None:
            tables = self.tables.get(request_id)
        found = []
        for group, ids in enumerate(block_ids):
            if group >= len(self.per_position) or not self.per_position[group]:
                continue
            held = set(tables[group]) if tables is not None and group < len(tables) else None
            for index, block_id in enumerate(ids):
                if held is not None and block_id not in held:
                    continue
                theirs = self.written_under.get(block_id)
                end = (index + 1) * self.block_sizes[group]
                end = end if hit is None else min(hit, end)
                if block_id != self.null_block_id and theirs is not None and (
                        namespace_within(theirs, end) != namespace_within(mine, end)):
                    found.append((group, block_id, namespace_within(theirs, end)))
        return found

    def written_before(self, block_ids: Sequence[Sequence[int]], hit: int, step: int,
                       tables: Sequence[Sequence[int]] | None = None) -> list[tuple[int, int, int, int]]:
        """Of ``block_ids`` (per group, in table order) a hit of ``hit``
        tokens adopts, each position below ``hit`` that a block of a
        recorded group holds, as that position's KV, written before ``step``:
        (group, block id, position, step written). Only the offsets the hit
        reads count (a block reused by a group of smaller blocks keeps what
        it held past them); KV of another position there is other claims'
        to report. As in :meth:`foreign_blocks`, only adopted blocks still in
        the request's table (``tables``) count."""
        found = []
        for group, ids in enumerate(block_ids):
            if group >= len(self.per_position) or not self.per_position[group]:
                continue
            size = self.block_sizes[group]
            kept = set(tables[group]) if tables is not None and group < len(tables) else None
            for index, block_id in enumerate(ids):
                if block_id == self.null_block_id or (kept is not None and block_id not in kept):
                    continue
                held = self.held.get(block_id, {})
                for position in range(index * size, min((index + 1) * size, hit)):
                    h = held.get(position % size)
                    if h is not None and h[0] == position and h[1] < step:
                        found.append((group, block_id, position, h[1]))
        return found

    def forget(self, request_ids: Iterable[str]) -> None:
        """The runner drops the tables of requests that left its batch."""
        for rid in request_ids:
            self.tables.pop(rid, None)
            self.loading.pop(rid, None)
            self.identities.forget(rid)


def entries_of(cached: Mapping[Any, Any], group_of: Any) -> list[tuple[int, int, int]]:
    """(group, block id, tokens covered) of each primary entry of vLLM's
    prefix-cache map ``cached`` (key -> block, or block id -> block): the
    key a block carries as its own ``block_hash``, with the tokens it covers
    (``block_hash_num_tokens``); ``group_of(key)`` names its group."""
    return sorted((group_of(key), block_id, n) for key, block_id, n in _walk(cached) if n is not None)


def all_entries_of(cached: Mapping[Any, Any], split: Any) -> list[tuple[int, int, Any, int | None]]:
    """(group, block id, hash, tokens covered if it is the block's own key
    else None) of every entry of vLLM's prefix-cache map ``cached``: full
    and partial, whether or not the block carries the key as its own;
    ``split(key)`` is its (group, hash). In the map's order."""
    found = []
    for key, block_id, n in _walk(cached):
        group, block_hash = split(key)
        found.append((group, block_id, block_hash, n))
    return found


def _walk(cached: Mapping[Any, Any]) -> Iterable[tuple[Any, int, int | None]]:
    """(key, block id, tokens covered if the block carries the key as its
    own ``block_hash`` else None) of each entry of the map."""
    for key, blocks in cached.items():
        for block in blocks.values() if isinstance(blocks, dict) else (blocks,):
            own = block.block_hash == key
            yield key, block.block_id, getattr(block, "block_hash_num_tokens", None) if own else None


class KeyPrefixes:
    """What each prefix-cache key stands for: the hash of a request's first
    ``j * hash_block_size`` tokens (its cache salt and extra keys folded
    in) -> (that request, those tokens). A key of any group block size is
    the hash at the prefix's last hash-block boundary, so every key vLLM
    files is one of the hashes a request it holds carried when it filed it.
    The tokens are those vLLM hashed (the request's ``all_token_ids``); a
    key met first is kept. A key a later request carries over other tokens,
    or under another namespace as far as the prefix goes, names two
    prefixes: each such meeting is kept in :attr:`collisions` (key, the
    first carrier's request, tokens and namespace, the later one's), for a
    reader to take."""

    def __init__(self, hash_block_size: int) -> None:
        self.hash_block_size = hash_block_size
        self.prefix: dict[Any, tuple[str, tuple[int, ...]]] = {}
        self._seen: dict[str, int] = {}
        self._namespace: dict[str, str] = {}
        self.collisions: list[tuple[Any, str, tuple[int, ...], str, str, tuple[int, ...], str]] = []

    def learn(self, request_id: str, block_hashes: Sequence[Any], token_ids: Sequence[int],
              namespace: str = "") -> None:
        """``request_id`` (of ``namespace``) carries ``block_hashes`` over ``token_ids``."""
        start = self._seen.get(request_id, 0)
        self._namespace.setdefault(request_id, namespace)
        for j in range(start, len(block_hashes)):
            end = (j + 1) * self.hash_block_size
            mine = (request_id, tuple(token_ids[:end]))
            first = self.prefix.setdefault(block_hashes[j], mine)
            if first is not mine and (first[1] != mine[1] or namespace_within(
                    self._namespace.get(first[0], ""), end) != namespace_within(namespace, end)):
                self.collisions.append((block_hashes[j], first[0], first[1], self._namespace.get(first[0], ""),
                                        request_id, mine[1], namespace))
        self._seen[request_id] = max(start, len(block_hashes))
