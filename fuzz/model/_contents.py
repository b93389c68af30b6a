"""What a block holds and what the cache promises, as the harness saw it
go wrong in one step: reads of positions a block does not hold, index
entries ahead of their blocks' contents, KV computed from other tokens,
drafter lookahead past the blocks allocated, hits across cache salts, KV
events that disagree with the index, and a preempted request as it was left.

Standard library only: records built by small helpers (``*_of``) from
what the harness saw, that the suite's checks read."""

from __future__ import annotations

import dataclasses

__all__ = [
    "EventGap",
    "EventOrphan",
    "ForeignHit",
    "HitAcrossReset",
    "KeyCollision",
    "KvFromOtherToken",
    "MisnamedEntry",
    "MissingLookahead",
    "PreemptedRequest",
    "UnbackedEntry",
    "UnwrittenRead",
    "event_orphans_of",
    "key_collisions_of",
    "hits_across_reset_of",
    "missing_lookahead_of",
    "unwritten_reads_of",
]


@dataclasses.dataclass(frozen=True)
class KvFromOtherToken:
    """A position whose KV the worker computed from one token while vLLM
    records another token at that position (both as of this step)."""

    request_id: str
    position: int
    computed_from: int  # the token the worker had there when it computed it
    recorded: int  # the token in vLLM's Request.all_token_ids there
    written_at: int  # the step that computed it
    recomputed_failed_load: bool = False  # a failed sync load rolled it back (recompute) earlier

    def describe(self) -> str:
        return (
            f"request {self.request_id}: position {self.position}'s KV was computed at step {self.written_at} "
            f"from token {self.computed_from}, but vLLM records token {self.recorded} there"
            + (" (the request was rolled back by a failed synchronous load, recompute policy)"
               if self.recomputed_failed_load else "")
        )


def _copy_cause(missing: tuple[tuple[int, tuple[int, int, int | None] | None], ...]) -> str:
    """Why positions are missing when every one was lost to a block copy made
    before its source was filled in the same step: "copy of a copy" (the
    source was another copy's destination: held position -2), "copy before
    fill" (the step's load or forward pass filled the source: -1); "" when
    any is missing for another reason (-3: a load failed to fill it)."""
    marks = {h[0] if h is not None and h[0] in (-1, -2) else 0 for _, h in missing}
    if 0 in marks or not marks:
        return ""
    return "copy of a copy" if -2 in marks else "copy before fill"


def _what_it_holds(missing: tuple[tuple[int, tuple[int, int, int | None] | None], ...]) -> str:
    """What a block holds where positions are missing, for messages."""
    return (
        f"(it holds (position, step written, token) {[h for _, h in missing]}; position -1: lost to a block copy "
        f"made before the step filled its source, -2: a copy of another copy's destination)"
    )


@dataclasses.dataclass(frozen=True)
class UnwrittenRead:
    """Positions below a scheduled request's start that its step reads in a
    group, whose block in the runner's table does not hold their KV."""

    request_id: str
    group: int
    group_kind: str  # its spec's bare class name
    block_id: int
    start: int  # where the step computes from
    # The step is the last-token recompute vLLM starts when an async load of
    # the request's whole prompt lands (see StepObservation.whole_prompt_landed).
    after_whole_prompt_load: bool
    # (position, what the block holds at its offset: (position, step that
    # wrote it, token it was computed from), or None: nothing written there)
    # per position it lacks.
    missing: tuple[tuple[int, tuple[int, int, int | None] | None], ...]
    # A failed synchronous load rolled the request back (recompute) earlier.
    recomputed_failed_load: bool = False
    # Every position it lacks holds that position's KV computed from the
    # reader's own token, under another prefix or namespace (the tokens or
    # what vLLM hashes beside them differ somewhere before it).
    other_prefix: bool = False

    @property
    def copy_cause(self) -> str:
        return _copy_cause(self.missing)

    @property
    def earlier_state(self) -> bool:
        """A Mamba read whose block holds a state from before its start."""
        return self.group_kind == "MambaSpec" and all(h is not None and 0 <= h[0] < p for p, h in self.missing)

    @property
    def other_tokens_only(self) -> bool:
        """Every position it lacks holds that position's KV, computed from
        another token than the reader's."""
        return all(h is not None and h[0] == p for p, h in self.missing)

    def describe(self) -> str:
        return (
            f"request {self.request_id}, group {self.group}: its step computing from position {self.start} reads "
            f"block {self.block_id} at positions {[p for p, _ in self.missing]}, which does not hold their KV "
            + ("computed from the reader's tokens " if self.other_tokens_only else "")
            + ("(it holds each position's KV from the reader's token there, computed under another prefix or "
               "namespace: the tokens before it, or what vLLM hashes beside them, differ) " if self.other_prefix else "")
            + _what_it_holds(self.missing)
            + (" (a Mamba group reads the state at its start)" if self.group_kind == "MambaSpec" else "")
        )


@dataclasses.dataclass(frozen=True)
class UnbackedEntry:
    """A prefix-cache entry (full or partial) whose block does not hold the
    KV of every position its key covers inside the block."""

    group: int
    block_id: int
    num_tokens: int  # the prefix its key covers (block_hash_num_tokens)
    missing: tuple[tuple[int, tuple[int, int, int | None] | None], ...]
    whole_state: bool = False  # a Mamba group's entry: it names the state at num_tokens
    request_id: str = ""  # a request whose prefix the key is (the first met carrying it; "": none known)

    @property
    def copy_cause(self) -> str:
        return _copy_cause(self.missing)

    @property
    def earlier_state(self) -> bool:
        """A Mamba entry whose block holds a state from before the key's end."""
        return self.whole_state and all(h is not None and 0 <= h[0] < p for p, h in self.missing)

    def describe(self) -> str:
        return (
            f"group {self.group}: the prefix-cache entry for the first {self.num_tokens} tokens names block "
            f"{self.block_id}, which does not hold the KV of positions {[p for p, _ in self.missing]} "
            + _what_it_holds(self.missing)
            + (" (a Mamba block: the state at the key's end)" if self.whole_state else "")
        )


@dataclasses.dataclass(frozen=True)
class MisnamedEntry:
    """A prefix-cache entry (full or partial) whose block holds, at positions
    its key covers inside the block, the KV of other positions or tokens than
    the key's prefix: a lookup of that prefix adopts KV of something else."""

    group: int
    block_id: int
    key: str  # the key's hash, short hex
    request_id: str  # the request whose prefix the key is (the first met carrying it)
    num_tokens: int  # the prefix the key covers
    # (position, the key's token there, what the block holds there:
    # (position, step written, token computed from)) per position it misnames.
    wrong: tuple[tuple[int, int, tuple[int, int, int | None]], ...]
    # The key's request was rolled back by a failed synchronous load (recompute) earlier.
    recomputed_failed_load: bool = False

    def describe(self) -> str:
        return (
            f"group {self.group}: the prefix-cache key {self.key} (the first {self.num_tokens} tokens of request "
            f"{self.request_id}) names block {self.block_id}, which holds other KV at positions "
            f"{[p for p, *_ in self.wrong]}: (position, the key's token, what the block holds there as (position, "
            f"step written, token)) {list(self.wrong)}"
            + (" (the request was rolled back by a failed synchronous load, recompute policy)"
               if self.recomputed_failed_load else "")
        )


@dataclasses.dataclass(frozen=True)
class KeyCollision:
    """One prefix-cache key that vLLM's hasher gave two requests for
    different prefixes: other tokens, or another namespace (cache salt,
    LoRA adapter, prompt embeddings, images placed before the prefix's end)."""

    key: str  # the key's hash, short hex
    num_tokens: int  # the prefix it covers for the request that carried it first
    first_request: str
    first_namespace: str
    request: str
    other_tokens: int  # the tokens it covers for ``request`` (the same count unless the lengths differ)
    namespace: str
    # The first position where the two prefixes' tokens differ (-1: none).
    differs_at: int

    def describe(self) -> str:
        where = (f"their tokens differ at position {self.differs_at}" if self.differs_at >= 0
                 else f"their tokens are the same, their namespaces {self.first_namespace!r} and "
                      f"{self.namespace!r} are not")
        return (
            f"key {self.key} stands for the first {self.num_tokens} tokens of request {self.first_request} and "
            f"for the first {self.other_tokens} tokens of request {self.request}: {where}"
        )


@dataclasses.dataclass(frozen=True)
class MissingLookahead:
    """A request whose step a drafter follows (it reaches its end: the drafter
    proposes from it) with fewer blocks in a group's table than the positions
    the drafter writes ahead need."""

    request_id: str
    group: int
    start: int  # num_computed_tokens the output hands the runner
    num_scheduled: int
    lookahead: int  # vllm_config.num_lookahead_tokens
    needed: int  # positions the table must cover: min(start + scheduled + lookahead, max_model_len)
    covered: int  # positions the table covers: its blocks x the group's block size

    def describe(self) -> str:
        return (
            f"request {self.request_id}, group {self.group}: computing [{self.start}, "
            f"{self.start + self.num_scheduled}) with a drafter that writes {self.lookahead} position(s) ahead needs "
            f"a table covering {self.needed} positions; the runner's table covers {self.covered}"
        )


@dataclasses.dataclass(frozen=True)
class ForeignHit:
    """A block a request adopted from the prefix cache that was written for
    a request of another namespace (cache salt, LoRA adapter, prompt
    embeddings, or the multimodal items placed in the adopted prefix): the
    hit crosses tenants, adapters or inputs."""

    request_id: str
    namespace: str  # the adopting request's ("" for none; see fuzz.adapter._contents.namespace_of)
    group: int
    block_id: int
    written_under: str  # the namespace of the request that wrote the block (as far as the hit adopts it)

    def describe(self) -> str:
        def salt(s: str) -> str:
            parts = s.split("+") if s else []
            salts = [p for p in parts if not p.startswith(("lora:", "embeds:", "mm:"))]
            loras = [p.removeprefix("lora:") for p in parts if p.startswith("lora:")]
            embeds = [p.removeprefix("embeds:") for p in parts if p.startswith("embeds:")]
            items = [p.removeprefix("mm:").rsplit("@", 1) for p in parts if p.startswith("mm:")]
            return ", ".join(
                [f"cache_salt={salts[0]!r}" if salts else "no cache_salt"]
                + [f"LoRA adapter {name!r}" for name in loras]
                + [f"prompt embeddings {tag!r}" for tag in embeds]
                + [f"multimodal item {name!r} at position {at}" for name, at in items]
            )

        return (
            f"request {self.request_id} ({salt(self.namespace)}) adopts block {self.block_id} of group "
            f"{self.group} from the prefix cache, written for a request with {salt(self.written_under)}"
        )


@dataclasses.dataclass(frozen=True)
class HitAcrossReset:
    """A position a request adopted from the prefix cache whose KV was
    computed (or loaded) before the last ``reset_prefix_cache()`` that
    succeeded: the reset promised that no later lookup serves it (in RLHF
    flows the weights changed in between)."""

    request_id: str
    group: int
    block_id: int
    positions: tuple[int, ...]  # the adopted positions whose KV predates the reset
    written_at: int  # the last step that computed or loaded any of them
    reset_before: int  # the step the reset preceded

    def describe(self) -> str:
        return (
            f"request {self.request_id} adopted block {self.block_id} of group {self.group} as computed, holding the KV "
            f"of positions {list(self.positions)} computed by step {self.written_at} at the latest, before the "
            f"prefix-cache reset that preceded step {self.reset_before}"
        )


@dataclasses.dataclass(frozen=True)
class EventGap:
    """A prefix-cache key on which the KV events published so far disagree
    with the index: replaying them counts ``announced`` blocks under it, the
    index files ``block_ids`` under it."""

    group: int | None
    key: object  # the key as events spell it (vLLM's external block hash)
    announced: int
    block_ids: tuple[int, ...]
    # What the key stands for in the harness's record: (a request that
    # carried it, the tokens of its prefix it covers); None: unknown.
    prefix: tuple[str, int] | None = None
    # A prefix-cache reset succeeded since the events last published: the
    # replay is due an AllBlocksCleared.
    after_reset: bool = False

    def describe(self) -> str:
        held = f"blocks {list(self.block_ids)}" if self.block_ids else "no block"
        return (
            f"group {self.group}: key {self.key!r} is announced {self.announced} time(s) by the replayed "
            f"BlockStored/BlockRemoved/AllBlocksCleared events, but the prefix-cache index files {held} under it"
        )


@dataclasses.dataclass(frozen=True)
class EventOrphan:
    """A ``BlockStored`` event whose ``parent_block_hash`` no event published
    before it announces in its group: a router that hangs every announced
    block under its parent (a radix tree of the replica's cache) cannot
    place the blocks it announces."""

    group: int | None
    parent: object  # the parent key, as events spell it
    first_key: object  # the first key the event announces
    num_tokens: int  # the tokens the event carries
    block_size: int  # the event's block_size (a partial entry's: the tokens past its parent)
    partial: bool  # the event's block_size is below its group's: a partial (sub-block) entry's
    # The group caches only some of a request's blocks (a sliding window or
    # chunk drops old ones, a Mamba group keeps states at some boundaries):
    # its events' parent may be a block it never cached.
    sparse: bool = False
    # What the first key stands for in the harness's record: (a request
    # that carried it, the tokens of its prefix it covers); None: unknown.
    prefix: tuple[str, int] | None = None

    def describe(self) -> str:
        what = "a partial entry" if self.partial else "full blocks"
        return (
            f"group {self.group}: BlockStored of {what} (first key {self.first_key!r}, {self.num_tokens} tokens, "
            f"block_size {self.block_size}) names parent {self.parent!r}, which no event published before it "
            f"announces in that group"
        )


@dataclasses.dataclass(frozen=True)
class PreemptedRequest:
    """A request as the ``schedule()`` that preempted it left it: its status,
    the counters it resumes from, and the blocks the KV-cache manager still
    files under it (per group)."""

    request_id: str
    step: int
    status: str  # its RequestStatus name
    num_computed_tokens: int
    num_output_placeholders: int
    num_spec_tokens: int  # len(spec_token_ids)
    blocks_held: tuple[int, ...]  # per group: blocks in the manager's req_to_blocks
    # Scheduled again by the same schedule() (then it resumed: the admission
    # checks judge it).
    rescheduled: bool = False

    def describe(self) -> str:
        return (
            f"request {self.request_id} preempted at step {self.step}: status {self.status}, "
            f"num_computed_tokens={self.num_computed_tokens}, num_output_placeholders="
            f"{self.num_output_placeholders}, {self.num_spec_tokens} spec_token_ids, blocks held per group "
            f"{list(self.blocks_held)}{' (scheduled again in the same step)' if self.rescheduled else ''}"
        )


def missing_lookahead_of(request_id: str, tables, block_sizes, per_position, start: int, num_scheduled: int,
                         lookahead: int, max_model_len: int) -> list[MissingLookahead]:
    """Each per-position group's table (``tables``, per group) handed to the
    runner for ``request_id``'s step computing ``num_scheduled`` tokens from
    ``start``, that covers fewer positions than a drafter writing
    ``lookahead`` positions past it needs (up to ``max_model_len``)."""
    needed = min(start + num_scheduled + lookahead, max_model_len)
    return [
        MissingLookahead(request_id, group, start, num_scheduled, lookahead, needed, len(table) * size)
        for group, (table, size, recorded) in enumerate(zip(tables, block_sizes, per_position))
        if recorded and len(table) * size < needed
    ]

def key_collisions_of(found) -> tuple[KeyCollision, ...]:
    """``found``'s meetings (key, first request, its tokens, its namespace,
    later request, its tokens, its namespace), as records."""
    out = []
    for key, first, tokens, namespace, request, mine, theirs in found:
        differs = next((i for i, (a, b) in enumerate(zip(tokens, mine)) if a != b),
                       -1 if len(tokens) == len(mine) else min(len(tokens), len(mine)))
        out.append(KeyCollision(bytes(key).hex()[:12], len(tokens), first, namespace, request, len(mine), theirs,
                                differs))
    return tuple(out)


def hits_across_reset_of(request_id: str, found, reset_before: int) -> list[HitAcrossReset]:
    """``found``'s positions, (group, block id, position, step written) each,
    that one admission adopted across the reset preceding step
    ``reset_before``: one record per block."""
    held: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for group, block_id, position, written in found:
        held.setdefault((group, block_id), []).append((position, written))
    return [
        HitAcrossReset(request_id, group, block_id, tuple(sorted(p for p, _ in at)), max(w for _, w in at), reset_before)
        for (group, block_id), at in held.items()
    ]


def event_orphans_of(orphans, block_sizes, read_rules) -> tuple[EventOrphan, ...]:
    """The replay's orphaned ``BlockStored`` events, (group, parent, first key,
    tokens, block_size) each, as records: a partial entry's where the event's
    block_size is below its group's, sparse where the group does not read
    (so cache) every block of a request (``read_rules``: per group, what a
    step reads)."""
    return tuple(
        EventOrphan(group, parent, first, tokens, size, group is not None and size < block_sizes[group],
                    sparse=group is None or read_rules[group][0] != "full")
        for group, parent, first, tokens, size in orphans
    )


def unwritten_reads_of(request_id: str, start: int, found, group_kinds, after_whole_prompt_load: bool = False,
                       recomputed_failed_load: bool = False, other_prefix=frozenset()) -> list[UnwrittenRead]:
    """``found``'s positions, (group, block id, position, what the block
    holds there) each, that the step of ``request_id`` computing from
    ``start`` reads and its blocks lack: one record per block
    (``group_kinds``: per group, its spec's bare class name;
    ``other_prefix``: the (block id, position) pairs whose block holds the
    reader's token there under another prefix)."""
    by_block: dict[tuple[int, int], list] = {}
    for group, block_id, position, holds in found:
        by_block.setdefault((group, block_id), []).append((position, holds))
    return [
        UnwrittenRead(request_id, group, group_kinds[group], block_id, start, after_whole_prompt_load, tuple(missing),
                      recomputed_failed_load, all((block_id, p) in other_prefix for p, _ in missing))
        for (group, block_id), missing in by_block.items()
    ]
