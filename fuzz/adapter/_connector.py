"""A scripted KV connector, loaded by vLLM by module path.

vLLM builds the scheduler-side connector itself (``KVConnectorFactory`` with
``KVTransferConfig(kv_connector="ScriptedConnector",
kv_connector_module_path="fuzz.adapter._connector")``), so the scenario cannot
hand it constructor arguments. Its behaviour lives in the process-global
:data:`SCRIPT`, which the scheduler harness resets per scenario: what each
``get_num_new_matched_tokens`` call answers, and whether the connector claims
``supports_divergent_local_hybrid_hits``. The connector never loads or saves
anything; it records every protocol call the scheduler made, in the suite's
own types (:mod:`fuzz.model`), for the connector-protocol invariants
(:mod:`invariants.connector`): each ``get_num_new_matched_tokens`` and its
answer, each ``update_state_after_alloc`` with its per-group block ids, each
``build_connector_meta`` with the requests its scheduler output names, each
``request_finished`` / ``request_finished_all_groups`` (with the harness's
hand-off record, :mod:`fuzz.adapter._handoff`). Its own store
(``ExternalReply("saved")``) holds what finished requests computed, in whole
blocks and under each request's namespace, so a "saved" answer is honest by
construction and never serves one tenant's KV to another.

Replies are described by :class:`fuzz.model.ExternalReply` (pure data, no
vLLM), so strategies can draw them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import base as _base
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)

# The base class warns "experimental API" on every construction: once per
# scenario here, which floods the output and costs time.
logging.getLogger(_base.__name__).setLevel(logging.ERROR)

from fuzz.adapter import _compat  # noqa: E402
from fuzz.model import ExternalReply, saved_prefix  # noqa: E402
from fuzz.adapter._contents import namespace_within  # noqa: E402
from fuzz.model import ConnectorFinish, ConnectorMeta, HandOff, HarnessError  # noqa: E402

__all__ = [
    "CONNECTOR_MODULE",
    "CONNECTOR_NAME",
    "SCRIPT",
    "AllocRecord",
    "ConnectorScript",
    "QueryRecord",
    "ScriptedConnector",
]

CONNECTOR_NAME = "ScriptedConnector"
CONNECTOR_MODULE = __name__


def transfer_config(kv_load_failure_policy: str, kv_role: str = "kv_both") -> KVTransferConfig:
    """The ``KVTransferConfig`` that makes vLLM load this connector by module path."""
    return KVTransferConfig(
        kv_connector=CONNECTOR_NAME,
        kv_connector_module_path=CONNECTOR_MODULE,
        kv_role=kv_role,
        kv_load_failure_policy=kv_load_failure_policy,
    )

@dataclasses.dataclass(frozen=True)
class QueryRecord:
    """One ``get_num_new_matched_tokens(request, num_computed_tokens)`` call."""

    request_id: str
    num_tokens: int
    num_computed_tokens: int
    reply: int | None
    load_async: bool


@dataclasses.dataclass(frozen=True)
class AllocRecord:
    """One ``update_state_after_alloc(request, blocks, num_external_tokens)`` call."""

    request_id: str
    block_ids: tuple[tuple[int, ...], ...]
    num_external_tokens: int


@dataclasses.dataclass
class ConnectorScript:
    """The scenario's instructions to the connector, plus what it recorded."""

    divergent_hits: bool = True
    default: ExternalReply = dataclasses.field(default_factory=ExternalReply)
    replies: dict[str, ExternalReply] = dataclasses.field(default_factory=dict)
    queries: list[QueryRecord] = dataclasses.field(default_factory=list)
    allocs: list[AllocRecord] = dataclasses.field(default_factory=list)
    finished: list[str] = dataclasses.field(default_factory=list)
    finish_calls: list[ConnectorFinish] = dataclasses.field(default_factory=list)
    metas: list[ConnectorMeta] = dataclasses.field(default_factory=list)
    loads_in_flight: set[str] = dataclasses.field(default_factory=set)
    # Requests handed an async load of their whole prompt (answered once).
    whole_prompt_sent: set[str] = dataclasses.field(default_factory=set)
    # The connector's own store: token prefixes requests computed, saved in
    # whole blocks of ``save_unit`` tokens when they finished, each under its
    # request's namespace (fuzz.adapter._contents.namespace_of): KV is the
    # tokens' under that salt, adapter, embeddings and images, no other's.
    saved: list[tuple[str, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    # Request id -> its namespace, as the harness added it ("" unknown: none).
    namespaces: dict[str, str] = dataclasses.field(default_factory=dict)
    # The harness's hand-off record (fuzz.adapter._handoff.HandOffWatch.hand_off),
    # called at each request_finished; None: no harness watches.
    on_finish: Callable[[Any, Any], HandOff | None] | None = None
    save_unit: int = 1
    # A producer's hand-offs not yet reported done (finished_sending): the
    # requests whose blocks it holds after request_finished returned True.
    sends_in_flight: set[str] = dataclasses.field(default_factory=set)
    # Per send in flight, the per-group block ids request_finished handed
    # over: the worker reads them until it reports the send done.
    send_blocks: dict[str, tuple[tuple[int, ...], ...]] = dataclasses.field(default_factory=dict)

    def reset(self, *, divergent_hits: bool) -> None:
        self.divergent_hits = divergent_hits
        self.saved.clear()
        self.save_unit = 1
        self.default = ExternalReply()
        self.replies.clear()
        self.queries.clear()
        self.allocs.clear()
        self.finished.clear()
        self.finish_calls.clear()
        self.metas.clear()
        self.loads_in_flight.clear()
        self.whole_prompt_sent.clear()
        self.sends_in_flight.clear()
        self.send_blocks.clear()
        self.namespaces = {}
        self.on_finish = None

    def watch(self, on_finish: Callable[[Any, Any], HandOff | None], namespaces: dict[str, str]) -> None:
        """A harness's record: its hand-off watch, and each request's namespace."""
        self.on_finish, self.namespaces = on_finish, namespaces

    def reply_for(self, request_id: str) -> ExternalReply:
        return self.replies.get(request_id, self.default)

    def times_asked(self, request_id: str) -> int:
        return sum(q.request_id == request_id for q in self.queries)

    def save(self, tokens: tuple[int, ...], namespace: str = "") -> None:
        whole = len(tokens) // self.save_unit * self.save_unit
        if whole:
            self.saved.append((namespace, tokens[:whole]))

    def saved_prefix(self, tokens: tuple[int, ...], namespace: str = "") -> int:
        """The longest prefix of ``tokens``, in whole saved blocks, the store
        holds under ``namespace``: as far as an entry's tokens agree and it
        was saved under the same namespace as far as the prefix goes (an
        image counts from its placeholder on: namespace_within)."""
        best = 0
        for theirs, entry in self.saved:
            n = saved_prefix([entry], tokens, self.save_unit)
            while n > best and namespace_within(theirs, n) != namespace_within(namespace, n):
                n -= self.save_unit
            best = max(best, n)
        return best


SCRIPT = ConnectorScript()


class _Metadata(KVConnectorMetadata):
    pass


class ScriptedConnector(KVConnectorBase_V1, SupportsHMA):
    """Scheduler-side connector whose answers come from :data:`SCRIPT`."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.script = SCRIPT
        self.producer = vllm_config.kv_transfer_config.kv_role == "kv_producer"

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return self.script.divergent_hits

    # -- scheduler side ---------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        plan = self.script.reply_for(request.request_id)
        asked = self.script.times_asked(request.request_id)
        # The prompt as vLLM records it (zeros for one sent as embeddings).
        prompt = tuple(request.all_token_ids[: request.num_prompt_tokens])
        namespace = self.script.namespaces.get(request.request_id, "")
        saved = self.script.saved_prefix(prompt, namespace) if plan.kind == "saved" else 0
        reply = plan.answer(request.num_tokens, num_computed_tokens, asked, saved,
                            whole_prompt_sent=request.request_id in self.script.whole_prompt_sent)
        if self.producer and reply:
            # A prefill instance's connector never loads (NIXL's and LMCache's
            # kv_producer side answer 0): a script that says otherwise puts
            # vLLM in a state no deployment reaches.
            raise HarnessError(
                f"the scripted kv_producer connector was told to answer {reply} external tokens "
                f"for {request.request_id} ({plan!r}); a producer's requests must get no external hit"
            )
        load_async = bool(plan.load_async and reply)
        self.script.queries.append(
            QueryRecord(request.request_id, request.num_tokens, num_computed_tokens, reply, load_async)
        )
        return reply, load_async

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        ids = tuple(tuple(g) for g in blocks.get_block_ids())
        self.script.allocs.append(AllocRecord(request.request_id, ids, num_external_tokens))
        if num_external_tokens and self.script.reply_for(request.request_id).load_async:
            self.script.loads_in_flight.add(request.request_id)
            asked = next(q for q in reversed(self.script.queries) if q.request_id == request.request_id)
            if asked.num_computed_tokens + num_external_tokens >= request.num_tokens:
                self.script.whole_prompt_sent.add(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        out = scheduler_output
        cached = out.scheduled_cached_reqs
        told = set(self.script.finished)
        new = tuple((n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs)
        old = tuple(zip(cached.req_ids, cached.num_computed_tokens))
        self.script.metas.append(
            ConnectorMeta(
                new_requests=new,
                cached_requests=old,
                num_scheduled=tuple(out.num_scheduled_tokens.items()),
                has_sync_kv_loads=_compat.has_sync_kv_loads(out),
                already_finished=tuple(r for r, _ in new + old if r in told),
            )
        )
        return _Metadata()

    def _finished(self, method: str, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self.script.finished.append(rid)
        hand_off = None if self.script.on_finish is None else self.script.on_finish(request, block_ids)
        self.script.finish_calls.append(
            ConnectorFinish(rid, method, request.status.name, self.script.finished.count(rid), hand_off)
        )
        # An offloading connector saves what the request computed (a failed
        # load's request computed nothing it could vouch for), under its namespace.
        if request.status.name != "FINISHED_ERROR":
            self.script.save(tuple(request.all_token_ids[: request.num_computed_tokens]),
                             self.script.namespaces.get(rid, ""))
        # A producer (a P/D prefill instance) hands a request that finished
        # normally to its decode instance: it holds the blocks until the
        # worker reports the send done (finished_sending), as NIXL's P side
        # does (nixl/pull_scheduler.py request_finished: delay_free_blocks
        # for FINISHED_LENGTH_CAPPED / FINISHED_STOPPED with any block;
        # an aborted or failed request is freed at once). kv_both never holds.
        # It answers with the parameters the decode instance pulls by
        # (do_remote_prefill and the blocks to read), as NIXL's P side does.
        if self.producer and request.status.name in ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED"):
            params = {"do_remote_prefill": True, "do_remote_decode": False,
                      "remote_block_ids": [list(g) for g in block_ids], "remote_request_id": rid}
            if not any(len(g) > 0 for g in block_ids):
                return False, params
            self.script.sends_in_flight.add(rid)
            self.script.send_blocks[rid] = tuple(tuple(g) for g in block_ids)
            return True, params
        return False, None

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        return self._finished("request_finished", request, (block_ids,))

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        return self._finished("request_finished_all_groups", request, block_ids)

    # -- worker side: never used, the scheduler runs alone ------------------
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise NotImplementedError("the scripted connector never loads KV")

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError("the scripted connector never loads KV")

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        raise NotImplementedError("the scripted connector never saves KV")

    def wait_for_save(self) -> None:
        raise NotImplementedError("the scripted connector never saves KV")
