"""What a standalone repro watches the scheduler do, beside vLLM's own objects.

The watch wraps a few of the scheduler's and KV-cache manager's calls to see
what they were handed and returned; it changes nothing they do. What it
records beyond what every claim needs is switched by WATCH_POOL,
WATCH_TABLES, WATCH_CONTENTS and WATCH_EVENTS (:mod:`fuzz.kit._params`).
"""

from __future__ import annotations

from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, maybe_convert_block_hash

from fuzz.adapter._events import EventLog, event_gaps, index_counts
from fuzz.adapter._contents import KeyPrefixes
from fuzz.adapter._reports import WorkerRecord, computed_before
from fuzz.kit._admissions import _admission
from fuzz.kit._build import _describe_groups, _ids
from fuzz.kit._contents import _make_contents
from fuzz.kit._hits import HitLookup, _groups, _index_at_lookup, _watch_frees
from fuzz.kit._params import (
    ASYNC_SCHEDULING,
    CONNECTOR,
    DIVERGENT_HITS,
    FAILING_LOADS,
    HASH_BLOCK_SIZE,
    NULL_BLOCK,
    SPECS,
    WATCH_ADMISSIONS,
    WATCH_ADMITTED,
    WATCH_CONTENTS,
    WATCH_EVENTS,
    WATCH_EVICTIONS,
    WATCH_HITS,
    WATCH_INDEX,
    WATCH_JOINT_HITS,
    WATCH_POOL,
    WATCH_TOKENS,
)
from fuzz.model._contents import EventGap
from fuzz.model._kv import cdiv


class _Watch:
    """What the scheduler's prefix-cache branch saw and did for each request
    it admitted in the current step: its local lookup (and, beside it, the
    joint hit every group agrees on and each group's own hit) and the
    arguments of its allocate_slots call; and, for every request, which
    blocks it holds right after schedule() (see _watch_blocks for what the
    block pool and the single-type managers did). Nothing the scheduler does
    changes."""

    def __init__(self, scheduler):
        self.step = 0
        # The suite's checks a file carries as they are (fuzz.kit.SUITE_CHECK_MODULES)
        # read the watch as a StepObservation: the records they judge under
        # the same names and types (fuzz.model), the step in a sentence
        # (describe), no scenario; no request rolled back by a failed load
        # (the file does not tell them apart: the checks name a plainer cause).
        self.context = ""
        self.rolled_back = frozenset()
        self.rolled_back_in_flight = frozenset()
        self.error = None  # schedule() raised (the file's step fails before any check)
        self.error_where = ""
        self.ownership = None  # StepOwnership of the last schedule() (WATCH_IN_FLIGHT)
        if WATCH_ADMISSIONS:
            self.admitting = {}
        if WATCH_ADMITTED:
            self.admissions = []  # Admission: each request this step admitted
        self.newly_scheduled = ()  # (request id, num_computed_tokens, num_tokens) scheduled anew by the last schedule()
        self.last_output = None  # the last schedule()'s SchedulerOutput (a check may read it after vLLM raised)
        self.seen = set()  # every request seen in the scheduler
        self.queue = []  # (step, SchedulerOutput, sampled, admissions) not fed back yet, newest first
        self.aborts = []  # aborts that arrive while the model runs the next step
        self.reset_before = 0  # the step the last prefix-cache reset that succeeded preceded
        self.reset_preempted = []  # the requests it preempted, as it left them (WATCH_PREEMPTED)
        self.worker = WorkerRecord(async_scheduling=ASYNC_SCHEDULING)  # what the model runner knows (see _worker_done)
        self.async_answers_seen = {}  # request id -> whether the connector's answer this step was async
        if CONNECTOR:
            self.load_started = {}  # request id -> the step whose schedule() started its async load
            self.send_started = {}  # request id -> the first step begun after its send started
        if WATCH_TOKENS:
            self.kv_from_other_tokens = []  # KvFromOtherToken: computed from a token vLLM does not record there
        self.contents = None  # what each block holds, where the file states it (see _make_contents)
        self.starts = {}  # request id -> where this step's tokens start (see _worker_done)
        self.preempted_at = {}  # request id -> the step whose schedule() last preempted it
        sched = scheduler
        mgr = scheduler.kv_cache_manager
        if WATCH_ADMISSIONS or WATCH_POOL or WATCH_HITS:
            lookup = type(sched)._get_local_prefix_cache_hit

            def local_hit(request, max_cache_hit_length=None):
                if WATCH_HITS:  # the index as the lookup begins
                    held = _index_at_lookup(mgr, request, max_cache_hit_length)
                if WATCH_JOINT_HITS:  # beside the lookup: the joint hit every group agrees on, and each group's own
                    limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
                    self._own_lookup = True  # the watch's lookups are not the scheduler's
                    joint_blocks, joint_hit, _ = type(mgr).get_computed_blocks(mgr, request, max_cache_hit_length)
                    if hasattr(mgr.coordinator, "find_longest_cache_hit_per_group"):
                        per_group = list(mgr.coordinator.find_longest_cache_hit_per_group(request.block_hashes, limit)[1])
                    else:
                        per_group = [joint_hit] * len(SPECS)
                    self._own_lookup = False
                result = lookup(sched, request, max_cache_hit_length)
                num_local = result[1]
                if WATCH_POOL:
                    self.local_hits.append((request.request_id, num_local, request.num_tokens))
                if WATCH_HITS:
                    if held:
                        self.lookups_served[request.request_id] = HitLookup(
                            request.request_id, self.step, num_local, _groups(), DIVERGENT_HITS, **held)
                if WATCH_ADMISSIONS:
                    self.admitting[request.request_id] = dict(
                        local_hit=num_local, lookup=_ids(result[0]),
                        skips=bool(getattr(request.sampling_params, "skip_reading_prefix_cache", None)),
                        diverged=bool(result[3]) if len(result) > 3 else False,
                    )
                if WATCH_JOINT_HITS:
                    self.admitting[request.request_id].update(
                        joint_hit=joint_hit, joint=_ids(joint_blocks), per_group=per_group
                    )
                return result

            sched._get_local_prefix_cache_hit = local_hit
        if WATCH_ADMISSIONS or WATCH_POOL or CONNECTOR:
            allocate = type(mgr).allocate_slots

            def allocate_slots(request, num_new_tokens, *args, **kwargs):
                if WATCH_ADMISSIONS:
                    adm = self.admitting.get(request.request_id)
                    if adm is not None and "alloc_external" not in adm:
                        adm["alloc_external"] = kwargs.get("num_external_computed_tokens", 0)
                if CONNECTOR:
                    connector = sched.connector
                    connector.events.append((
                        "alloc", request.request_id, kwargs.get("num_new_computed_tokens", 0),
                        kwargs.get("num_external_computed_tokens", 0),
                    ))
                if WATCH_ADMISSIONS:
                    if adm is not None and "local" not in adm:
                        blocks = kwargs.get("new_computed_blocks")
                        adm["local"] = kwargs.get("num_new_computed_tokens", 0)
                        adm["adopted"] = [[] for _ in SPECS] if blocks is None else _ids(blocks)
                if WATCH_POOL:
                    return self._counted(allocate, mgr, request, num_new_tokens, *args, **kwargs)
                return allocate(mgr, request, num_new_tokens, *args, **kwargs)

            mgr.allocate_slots = allocate_slots
        if WATCH_POOL:
            self._watch_blocks(mgr)
        # Failed loads: reported this step (request id -> facts), and failed
        # async loads waiting to leave WAITING_FOR_REMOTE_KVS.
        self.failed = {}  # failed loads reported this step: request id -> facts
        self.landed = {}  # request id -> failed blocks still cached as it left
        if FAILING_LOADS:
            self.failed_waiting = {}
            self._watch_waiting_for_remote_kvs(sched, mgr)
        if WATCH_CONTENTS:
            self.contents = _make_contents(scheduler)
        if WATCH_INDEX:
            self.keys = KeyPrefixes(HASH_BLOCK_SIZE)  # what each prefix-cache key stands for
        if WATCH_HITS:
            self.lookups_served = {}  # request id -> HitLookup: the hit served, the index as the lookup began
        if WATCH_EVICTIONS:
            self.eviction_watch = _watch_frees(scheduler, self)
            self.evictions = []
        if WATCH_EVENTS:
            # Every batch update_from_output() publishes is replayed, as a
            # KV-aware router replays it (the null publisher hands it over).
            self.events = EventLog()
            self.event_gaps = []  # EventGap: where the replay disagrees with the index after update_from_output()
            scheduler.kv_event_publisher.publish = self.events.publish

    def describe(self):
        """The step, for a check's message."""
        return f"at step {self.step}; groups: {_describe_groups()}"

    def _watch_waiting_for_remote_kvs(self, sched, mgr):
        """As a failed async load's request leaves WAITING_FOR_REMOTE_KVS: the
        failed blocks still cached (landed)."""
        waiting_done = getattr(sched, "_update_waiting_for_remote_kv", None)
        if waiting_done is None:
            return

        def update_waiting_for_remote_kv(request):
            result = waiting_done(request)
            facts = self.failed_waiting.pop(request.request_id, None)
            if facts is not None:
                self.landed[request.request_id] = (facts, _still_cached(mgr, facts["blocks"]))
            return result

        sched._update_waiting_for_remote_kv = update_waiting_for_remote_kv

    def _counted(self, allocate, mgr, request, num_new_tokens, *args, **kwargs):
        """allocate_slots, with what it counts per group and takes from the
        pool (_watch_blocks)."""
        outer, self._alloc = self._alloc, dict(
            request=request.request_id, num_new_tokens=num_new_tokens, kwargs=kwargs,
            counted=[None] * len(SPECS), taken=[0] * len(SPECS), takers=[set() for _ in SPECS],
        )
        result, raised = None, True
        try:
            result = allocate(mgr, request, num_new_tokens, *args, **kwargs)
            raised = False
        finally:
            if raised or result is not None:  # None: it refused, taking nothing
                self.allocations.append(dict(self._alloc, raised=raised))
            self._alloc = outer
        return result

    def _watch_blocks(self, mgr):
        """Per step: the blocks the pool hands out (get_new_blocks, for which
        request); per allocate_slots, what each group's
        get_num_blocks_to_allocate counted against what the group then took
        from the pool (new blocks, and cached blocks nobody references that
        it touched: they leave the free queue); each prefix-cache lookup's
        max_cache_hit_length and hit, per group where the call gives one."""
        self.fresh = []  # (block id, request id, group)
        self.allocations = []
        self.lookups = []  # (call, max_cache_hit_length, hits)
        self.local_hits = []  # (request id, local hit, num_tokens) per scheduler lookup
        self.held = {}
        self._alloc = None  # the allocate_slots call running
        self._group = None  # (group, method) of the allocation call running
        self._own_lookup = False
        pool, coordinator = mgr.block_pool, mgr.coordinator
        get_new_blocks, touch = pool.get_new_blocks, pool.touch

        def take(n):
            if n and self._alloc is not None and self._group is not None:
                g, method = self._group
                self._alloc["taken"][g] += n
                self._alloc["takers"][g].add(method)

        def new_blocks(num_blocks):
            blocks = get_new_blocks(num_blocks)
            rid = "?" if self._alloc is None else self._alloc["request"]
            group = -1 if self._group is None else self._group[0]
            self.fresh += [(b.block_id, rid, group) for b in blocks]
            take(len(blocks))
            return blocks

        def touch_blocks(blocks):
            take(sum(1 for b in blocks if b.ref_cnt == 0 and not b.is_null))
            return touch(blocks)

        pool.get_new_blocks, pool.touch = new_blocks, touch_blocks
        for g, manager in enumerate(coordinator.single_type_managers):
            self._watch_group(g, manager)
        for name in ("find_longest_cache_hit", "find_longest_cache_hit_per_group"):
            if hasattr(coordinator, name):
                setattr(coordinator, name, self._watched_lookup(name, getattr(coordinator, name)))

    def _watch_group(self, g, manager):
        count = manager.get_num_blocks_to_allocate

        def get_num_blocks_to_allocate(*args, **kwargs):
            n = count(*args, **kwargs)
            if self._alloc is not None:
                self._alloc["counted"][g] = n  # the last count is the one allocate_slots compares
            return n

        def in_group(method, call):
            def run(*args, **kwargs):
                outer, self._group = self._group, (g, method)
                try:
                    return call(*args, **kwargs)
                finally:
                    self._group = outer
            return run

        manager.get_num_blocks_to_allocate = get_num_blocks_to_allocate
        for method in ("add_local_computed_blocks", "allocate_external_computed_blocks", "allocate_new_blocks"):
            if hasattr(manager, method):
                setattr(manager, method, in_group(method, getattr(manager, method)))

    def _watched_lookup(self, name, lookup):
        def call(block_hashes, max_cache_hit_length, *args, **kwargs):
            result = lookup(block_hashes, max_cache_hit_length, *args, **kwargs)
            if not self._own_lookup:
                hits = [result[1]] if name == "find_longest_cache_hit" else list(result[1])
                self.lookups.append((name, max_cache_hit_length, hits))
            return result
        return call

    def hold(self, scheduler, out):
        """Right after schedule(): per request, its block table in every
        group, the tokens it had computed before the step and the tokens
        scheduled now; per block, (ref_cnt, in the free queue, cached)."""
        managers = scheduler.kv_cache_manager.coordinator.single_type_managers
        self.held = {}
        for g, manager in enumerate(managers):
            for rid, blocks in manager.req_to_blocks.items():
                row = self.held.setdefault(rid, dict(tables=[[] for _ in managers]))
                row["tables"][g] = [b.block_id for b in blocks]
        for rid, row in self.held.items():
            request, n = scheduler.requests.get(rid), out.num_scheduled_tokens.get(rid, 0)
            row["scheduled"] = n
            row["computed_before"] = 0 if request is None else request.num_computed_tokens - n
            row["num_prompt_tokens"] = 0 if request is None else request.num_prompt_tokens
        self.blocks = {
            b.block_id: (b.ref_cnt, b.prev_free_block is not None, b.block_hash is not None)
            for b in scheduler.kv_cache_manager.block_pool.blocks
        }

    def take_admissions(self, scheduler, out):
        """After schedule(): each admitted request's computed tokens, its
        block table, the external tokens the connector was told, and the
        connector's answer. Requests that were not admitted are dropped."""
        computed = computed_before(out)
        if CONNECTOR:
            told = scheduler.connector.told
        else:  # no connector to tell: the admitted are the scheduled, none with external tokens
            told = dict.fromkeys(computed, 0)
        for rid in list(self.admitting):
            adm = self.admitting[rid]
            if rid not in told or rid not in scheduler.requests or "local" not in adm:
                del self.admitting[rid]
                continue
            # An async load's request waits for its KV outside the output.
            adm["num_computed_tokens"] = computed.get(rid, scheduler.requests[rid].num_computed_tokens)
            adm["external"] = told[rid]
            adm["num_tokens"] = scheduler.requests[rid].num_tokens
            if CONNECTOR:
                adm["answer"] = scheduler.connector.answers.get(rid)
            else:
                adm["answer"] = 0
            adm["table"] = [list(g) for g in scheduler.kv_cache_manager.get_block_ids(rid)]
        if WATCH_ADMITTED:  # each admitted request as the suite's admission claims read it
            self.admissions = [_admission(rid, adm, self.step, self.copies, self.async_answers_seen)
                               for rid, adm in self.admitting.items()]

def _event_key(key):
    """A prefix-cache key as KV events spell it: (group, the hash BlockStored
    and BlockRemoved carry)."""
    return get_group_id(key), maybe_convert_block_hash(get_block_hash(key))


def _event_gaps(scheduler, watch):
    """Right after update_from_output() published the step's events (the
    block pool's queue is empty then): each (group, key, announcements,
    block ids) where the replay of every batch so far differs from the
    number of blocks the prefix-cache index files under that key."""
    cached = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block._cache
    gaps = event_gaps(watch.events.counts, index_counts(cached, _event_key))
    return [EventGap(*gap) for gap in gaps]


def _still_cached(manager, blocks):
    pool = manager.block_pool
    return [[b for b in group if pool.blocks[b].block_hash is not None] for group in blocks]


def _finished(scheduler, rid):
    """Finished (aborted while the model ran the step) when its load's failure
    is reported: vLLM then leaves it as it is."""
    request = scheduler.requests.get(rid)
    return request is None or request.is_finished()


def _failed_facts(scheduler, watch, failed_loads, invalid_block_ids):
    """Per request whose load this step reports failed: how, the load's start,
    the first failed token, the blocks the failed part was written into."""
    facts = {}
    for rid in failed_loads:
        adm = watch.admitting.get(rid, {})
        start = adm.get("local", 0)
        table = scheduler.kv_cache_manager.get_block_ids(rid)
        blocks = [[b for b in g[start // s.block_size:] if b != NULL_BLOCK] for g, s in zip(table, SPECS)]
        facts[rid] = dict(how="failed_recving", start=start, first=start, blocks=blocks,
                          request=scheduler.requests.get(rid),
                          finished_before=_finished(scheduler, rid))
    for rid, adm in watch.admitting.items():
        if not invalid_block_ids or not adm.get("external") or watch.async_answers_seen.get(rid):
            continue
        (table,) = adm["table"]
        start = adm["num_computed_tokens"] - adm["external"]
        end = min(cdiv(adm["num_computed_tokens"], SPECS[0].block_size), len(table))
        bad = [k for k in range(start // SPECS[0].block_size, end) if table[k] in invalid_block_ids]
        if bad:
            facts[rid] = dict(how="invalid_block_ids", start=start, first=bad[0] * SPECS[0].block_size,
                              blocks=[[table[k] for k in range(start // SPECS[0].block_size, end)
                                       if table[k] != NULL_BLOCK]],
                              request=scheduler.requests.get(rid),
                          finished_before=_finished(scheduler, rid))
    return facts
