"""The model runner's side of each step, imitated from what it is handed.

:class:`ScriptedRunner` is what the harness puts where a GPU worker would
be. It takes each ``SchedulerOutput``'s block tables, copies and the loads
the connector was told to do, decides the tokens it samples (and the drafts
the rejection sampler accepts), writes the KV each step computes into its
:class:`fuzz.adapter._contents.BlockContents`, and proposes drafts. Every
decision comes from its :class:`fuzz.adapter._reports.WorkerRecord`, never
from ``scheduler.requests``. :func:`runner_output` assembles the
``ModelRunnerOutput`` fed back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fuzz.adapter import _compat
from fuzz.adapter._contents import BlockContents, KeyPrefixes, checkpoint_params, records_state
from fuzz.adapter._encoder import EncoderWatch
from fuzz.adapter._handoff import HandOffWatch
from fuzz.model._encoder import MissingEncoderOutput
from fuzz.adapter._index_watch import IndexChanges
from fuzz.adapter._oplog import model_runner_output
from fuzz.adapter._reports import WorkerRecord, computed_before

from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402

from fuzz.model import (  # noqa: E402
    AdmissionObservation,
    ConnectorAlloc,
    FedOutput,
    GroupInfo,
    ForeignHit,
    HitAcrossReset,
    KvFromOtherToken,
    MisnamedEntry,
    MissingLookahead,
    SchedulerDraw,
    UnbackedEntry,
    UnwrittenRead,
)
from fuzz.model import group_behaviour as _group_behaviour  # noqa: E402
from fuzz.model import (  # noqa: E402
    KeyCollision, hits_across_reset_of, key_collisions_of, missing_lookahead_of, unwritten_reads_of,
)
from fuzz.model import group_kind as _group_kind  # noqa: E402

__all__ = ["ScriptedRunner", "runner_output"]


class ScriptedRunner:
    """The worker for one harness: what it knows (:attr:`worker`), what
    each block holds as it wrote it (:attr:`contents`), and what the last
    scheduled step read that its blocks did not hold (:attr:`unwritten_reads`)."""

    def __init__(self, draw: SchedulerDraw, groups: tuple[GroupInfo, ...], read_rules: tuple[tuple[str, int], ...],
                 null_block_id: int, scheduler: Any = None, specs: tuple[Any, ...] = ()) -> None:
        # What the scheduler was built with: the drafter's lookahead, the context length, the block size.
        lookahead = getattr(scheduler, "num_lookahead_tokens", 0) or 0
        max_model_len = scheduler.vllm_config.model_config.max_model_len if scheduler is not None else 0
        cache_block_size = scheduler.cache_config.block_size if scheduler is not None else 0
        self.draw = draw
        self.groups = groups
        self.read_rules = read_rules
        # What the worker knows and owes: every report is decided from it,
        # never from scheduler.requests (see fuzz/adapter/_reports.py).
        self.worker = WorkerRecord(draw.async_scheduling)
        # What each block holds, as the runner and the connector's worker
        # wrote it (per-position KV groups: the must-cover ones).
        self.contents = BlockContents(
            tuple(g.block_size for g in groups),
            tuple(_group_behaviour(g).value == "must-cover" for g in groups),
            null_block_id,
            tuple(records_state(rule, spec, bool(draw.num_speculative_tokens), cache_block_size)
                  for rule, spec in zip(read_rules, specs)),
            tuple(checkpoint_params(spec, getattr(scheduler, "hash_block_size", 0),
                                    getattr(getattr(scheduler, "kv_cache_config", None), "cache_hit_alignment_tokens", None))
                  for spec in specs),
        )
        # The harness's record of each request's blocks, read when the connector is told it finished.
        self.hand_offs = HandOffWatch(self.contents, self.worker.tokens, groups, read_rules,
                                      tuple(_compat.hand_off_clipped(spec) for spec in specs))
        self.unwritten_reads: list[UnwrittenRead] = []
        self.encoder = EncoderWatch()  # the worker's encoder cache
        self.missing_encoder_outputs: tuple[MissingEncoderOutput, ...] = ()
        # A drafter with its own forward pass (EAGLE, a draft model) writes
        # KV this many positions past the target's (0: none does), up to
        # max_model_len; the last sampled step's tables that fall short.
        self.lookahead = lookahead
        self.max_model_len = max_model_len
        self.missing_lookahead: list[MissingLookahead] = []
        self._failing_now: frozenset[int] = frozenset()  # the blocks the worker fails in this step's sync loads
        self.keys: KeyPrefixes | None = None  # what each prefix-cache key stands for (made with the pool)
        # Block id -> its index entries judged right ((group, tokens covered)
        # backed, (group, key hash) naming its prefix), until its contents
        # change: those need no second look.
        self._judged_right: dict[int, set[tuple[int, Any]]] = {}
        self._splits: dict[Any, tuple[int, Any]] = {}  # prefix-cache key -> (group, hash)
        self._index_changes = IndexChanges()  # the entries that may need judging

    def hand_over(self, out: Any, allocs: tuple[ConnectorAlloc, ...], admissions: Sequence[AdmissionObservation],
                  invalid: set[int], step: int) -> None:
        """What the worker takes from ``out`` before the step runs: its block
        tables and copies, and the external loads the connector was told to
        do (a synchronous one lands now, but into the blocks the worker
        fails; an async one when it is reported landed). A load starts at
        the local hit in every group, but where a divergent hybrid hit left
        a group lagging: a connector that completes such hits fills that
        group from the blocks it adopted on (each group's own hit)."""
        self.contents.forget(out.finished_req_ids or ())
        self.contents.take_tables(out)
        self.hand_offs.take(out, allocs)
        self.missing_encoder_outputs = self.encoder.step(out, step)
        self.unwritten_reads = []
        self._failing_now = frozenset(invalid)
        admitted = {a.request_id: a for a in admissions}
        for a in allocs:
            if not a.num_external_tokens:
                continue
            start = a.alloc_local_tokens or 0
            end = start + a.num_external_tokens
            starts = [start] * len(self.groups)
            adm = admitted.get(a.request_id)
            if adm is not None and adm.hit_diverged and adm.alloc_local_blocks is not None:
                starts = [min(start, len(blocks) * g.block_size) for blocks, g in zip(adm.alloc_local_blocks, self.groups)]
            tokens = self.worker.tokens.get(a.request_id, [])
            if a.reply_async:
                self.contents.start_async_load(a.request_id, a.block_ids, starts, end, tokens)
            else:
                self.contents.load(a.block_ids, starts, end, step, tokens, failed=invalid, request_id=a.request_id)

    def sample(self, out: Any, step: int, newly: frozenset[str], whole_prompt_landed: set[str],
               recomputed: set[str] = frozenset()) -> list[list[int]]:
        """What the model runner samples for ``out``, decided as it is
        scheduled (right after ``schedule()``): a token for each request whose
        scheduled tokens reach its end, none for a non-final prefill chunk
        (the runner discards those); with speculative decoding, before it,
        the drafts the rejection sampler accepts (:meth:`SchedulerDraw.accepted`).
        ``newly`` are the requests admitted in this step."""
        sampled = []
        position = 0
        # From the output and the worker's own record (prompt plus what it
        # sampled, fed back or still queued), never from vLLM's Request.
        self.worker.resync(out)
        self.hand_offs.rolled_back = recomputed
        self.missing_lookahead = []
        before = computed_before(out)
        # Where each request's tokens start (before this step's rejections count).
        starts = {rid: self.worker.start(rid, before) for rid in out.num_scheduled_tokens if rid in before}
        # The state each recurrent group's step starts from, read before the step writes.
        states = [(rid, *m) for rid, start in starts.items()
                  for m in self.contents.unread_states(rid, start, self.worker.tokens.get(rid, []))]
        for rid in out.num_scheduled_tokens:
            self.worker.compute(out, rid, before, step)
            done_prefill = self.worker.reaches_end(out, rid, before)
            if done_prefill and rid in before:
                self._check_lookahead(out, rid, before[rid])
            accepted = 0
            verifiable = self._verifiable(out, rid, newly) if done_prefill else 0
            if verifiable:
                accepted = self.draw.accepted(step, position, verifiable)
                position += 1
            if rid in starts:
                self._write_contents(out, rid, starts[rid], accepted, step)
            sampled.append([1000 + (step + i) % 24 for i in range(1 + accepted)] if done_prefill else [])
            self.worker.sampled(rid, sampled[-1])
            if done_prefill:  # vLLM rolls back the drafts of a request it gets tokens for
                drafts = (out.scheduled_spec_decode_tokens or {}).get(rid) or ()
                self.worker.rejected(rid, step, len(drafts) - accepted)
        self.contents.settle_copies(step)
        self.unwritten_reads = self._reads(starts, whole_prompt_landed, states, recomputed)
        return sampled

    def _check_lookahead(self, out: Any, rid: str, start: int) -> None:
        """The drafter follows ``rid``'s step and writes KV for the
        positions past it (EAGLE, draft models): every attention group's
        table handed to the runner must already cover them (allocate_slots
        reserves them, up to max_model_len). A V2-runner step that skips
        drafting (``skip_drafts``) writes none."""
        if not self.lookahead or getattr(out, "skip_drafts", False):
            return
        tables = self.contents.tables.get(rid)
        if tables is None:
            return
        self.missing_lookahead += missing_lookahead_of(
            rid, tables, self.contents.block_sizes, self.contents.per_position, start,
            out.num_scheduled_tokens[rid], self.lookahead, self.max_model_len,
        )

    def foreign_hits(self, admissions: Sequence[AdmissionObservation]) -> tuple[ForeignHit, ...]:
        """Each block an admission adopted as computed (the local blocks
        handed to allocate_slots) last written for another cache salt.
        Asked after the step's loads and forward pass: a block another
        request fills in this very step may be adopted in it (vLLM caches
        it in the schedule() of the step that fills it)."""
        found = []
        for adm in admissions:
            if adm.alloc_local_blocks is None:
                continue
            mine = self.contents.namespaces.get(adm.request_id, "")
            held = adm.block_table or None
            for group, block_id, theirs in self.contents.foreign_blocks(
                    adm.request_id, adm.alloc_local_blocks, held, adm.alloc_local_tokens):
                found.append(ForeignHit(adm.request_id, mine, group, block_id, theirs))
        return tuple(found)

    def hits_across_reset(self, admissions: Sequence[AdmissionObservation], reset_before: int
                          ) -> tuple[HitAcrossReset, ...]:
        """Each position an admission adopted as computed (below the local
        hit handed to allocate_slots) whose KV was written before step
        ``reset_before``, the step the last prefix-cache reset that
        succeeded preceded (0: none did). Asked, like :meth:`foreign_hits`,
        after the step's loads and forward pass."""
        found: list[HitAcrossReset] = []
        for adm in admissions if reset_before else ():
            if adm.alloc_local_blocks is None or not adm.alloc_local_tokens:
                continue
            found += hits_across_reset_of(adm.request_id, self.contents.written_before(
                adm.alloc_local_blocks, adm.alloc_local_tokens, reset_before, adm.block_table or None), reset_before)
        return tuple(found)

    def _verifiable(self, out: Any, rid: str, newly: frozenset[str]) -> int:
        """How many of the drafts scheduled for ``rid`` the rejection sampler
        could accept: none of the -1 padding a request admitted in this step
        gets (``pad_spec_decode``: ``[-1] * num_spec_tokens``, placeholder
        rows); otherwise, synchronous, the drafts before the first -1
        (vLLM's ``strip_speculative_padding``), async, every placeholder (the
        worker fills them with its drafts)."""
        drafts = (out.scheduled_spec_decode_tokens or {}).get(rid) or []
        if not drafts or rid in newly:
            return 0
        if self.draw.async_scheduling:
            return len(drafts)
        return next((i for i, t in enumerate(drafts) if t < 0), len(drafts))

    def _write_contents(self, out: Any, rid: str, start: int, accepted: int, step: int) -> None:
        """The KV the step writes for ``rid`` from ``start``: its scheduled
        positions but the drafts, and the drafts accepted."""
        drafts = len((out.scheduled_spec_decode_tokens or {}).get(rid) or ())
        end = start + out.num_scheduled_tokens[rid] - drafts
        self.contents.write(rid, start, end + accepted, step, self.worker.tokens.get(rid, []))

    def _reads(self, starts: dict[str, int], whole_prompt_landed: set[str],
               states: Sequence[tuple[str, int, int, int, Any]] = (), recomputed: set[str] = frozenset()
               ) -> list[UnwrittenRead]:
        """After the step's copies, loads and forward pass: what each of its
        requests reads below where it starts that its blocks do not hold (a
        forward pass writes a layer's KV before it attends, so what another
        request computes in the same pass is there; a block copy is made
        before the pass and its loads)."""
        reads = []
        kinds = [_group_kind(g) for g in self.groups]
        for rid, start in starts.items():
            found = [*self.contents.unread(
                rid, start, self.worker.prompt.get(rid, 0), self.read_rules, self.worker.tokens.get(rid, []),
                self._failing_now,
            ), *(m[1:] for m in states if m[0] == rid)]
            replay = rid in whole_prompt_landed and start == self.worker.prompt.get(rid, 0) - 1
            reads += unwritten_reads_of(rid, start, found, kinds, replay, rid in recomputed, self.contents.other_prefix)
        return reads

    def index_entries(self, pool: Any, requests: Mapping[str, Any], recomputed: set[str]
                      ) -> tuple[tuple[UnbackedEntry, ...], tuple[MisnamedEntry, ...]]:
        """After the step: each prefix-cache entry whose block does not hold
        what its key covers (see BlockContents.unbacked_entries), and each
        whose block holds the KV of something else there (see
        BlockContents.misnamed). What a key stands for is learnt from the
        hashes vLLM's ``requests`` carry (its hash function's, not its cache's
        word): every key the index files is one of them. ``recomputed``: the
        requests a failed sync load ever rolled back."""
        self.hand_offs.requests = requests  # the same map each step: the next take() observes the queue through it
        cached = _compat.prefix_cache_map(pool)
        if cached is None:
            return (), ()
        if self.keys is None:
            self.keys = KeyPrefixes(pool.hash_block_size)
        for rid, request in requests.items():
            self.keys.learn(rid, request.block_hashes, request.all_token_ids, self.contents.namespaces.get(rid, ""))
        # An entry judged right stays right until its block's contents change.
        changed, self.contents.changed = self.contents.changed, set()
        for block_id in changed:
            self._judged_right.pop(block_id, None)
        right = self._judged_right
        # Only what may need judging (what the map's insert/pop touched, the
        # changed blocks', what stood unjudged or wrong): the rest is in right.
        judge = self._index_changes.to_judge(getattr(pool, "cached_block_hash_to_block", None), cached, changed)
        entries = []
        for key, block in judge:
            group, block_hash = self._split(key)
            own = block.block_hash == key
            entries.append((group, block.block_id, block_hash, getattr(block, "block_hash_num_tokens", None) if own else None))
        primary = sorted((g, b, n) for g, b, _, n in entries if n is not None and (g, n) not in right.get(b, ()))
        hashes = {(g, b, n): h for g, b, h, n in entries if n is not None}
        unbacked = tuple(
            UnbackedEntry(group, block_id, n, tuple(missing), self.contents.whole_state[group],
                          self.keys.prefix.get(hashes.get((group, block_id, n)), ("",))[0])
            for group, block_id, n, missing in self.contents.unbacked_entries(primary)
        )
        bad = {(u.group, u.block_id, u.num_tokens) for u in unbacked}
        for group, block_id, n in primary:
            if (group, block_id, n) not in bad:
                right.setdefault(block_id, set()).add((group, n))
        misnamed = []
        for group, block_id, block_hash, _ in entries:
            if (group, block_hash) in right.get(block_id, ()):
                continue
            rid, tokens = self.keys.prefix.get(block_hash, ("", ()))
            wrong = self.contents.misnamed(group, block_id, tokens, rid)
            if wrong:
                misnamed.append(MisnamedEntry(group, block_id, bytes(block_hash).hex()[:12], rid, len(tokens), tuple(wrong),
                                              rid in recomputed))
            elif tokens:
                right.setdefault(block_id, set()).add((group, block_hash))
        misnamed.sort(key=lambda e: (e.group, e.block_id, e.key))
        for (key, _), (group, block_id, block_hash, n) in zip(judge, entries):
            done = right.get(block_id, ())
            if (group, block_hash) not in done or (n is not None and (group, n) not in done):
                self._index_changes.stand(key)
        return unbacked, tuple(misnamed)

    def key_collisions(self) -> tuple[KeyCollision, ...]:
        """The keys learnt since the last call that name two prefixes
        (see KeyPrefixes): vLLM's hasher, judged on what each request is."""
        if self.keys is None or not self.keys.collisions:
            return ()
        found, self.keys.collisions = self.keys.collisions, []
        return key_collisions_of(found)

    def _split(self, key: Any) -> tuple[int, Any]:
        """A prefix-cache key's (group, hash), remembered (keys are immutable)."""
        split = self._splits.get(key)
        if split is None:
            split = self._splits[key] = (_compat.group_of_key(key), _compat.hash_of_key(key))
        return split

    def kv_from_other_tokens(self, out: Any, requests: Mapping[str, Any],
                             recomputed: set[str]) -> tuple[KvFromOtherToken, ...]:
        """After the step's update_from_output(): each position the worker
        computed for a live request, below its num_computed_tokens, whose
        token vLLM now records differently (see WorkerRecord.settle);
        ``recomputed``: the requests a failed sync load ever rolled back."""
        # A request the step both reports preempted and schedules (a reset's
        # preemption, admitted again by this schedule()) keeps what this step computed.
        preempted = set(out.preempted_req_ids or ()) - set(out.num_scheduled_tokens) if out is not None else ()
        return tuple(
            KvFromOtherToken(rid, position, token, recorded, step, rid in recomputed)
            for rid, position, token, recorded, step in self.worker.settle(requests, preempted)
        )

    def drafts(self, out: Any) -> tuple[list[str], list[list[int]]] | None:
        """The drafter's proposals after ``out`` ran (None: it hands none
        over), as the engine core takes them: ``EngineCore.post_step``
        (synchronous scheduling, when the model ran) ``take_draft_token_ids()``;
        the scheduler itself drops those of prefill chunks and finished
        requests. With async scheduling the engine hands none over (the
        worker keeps its drafts; AsyncScheduler schedules -1 placeholders for
        them). A step the scheduler marked ``skip_drafts`` (V2 runner: no
        request can use them) proposes none. The drafter proposes k drafts
        for every request of the batch."""
        if (
            self.draw.speculative_method is None
            or self.draw.async_scheduling
            or out.total_num_scheduled_tokens == 0
            or getattr(out, "skip_drafts", False)
        ):
            return None
        ids = list(out.num_scheduled_tokens)
        k = self.draw.num_speculative_tokens
        return ids, [[3000 + i for i in range(k)] for _ in ids]


def runner_output(ids: list[str], sampled: list[list[int]], recving: set[str], failed: set[str],
                  invalid_block_ids: Iterable[int], sending: set[str]) -> tuple[ModelRunnerOutput, FedOutput]:
    """The ``ModelRunnerOutput`` for a step's requests ``ids`` and what they
    ``sampled``, with the connector's reports (loads landed, of which
    ``failed``; blocks a sync load failed; sends done), and the same in the
    operation log's words (the output is built from those, as a replay of
    the log builds it)."""
    fed = FedOutput(
        req_ids=tuple(ids),
        sampled_token_ids=tuple(tuple(t) for t in sampled),
        finished_recving=tuple(sorted(recving)),
        failed_recving=tuple(sorted(failed)),
        invalid_block_ids=tuple(sorted(set(invalid_block_ids))),
        finished_sending=tuple(sorted(sending)),
    )
    return model_runner_output(fed), fed
