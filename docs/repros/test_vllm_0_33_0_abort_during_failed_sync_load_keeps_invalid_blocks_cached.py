"""Repro: Scheduler.schedule() violates 'failed-load-not-cached'.

Found and shrunk by the kvtrunc-fuzz property suite.

vLLM version: 0.33.0
target: direct
seed: 0
invariant: failed-load-not-cached
violation: [failed-load-not-cached] request r0's load failed (invalid_block_ids, kv_load_failure_policy='fail'), but blocks [[1, 2]] it was written into still carry a prefix-cache hash after the report

Scenario (as drawn):
    Scheduler(plain, Layout([FullAttentionSpec(block_size=4)], hash_block_size=1,
    num_blocks=19), max_num_batched_tokens=16, max_num_seqs=2,
    long_prefill_token_threshold=0, connector.supports_divergent_local_hybrid_hits=True,
    kv_load_failure_policy='fail'); 1 group, 19 blocks, 1 request, 1 schedule() step
"""

import json

import pytest
import torch
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

pytestmark = pytest.mark.cpu_test

# A tiny local model: vLLM reads its config.json only (no weights, no hub).
MODEL_CONFIG = {
    'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_size': 64, 'num_hidden_layers': 1,
    'num_attention_heads': 2, 'num_key_value_heads': 1, 'intermediate_size': 128, 'vocab_size': 1024,
    'max_position_embeddings': 4096, 'torch_dtype': 'float32',
}
SPECS = [FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)]
# Per group, what it holds of a request's prefix: every block (must-cover), the state
# at the boundary (whole-state), nothing (scratch); 'windowed' (skips old tokens): unchecked.
ROLES = ['must-cover']
NUM_BLOCKS = 19  # block 0 is the null block
NULL_BLOCK = 0
BLOCK_SIZE = 4  # the smallest prefix-cacheable group block, as the engine sets it
SCHEDULER_BLOCK_SIZE = 4  # LCM of the group block sizes
HASH_BLOCK_SIZE = 4
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 2
MAX_NUM_BATCHED_TOKENS = 16
ASYNC_SCHEDULING = False  # --no-async-scheduling: one batch in flight
KV_LOAD_FAILURE_POLICY = 'fail'
KV_ROLE = 'kv_both'
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
    'r0': ('store', 8, 0, 0, False),
}
# The answers the recorded run got, (num_computed_tokens, answer, async) per call.
RECORDED_ANSWERS = {
    'r0': [(0, 8, False)],
}

PROMPT_R0 = list(range(0, 12))  # 12 tokens


class ScriptedConnector(KVConnectorBase_V1, SupportsHMA):
    """A scheduler-side KV connector answering from STORE."""

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
        self.sends_in_flight = set()

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
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    def start_load_kv(self, forward_context, **kwargs):
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name):
        raise NotImplementedError

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        raise NotImplementedError

    def wait_for_save(self):
        raise NotImplementedError


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
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    model_config = ModelConfig(
        model=str(tmp_path),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
    )
    transfer = {}
    transfer = {
        "kv_transfer_config": KVTransferConfig(
            kv_connector="ScriptedConnector",
            kv_connector_module_path=__name__,  # this file
            kv_role=KV_ROLE,
            kv_load_failure_policy=KV_LOAD_FAILURE_POLICY,
        ),
    }
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=False,
            async_scheduling=ASYNC_SCHEDULING,  # False: --no-async-scheduling, one batch in flight
        ),
        cache_config=CacheConfig(
            block_size=BLOCK_SIZE,
            mamba_cache_mode="align",
        ),
        device_config=DeviceConfig(device="cpu"),
        **transfer,
    )
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False  # as on GPU (a CPU install turns it off)
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    scheduler = vllm_config.scheduler_config.get_scheduler_cls()(  # as EngineCore: AsyncScheduler if async
        vllm_config=vllm_config,
        kv_cache_config=_make_kv_cache_config(),
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZE,
        log_stats=False,
    )
    return scheduler


def _make_request(request_id, token_ids, max_tokens):
    """A request decoding ``max_tokens`` tokens after ``token_ids``."""
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
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


def computed_before(out):
    computed = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    for i, req_id in enumerate(cached.req_ids):
        computed.setdefault(req_id, cached.num_computed_tokens[i])
    return computed


class WorkerRecord:
    """The worker's own view of each request."""

    def __init__(self):
        self.tokens = {}
        self.prompt = {}

    def add(self, request_id, prompt):
        self.tokens[request_id] = list(prompt)
        self.prompt[request_id] = len(self.tokens[request_id])

    def known(self, request_id):
        return len(self.tokens.get(request_id, ()))

    def resync(self, out):
        """Take the token lists ``out`` resends."""
        for new in out.scheduled_new_reqs:
            if new.prompt_token_ids is not None:
                self.prompt.setdefault(new.req_id, len(new.prompt_token_ids))
            tokens = getattr(new, "prefill_token_ids", None) or new.prompt_token_ids
            if tokens is not None:
                self.tokens[new.req_id] = list(tokens)
        cached = out.scheduled_cached_reqs
        for rid, tokens in (getattr(cached, "all_token_ids", None) or {}).items():
            self.tokens[rid] = list(tokens)
        for rid, outputs in zip(cached.req_ids, getattr(cached, "num_output_tokens", None) or ()):
            if rid in self.prompt and self.prompt[rid] + outputs < self.known(rid):
                del self.tokens[rid][self.prompt[rid] + outputs :]

    def start(self, request_id, before):
        """Where ``request_id``'s scheduled tokens really start."""
        return before[request_id]

    def reaches_end(self, out, request_id, before):
        if request_id not in before:
            return False
        end = self.start(request_id, before) + out.num_scheduled_tokens[request_id]
        return end >= self.known(request_id)

    def sampled(self, request_id, tokens):
        self.tokens.setdefault(request_id, []).extend(tokens)


class _Watch:
    def __init__(self, scheduler):
        self.step = 0
        self.admissions = {}
        self.aborts = []  # aborts that arrive while the model runs the next step
        self.worker = WorkerRecord()  # what the model runner knows (see _worker_done)
        self.async_answers_seen = {}  # request id -> whether its answer this step was async
        sched, mgr = scheduler, scheduler.kv_cache_manager
        lookup = type(sched)._get_local_prefix_cache_hit

        def local_hit(request, max_cache_hit_length=None):
            limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
            joint_blocks, joint_hit, _ = type(mgr).get_computed_blocks(mgr, request, max_cache_hit_length)
            if hasattr(mgr.coordinator, "find_longest_cache_hit_per_group"):
                per_group = list(mgr.coordinator.find_longest_cache_hit_per_group(request.block_hashes, limit)[1])
            else:
                per_group = [joint_hit] * len(SPECS)
            result = lookup(sched, request, max_cache_hit_length)
            num_local = result[1]
            self.admissions[request.request_id] = dict(
                local_hit=num_local, lookup=_ids(result[0]),
                skips=bool(getattr(request.sampling_params, "skip_reading_prefix_cache", None)),
                diverged=bool(result[3]) if len(result) > 3 else False,
            )
            self.admissions[request.request_id].update(
                joint_hit=joint_hit, joint=_ids(joint_blocks), per_group=per_group
            )
            return result

        sched._get_local_prefix_cache_hit = local_hit
        allocate = type(mgr).allocate_slots

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
            return allocate(mgr, request, num_new_tokens, *args, **kwargs)

        mgr.allocate_slots = allocate_slots
        self.failed = {}  # failed loads reported this step: request id -> facts
        self.landed = {}  # request id -> failed blocks still cached as it left
        self.failed_waiting = {}
        self._watch_waiting_for_remote_kvs(sched, mgr)

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

    def take_admissions(self, scheduler, out):
        """After schedule()."""
        computed = computed_before(out)
        told = scheduler.connector.told
        for rid in list(self.admissions):
            adm = self.admissions[rid]
            if rid not in told or rid not in scheduler.requests or "local" not in adm:
                del self.admissions[rid]
                continue
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


def _step(scheduler, watch, failed_loads=(), invalid_block_ids=()):
    """One engine step."""
    watch.step += 1
    watch.admissions.clear()
    connector = scheduler.connector
    for record in (connector.told, connector.answers, connector.asked_with, connector.async_answers,
                   connector.told_blocks, connector.events, connector.metas):
        record.clear()
    watch.loads_in_flight = set(connector.loads_in_flight)
    watch.landed.clear()
    out = scheduler.schedule()
    watch.async_answers_seen = dict(scheduler.connector.async_answers)
    watch.take_admissions(scheduler, out)
    watch.worker.resync(out)
    before = computed_before(out)
    done = [watch.worker.reaches_end(out, rid, before) for rid in out.num_scheduled_tokens]
    sampled = [[1000 + watch.step % 24] if ends else [] for ends in done]
    for rid, tokens in zip(out.num_scheduled_tokens, sampled):
        watch.worker.sampled(rid, tokens)
    if watch.aborts:
        scheduler.finish_requests(list(watch.aborts), RequestStatus.FINISHED_ABORTED)
        watch.aborts.clear()
    recving = set()
    recving = set(scheduler.connector.loads_in_flight)
    scheduler.connector.loads_in_flight -= recving
    sending = set()
    watch.failed = _failed_facts(scheduler, watch, recving & set(failed_loads), set(invalid_block_ids))
    watch.failed_waiting.update({r: f for r, f in watch.failed.items() if f["how"] == "failed_recving"})
    connector_output = None
    if recving or invalid_block_ids or sending:
        connector_output = KVConnectorOutput(
            finished_sending=sending,
            finished_recving=recving,
            failed_recving=recving & set(failed_loads),
            invalid_block_ids=set(invalid_block_ids),
        )
    req_ids = list(out.num_scheduled_tokens)
    model_output = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
        kv_connector_output=connector_output,
    )
    scheduler.update_from_output(out, model_output)
    return out


def _busy(scheduler):
    """Requests left, or reports the worker still owes (loads, sends in flight)."""
    connector = scheduler.connector
    if connector.loads_in_flight or connector.sends_in_flight:
        return True
    return bool(scheduler.requests)


def _drain(scheduler, watch, max_steps=400):
    for _ in range(max_steps):
        if not _busy(scheduler):
            return
        _step(scheduler, watch)
    for rid in list(scheduler.requests):  # stalled: end them
        scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
    while _busy(scheduler):
        _step(scheduler, watch)


def _assert_no_leaked_blocks(scheduler):
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == NUM_BLOCKS - 1, (
        f"{pool.get_num_free_blocks()} free blocks after every request finished, "
        f"expected {NUM_BLOCKS - 1} (all but the null block); groups: {_describe_groups()}"
    )
    held = [(b.block_id, b.ref_cnt) for b in pool.blocks if b.ref_cnt and not b.is_null]
    assert not held, f"blocks still referenced (block_id, ref_cnt): {held}"


def _check_failed_load_not_cached(scheduler, out, watch, step):
    """No block a failed load was written into keeps a prefix-cache hash:
    after the report, and as a failed async load's request leaves
    WAITING_FOR_REMOTE_KVS (vLLM keeps a failed sync load's blocks cached
    under "recompute", on purpose: that case is left out)."""
    mgr = scheduler.kv_cache_manager
    for rid, f in watch.failed.items():
        if f["how"] == "invalid_block_ids" and KV_LOAD_FAILURE_POLICY == "recompute":
            continue
        cached = [g for g in _still_cached(mgr, f["blocks"]) if g]
        assert not cached, (
            f"step {step}: request {rid}'s load failed ({f['how']}, policy {KV_LOAD_FAILURE_POLICY!r}), but "
            f"blocks {cached} it was written into still carry a prefix-cache hash; groups: {_describe_groups()}"
        )
    for rid, (f, still) in watch.landed.items():
        cached = [g for g in still if g]
        assert not cached, (
            f"step {step}: request {rid}'s async load failed, but as it left WAITING_FOR_REMOTE_KVS blocks "
            f"{cached} it was written into carry a prefix-cache hash; groups: {_describe_groups()}"
        )


def test_scheduler_failed_load_not_cached_repro(tmp_path, monkeypatch):
    init_none_hash(sha256)
    scheduler = _make_scheduler(tmp_path)
    watch = _Watch(scheduler)
    scheduler.add_request(_make_request("r0", PROMPT_R0, max_tokens=2))
    watch.aborts.append("r0")  # arrives while the model runs the next step
    # Step 1 (it scheduled {'r0': 4}): the step where 'failed-load-not-cached' broke.
    out = _step(scheduler, watch, invalid_block_ids={1, 2})
    _check_failed_load_not_cached(scheduler, out, watch, step=1)

    # Every request runs to its end; then the pool must be whole again.
    _drain(scheduler, watch)
    _assert_no_leaked_blocks(scheduler)
