"""Repro: Scheduler.schedule() violates 'running-request-progresses'.

Found and shrunk by the kvtrunc-fuzz property suite.

vLLM version: 0.33.0
target: direct
seed: 0
invariant: running-request-progresses
violation: [running-request-progresses] request r0 RUNNING and unscheduled for 3 quiet steps: num_computed_tokens=16, num_tokens=16 (prompt 16, max_tokens 1), num_output_placeholders=1

Scenario (as drawn):
    Scheduler(plain, Layout([FullAttentionSpec(block_size=4)], hash_block_size=4,
    num_blocks=16), max_num_batched_tokens=8, max_num_seqs=1,
    long_prefill_token_threshold=0, connector.supports_divergent_local_hybrid_hits=True,
    kv_load_failure_policy='recompute', model_runner='v1', async_scheduling=True); 1 groups,
    16 blocks, 1 requests, 8 schedule() steps
"""

import json
import traceback

import pytest
import torch

from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

pytestmark = pytest.mark.cpu_test

# A tiny local model: vLLM reads its config.json only (no weights, no hub).
MODEL_CONFIG = {
    'architectures': ['LlamaForCausalLM'],
    'model_type': 'llama',
    'hidden_size': 64,
    'num_hidden_layers': 1,
    'num_attention_heads': 2,
    'num_key_value_heads': 1,
    'intermediate_size': 128,
    'vocab_size': 1024,
    'max_position_embeddings': 4096,
    'torch_dtype': 'float32',
}
SPECS = [
    FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32),
]
# Per group, what it must hold of a request's local prefix: every block
# (must-cover), its state at the boundary (whole-state), nothing (scratch);
# 'windowed' groups skip old tokens (their window is not checked here).
ROLES = ['must-cover']
NUM_BLOCKS = 16  # block 0 is the null block
NULL_BLOCK = 0
BLOCK_SIZE = 4  # the smallest prefix-cacheable group block, as the engine sets it
PREFIX_MATCH_UNIT = None
SCHEDULER_BLOCK_SIZE = 4  # LCM of the group block sizes
HASH_BLOCK_SIZE = 4
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 1
MAX_NUM_BATCHED_TOKENS = 8
LONG_PREFILL_TOKEN_THRESHOLD = 0
KV_LOAD_FAILURE_POLICY = 'recompute'
# What the engine's KV-cache planning writes onto the KVCacheConfig.
KV_CONFIG_FIELDS = {'prefix_cache_retention_interval': 0, 'hash_block_size': 4, 'cache_hit_alignment_tokens': 4}
# The connector's supports_divergent_local_hybrid_hits.
DIVERGENT_HITS = True

# The external store, per request: (kind, tokens held, first answers
# 'not yet', tokens over-reported, async). kind 'store': it holds the first
# tokens-held tokens; 'zero': nothing; 'undecided': None for the first
# answers, then as 'store'; 'over': more than the prompt (a contract breach);
# 'saved': the connector's own store of what finished requests computed.
STORE = {
    'r0': ('store', 16, 0, 0, False),
}
# The answers the recorded run got, (num_computed_tokens, answer, async) per call.
RECORDED_ANSWERS = {
    'r0': [(0, 15, False)],
}

PROMPT_R0 = list(range(0, 16))  # 16 tokens


class ScriptedConnector(KVConnectorBase_V1, SupportsHMA):
    """A scheduler-side KV connector answering from STORE. It never moves KV:
    it records what the scheduler tells it, and which async loads are in
    flight (the test reports them done, or failed, in the next step)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.asked = {}  # request id -> number of get_num_new_matched_tokens calls
        self.told = {}  # request id -> num_external_tokens of update_state_after_alloc, this step
        self.answers = {}  # request id -> its last answer this step
        self.asked_with = {}  # request id -> num_computed_tokens of its last question this step
        self.async_answers = {}  # request id -> whether its last answer this step was async
        self.told_blocks = {}  # request id -> block ids per group handed with the last update_state_after_alloc
        self.events = []  # this step: ("alloc", rid, local, external) and ("told", rid, external)
        self.metas = []  # this step: what each build_connector_meta was handed
        self.finished = {}  # request id -> request_finished calls so far
        self.finish_calls = []  # (request id, nth call for it, status)
        self.loads_in_flight = set()
        self.saved = []  # token prefixes finished requests computed, in whole scheduler blocks
        self.whole_prompt_sent = set()  # requests handed an async load of their whole prompt
        # A producer (P/D prefill instance) holds a finished request's blocks
        # for its decode instance until the send is reported done.
        self.producer = vllm_config.kv_transfer_config.kv_role == "kv_producer"
        self.sends_in_flight = set()

    def _saved_prefix(self, tokens):
        best = 0
        for entry in self.saved:
            n = 0
            for a, b in zip(entry, tokens):
                if a != b:
                    break
                n += 1
            best = max(best, n // SCHEDULER_BLOCK_SIZE * SCHEDULER_BLOCK_SIZE)
        return best

    @property
    def supports_divergent_local_hybrid_hits(self):
        return DIVERGENT_HITS

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        kind, held, undecided, extra, load_async = STORE.get(request.request_id) or ("zero", 0, 0, 0, False)
        asked = self.asked.get(request.request_id, 0)
        self.asked[request.request_id] = asked + 1
        self.answers[request.request_id] = None
        self.asked_with[request.request_id] = num_computed_tokens
        self.async_answers[request.request_id] = False
        if kind == "zero":
            self.answers[request.request_id] = 0
            return 0, False
        if kind == "over":
            self.answers[request.request_id] = request.num_tokens - num_computed_tokens + extra
            return request.num_tokens - num_computed_tokens + extra, False
        if kind == "undecided" and asked < undecided:
            return None, False
        if kind == "saved":  # the connector's own store: what finished requests computed
            held = self._saved_prefix(list(request.prompt_token_ids))
        # A sync load leaves the last token to compute; an async one may bring
        # all, once per request (a P/D decode side's remote prefill).
        whole = load_async and request.request_id not in self.whole_prompt_sent
        limit = request.num_tokens if whole else request.num_tokens - 1
        answer = max(0, min(held, limit) - num_computed_tokens)
        self.answers[request.request_id] = answer
        self.async_answers[request.request_id] = bool(load_async and answer)
        return answer, bool(load_async and answer)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.told[request.request_id] = num_external_tokens
        self.told_blocks[request.request_id] = [list(g) for g in blocks.get_block_ids()]
        self.events.append(("told", request.request_id, num_external_tokens))
        kind, *_, load_async = STORE.get(request.request_id) or ("zero", 0, 0, 0, False)
        if num_external_tokens and load_async:
            self.loads_in_flight.add(request.request_id)
            if self.asked_with.get(request.request_id, 0) + num_external_tokens >= request.num_tokens:
                self.whole_prompt_sent.add(request.request_id)

    def build_connector_meta(self, scheduler_output):
        out = scheduler_output
        cached = out.scheduled_cached_reqs
        self.metas.append(dict(
            named={n.req_id for n in out.scheduled_new_reqs} | set(cached.req_ids),
            scheduled=set(out.num_scheduled_tokens),
            has_sync_kv_loads=getattr(out, "has_sync_kv_loads", None),
            already_finished=sorted(
                r for r in {n.req_id for n in out.scheduled_new_reqs} | set(cached.req_ids) if self.finished.get(r)
            ),
        ))
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        rid = request.request_id
        self.finished[rid] = self.finished.get(rid, 0) + 1
        self.finish_calls.append((rid, self.finished[rid], request.status.name))
        if request.status.name != "FINISHED_ERROR":  # save what it computed, in whole blocks
            computed = list(request.all_token_ids[: request.num_computed_tokens])
            whole = len(computed) // SCHEDULER_BLOCK_SIZE * SCHEDULER_BLOCK_SIZE
            if whole:
                self.saved.append(computed[:whole])
        # As NIXL's P side: a request that finished normally is sent, its
        # blocks held until finished_sending; an aborted one is freed at once.
        if (
            self.producer
            and request.status.name in ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")
            and any(len(g) > 0 for g in block_ids)
        ):
            self.sends_in_flight.add(rid)
            return True, None
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    # Worker side: never used, the scheduler runs alone.
    def start_load_kv(self, forward_context, **kwargs):
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name):
        raise NotImplementedError

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        raise NotImplementedError

    def wait_for_save(self):
        raise NotImplementedError


def _make_model_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return ModelConfig(
        model=str(tmp_path),
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=MAX_MODEL_LEN,
    )


def _make_kv_cache_config():
    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"g{i}.layer"], spec) for i, spec in enumerate(SPECS)],
    )
    config = generate_scheduler_kv_cache_config([config])
    for name, value in KV_CONFIG_FIELDS.items():
        setattr(config, name, value)
    return config


def _make_scheduler(tmp_path):
    vllm_config = VllmConfig(
        model_config=_make_model_config(tmp_path),
        scheduler_config=SchedulerConfig(
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            max_model_len=MAX_MODEL_LEN,
            long_prefill_token_threshold=LONG_PREFILL_TOKEN_THRESHOLD,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            async_scheduling=True,  # the engine's default
        ),
        cache_config=CacheConfig(
            block_size=BLOCK_SIZE,
            enable_prefix_caching=True,
            mamba_cache_mode="align",
            prefix_match_unit=PREFIX_MATCH_UNIT,
            cache_dtype="auto",
        ),
        kv_transfer_config=KVTransferConfig(
            kv_connector="ScriptedConnector",
            kv_connector_module_path=__name__,  # this file
            kv_role="kv_both",
            kv_load_failure_policy=KV_LOAD_FAILURE_POLICY,
        ),
        device_config=DeviceConfig(device="cpu"),
    )
    # As on GPU: the hybrid KV-cache manager is on (a CPU-only install turns it off).
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    # The class the engine core builds (EngineCore: get_scheduler_cls()): AsyncScheduler.
    return vllm_config.scheduler_config.get_scheduler_cls()(
        vllm_config=vllm_config,
        kv_cache_config=_make_kv_cache_config(),
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZE,
        log_stats=False,
    )


def _make_request(request_id, token_ids, max_tokens, skip_reading_prefix_cache=None):
    # skip_reading_prefix_cache=True: the request must read no cached tokens.
    skip = {} if skip_reading_prefix_cache is None else {"skip_reading_prefix_cache": skip_reading_prefix_cache}
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **skip),
        pooling_params=None,
        block_hasher=get_request_block_hasher(HASH_BLOCK_SIZE, sha256),
    )


def _ids(blocks):
    return [[b.block_id for b in group] for group in blocks.blocks]


def _cdiv(a, b):
    return -(-a // b)


def _describe_groups():
    return ", ".join(
        f"group {i} {type(s).__name__} (block_size={s.block_size}, {r})" for i, (s, r) in enumerate(zip(SPECS, ROLES))
    )


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
        self.admissions = {}
        self.num_tokens = {}
        self.seen = set()  # every request seen in the scheduler
        self.queue = []  # (step, SchedulerOutput, sampled, admissions) not fed back yet, newest first
        self.load_started = {}  # request id -> the step whose schedule() started its async load
        self.aborts = []  # aborts that arrive while the model runs the next step
        self.send_started = {}  # request id -> the first step begun after its send started
        self.preempted_at = {}  # request id -> the step whose schedule() last preempted it
        self.stale = {}  # this step's fed output: preempted request id -> (request, num_tokens before)
        sched, mgr = scheduler, scheduler.kv_cache_manager
        lookup = type(sched)._get_local_prefix_cache_hit
        allocate = type(mgr).allocate_slots
        coordinator = mgr.coordinator

        def local_hit(request, max_cache_hit_length=None):
            limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
            self._own_lookup = True  # the watch's lookups are not the scheduler's
            joint_blocks, joint_hit, _ = type(mgr).get_computed_blocks(mgr, request, max_cache_hit_length)
            if hasattr(coordinator, "find_longest_cache_hit_per_group"):
                per_group = list(coordinator.find_longest_cache_hit_per_group(request.block_hashes, limit)[1])
            else:
                per_group = [joint_hit] * len(SPECS)
            self._own_lookup = False
            result = lookup(sched, request, max_cache_hit_length)
            blocks, num_local = result[0], result[1]
            self.local_hits.append((request.request_id, num_local, request.num_tokens))
            self.admissions[request.request_id] = dict(
                local_hit=num_local, lookup=_ids(blocks), joint_hit=joint_hit, joint=_ids(joint_blocks),
                per_group=per_group, skips=bool(getattr(request.sampling_params, "skip_reading_prefix_cache", None)),
            )
            return result

        def allocate_slots(request, num_new_tokens, *args, **kwargs):
            adm = self.admissions.get(request.request_id)
            if adm is not None and "alloc_external" not in adm:
                adm["alloc_external"] = kwargs.get("num_external_computed_tokens", 0)
            sched.connector.events.append((
                "alloc", request.request_id, kwargs.get("num_new_computed_tokens", 0),
                kwargs.get("num_external_computed_tokens", 0),
            ))
            if adm is not None and "local" not in adm:
                blocks = kwargs.get("new_computed_blocks")
                adm["local"] = kwargs.get("num_new_computed_tokens", 0)
                adm["adopted"] = [[] for _ in SPECS] if blocks is None else _ids(blocks)
            # What this call counts per group and takes from the pool (_watch_blocks).
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

        sched._get_local_prefix_cache_hit = local_hit
        mgr.allocate_slots = allocate_slots
        self._watch_blocks(mgr)
        # Failed loads: reported this step (request id -> facts), and failed
        # async loads waiting to leave WAITING_FOR_REMOTE_KVS.
        self.failed = {}
        self.async_answers_seen = {}
        self.failed_waiting = {}
        self.landed = {}  # request id -> failed blocks still cached as it left
        waiting_done = getattr(sched, "_update_waiting_for_remote_kv", None)
        if waiting_done is not None:
            def update_waiting_for_remote_kv(request):
                result = waiting_done(request)
                facts = self.failed_waiting.pop(request.request_id, None)
                if facts is not None:
                    self.landed[request.request_id] = (facts, _still_cached(mgr, facts["blocks"]))
                return result

            sched._update_waiting_for_remote_kv = update_waiting_for_remote_kv

    def _watch_blocks(self, mgr):
        """Per step: the blocks the pool hands out (get_new_blocks, for which
        request); per allocate_slots, what each group's
        get_num_blocks_to_allocate counted against what the group then took
        from the pool (new blocks, and cached blocks nobody references that
        it touched: they leave the free queue); each prefix-cache lookup's
        max_cache_hit_length and hit, per group where the call gives one."""
        self.fresh = []  # (block id, request id)
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
            self.fresh += [(b.block_id, rid) for b in blocks]
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

    def settle(self, scheduler, out):
        """After schedule(): each admitted request's computed tokens, its
        block table, the external tokens the connector was told, and the
        connector's answer. Requests that were not admitted are dropped."""
        computed = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed.setdefault(rid, cached.num_computed_tokens[i])
        told = scheduler.connector.told
        self.seen |= set(scheduler.requests)
        self.num_tokens = {rid: scheduler.requests[rid].num_tokens for rid in computed}
        for rid in list(self.admissions):
            adm = self.admissions[rid]
            if rid not in told or rid not in scheduler.requests or "local" not in adm:
                del self.admissions[rid]
                continue
            # An async load's request waits for its KV outside the output.
            adm["num_computed_tokens"] = computed.get(rid, scheduler.requests[rid].num_computed_tokens)
            adm["external"] = told[rid]
            adm["num_tokens"] = scheduler.requests[rid].num_tokens
            adm["answer"] = scheduler.connector.answers.get(rid)
            adm["table"] = [list(g) for g in scheduler.kv_cache_manager.get_block_ids(rid)]


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
        adm = watch.admissions.get(rid, {})
        start = adm.get("local", 0)
        table = scheduler.kv_cache_manager.get_block_ids(rid)
        blocks = [[b for b in g[start // s.block_size:] if b != NULL_BLOCK] for g, s in zip(table, SPECS)]
        facts[rid] = dict(how="failed_recving", start=start, first=start, blocks=blocks,
                          request=scheduler.requests.get(rid),
                          finished_before=_finished(scheduler, rid))
    for rid, adm in watch.admissions.items():
        if not invalid_block_ids or not adm.get("external") or watch.async_answers_seen.get(rid):
            continue
        (table,) = adm["table"]
        start = adm["num_computed_tokens"] - adm["external"]
        end = min(_cdiv(adm["num_computed_tokens"], SPECS[0].block_size), len(table))
        bad = [k for k in range(start // SPECS[0].block_size, end) if table[k] in invalid_block_ids]
        if bad:
            facts[rid] = dict(how="invalid_block_ids", start=start, first=bad[0] * SPECS[0].block_size,
                              blocks=[[table[k] for k in range(start // SPECS[0].block_size, end)
                                       if table[k] != NULL_BLOCK]],
                              request=scheduler.requests.get(rid),
                          finished_before=_finished(scheduler, rid))
    return facts


def _begin_step(scheduler, watch):
    """A new engine step: forget the last step's connector calls and watch records."""
    watch.step += 1
    watch.admissions.clear()
    connector = scheduler.connector
    for record in (connector.told, connector.answers, connector.asked_with, connector.async_answers,
                   connector.told_blocks, connector.events, connector.metas):
        record.clear()
    watch.seen |= set(scheduler.requests)
    watch.loads_in_flight = set(connector.loads_in_flight)
    watch.stale = {}
    for rid in connector.sends_in_flight:
        watch.send_started.setdefault(rid, watch.step)
    watch.landed.clear()
    for record in (watch.fresh, watch.allocations, watch.lookups, watch.local_hits):
        record.clear()


def _step(scheduler, watch, failed_loads=(), invalid_block_ids=()):
    """One engine step as EngineCore.step_with_batch_queue takes it (a queue of
    max_concurrent_batches = 2): schedule() if the scheduler has requests (or
    nothing is queued); the output joins the queue with what the model runner
    samples for it (decided now: a token unless it is a partial prefill
    chunk); if the queue is not full and the step ran tokens or requests are
    left, nothing is fed back; otherwise the oldest output is, with each async
    load in flight that it may carry (started in that step or earlier)
    reported done, or failed. Returns this step's SchedulerOutput (None: no
    schedule())."""
    connector = scheduler.connector
    _begin_step(scheduler, watch)
    out = None
    if not watch.queue or scheduler.has_requests():
        out = scheduler.schedule()
        watch.hold(scheduler, out)
        watch.preempted_at.update(dict.fromkeys(out.preempted_req_ids or (), watch.step))
        watch.async_answers_seen = dict(connector.async_answers)
        watch.settle(scheduler, out)
        for rid in connector.loads_in_flight:
            watch.load_started.setdefault(rid, watch.step)
        sampled = [
            [] if scheduler.requests[rid].is_prefill_chunk else [1000 + watch.step % 24]
            for rid in out.num_scheduled_tokens
        ]
        watch.queue.insert(0, (watch.step, out, sampled, dict(watch.admissions)))
        if len(watch.queue) < 2 and (out.total_num_scheduled_tokens > 0 or scheduler.has_requests()):
            _abort_during_step(scheduler, watch)  # nothing fed back: they come after the step
            return out
    index, fed, sampled, admissions = watch.queue.pop()
    _abort_during_step(scheduler, watch)
    recving = {
        r for r in connector.loads_in_flight if r in scheduler.requests and watch.load_started.get(r, 0) <= index
    }
    connector.loads_in_flight -= recving
    for rid in recving:
        watch.load_started.pop(rid, None)
    sending = _sends_done(scheduler, watch, index)
    this_step, watch.admissions = watch.admissions, admissions  # the fed step's admissions
    watch.failed = _failed_facts(scheduler, watch, recving & set(failed_loads), set(invalid_block_ids))
    watch.admissions = this_step
    watch.failed_waiting.update({r: f for r, f in watch.failed.items() if f["how"] == "failed_recving"})
    connector_output = None
    if recving or invalid_block_ids or sending:
        connector_output = KVConnectorOutput(
            finished_sending=sending,
            finished_recving=recving,
            failed_recving=recving & set(failed_loads),
            invalid_block_ids=set(invalid_block_ids),
        )
    ids = list(fed.num_scheduled_tokens)
    _note_stale(scheduler, watch, ids, index)
    scheduler.update_from_output(
        fed,
        ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=connector_output,
        ),
    )
    return out


def _abort_during_step(scheduler, watch):
    """Aborts that arrived while the model ran the step: the engine core
    applies them right before update_from_output (_process_aborts_queue)."""
    if watch.aborts:
        scheduler.finish_requests(list(watch.aborts), RequestStatus.FINISHED_ABORTED)
        watch.aborts.clear()


def _note_stale(scheduler, watch, ids, index):
    """The requests of step ``index``'s output preempted by a later
    schedule() (their share of it is stale), with their num_tokens now."""
    for rid in ids:
        if watch.preempted_at.get(rid, 0) > index and rid in scheduler.requests:
            watch.stale[rid] = (scheduler.requests[rid], scheduler.requests[rid].num_tokens)


def _sends_done(scheduler, watch, index):
    """A producer's sends reported done in the output of step ``index``: those
    begun before it (the worker learns a request finished from the next
    schedule() and reports the send in that step's output)."""
    connector = scheduler.connector
    sending = {r for r in connector.sends_in_flight if r in scheduler.requests
               and watch.send_started.get(r, index + 1) <= index}
    connector.sends_in_flight -= sending
    for rid in sending:
        watch.send_started.pop(rid, None)
    return sending


def _drain(scheduler, watch, max_steps=400):
    for _ in range(max_steps):
        if not scheduler.requests and not watch.queue:
            return
        _step(scheduler, watch)
    for rid in list(scheduler.requests):  # stalled: end them
        scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
    while scheduler.requests or watch.queue:
        _step(scheduler, watch)


def _assert_no_leaked_blocks(scheduler):
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == NUM_BLOCKS - 1, (
        f"{pool.get_num_free_blocks()} free blocks after every request finished, "
        f"expected {NUM_BLOCKS - 1} (all but the null block); groups: {_describe_groups()}"
    )
    held = [(b.block_id, b.ref_cnt) for b in pool.blocks if b.ref_cnt and not b.is_null]
    assert not held, f"blocks still referenced (block_id, ref_cnt): {held}"



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
            or any(queued[1].total_num_scheduled_tokens > 0 for queued in getattr(watch, "queue", ()))
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



def test_scheduler_running_request_progresses_repro(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    init_none_hash(sha256)
    scheduler = _make_scheduler(tmp_path)
    watch = _Watch(scheduler)
    scheduler.add_request(_make_request("r0", PROMPT_R0, max_tokens=1))
    _step(scheduler, watch)  # step 1
    _step(scheduler, watch, invalid_block_ids={1, 2, 3, 4})  # step 2
    for _ in range(5):  # steps 3-7
        _step(scheduler, watch)
    # Step 8 (it scheduled {}): the step where 'running-request-progresses' broke.
    out = _step(scheduler, watch)
    _check_running_requests_progress(scheduler, out, watch, step=8)

    # Every request runs to its end; then the pool must be whole again.
    _drain(scheduler, watch)
    _assert_no_leaked_blocks(scheduler)
