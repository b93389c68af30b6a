"""The scripted KV connector a standalone repro loads by its own module path.

It answers ``get_num_new_matched_tokens`` from :data:`STORE` (each
request's recorded store rule) and records what the scheduler tells it;
it never moves KV.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)

from fuzz.model._kv import saved_prefix
from fuzz.kit._params import DIVERGENT_HITS, KV_ROLE, SAVED_STORE, SCHEDULER_BLOCK_SIZE, STORE


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
        # A producer (P/D prefill instance, KV_ROLE) holds a finished request's
        # blocks for its decode instance until the send is reported done.
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
        if SAVED_STORE:
            if kind == "saved":  # the connector's own store: what finished requests computed
                prompt = request.all_token_ids[: request.num_prompt_tokens]  # zeros for embeddings
                held = saved_prefix(self.saved, prompt, SCHEDULER_BLOCK_SIZE)
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
        if SAVED_STORE:
            if request.status.name != "FINISHED_ERROR":  # save what it computed, in whole blocks
                computed = list(request.all_token_ids[: request.num_computed_tokens])
                whole = len(computed) // SCHEDULER_BLOCK_SIZE * SCHEDULER_BLOCK_SIZE
                if whole:
                    self.saved.append(computed[:whole])
        if KV_ROLE == "kv_producer":
            # As NIXL's P side: a request that finished normally is sent, its
            # blocks held until finished_sending; an aborted one is freed at once.
            # It answers with what the decode instance pulls by.
            if request.status.name in ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED"):
                params = {"do_remote_prefill": True, "do_remote_decode": False,
                          "remote_block_ids": [list(g) for g in block_ids], "remote_request_id": rid}
                if not any(len(g) > 0 for g in block_ids):
                    return False, params
                self.sends_in_flight.add(rid)
                return True, params
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
