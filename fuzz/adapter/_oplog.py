"""The operation log's vLLM side: reading a ``SchedulerOutput`` into the
suite's words, the run's configuration, and replaying a log on a fresh
scheduler.

:func:`replay_oplog` feeds vLLM exactly what the log says (requests, aborts,
hand-picked evictions, each step's ``ModelRunnerOutput``; the scripted
connector answers by each request's recorded rule) and returns the
``SchedulerOutput`` s it got, so a test can compare them with the log's.
A run's log lives on its harness (``SchedulerHarness.oplog``) and travels
with a failure (``InvariantViolation.oplog``); no process-wide copy is kept.
"""

from __future__ import annotations

import json
from typing import Any

from fuzz.adapter import _compat, _connector
from fuzz.adapter._build import build_scheduler
from fuzz.adapter._config import _MODEL_CONFIGS

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from fuzz.model import (  # noqa: E402
    Abort,
    AddRequest,
    Evict,
    FedOutput,
    OpLog,
    OpVisitor,
    ResetPrefixCache,
    RunConfig,
    ScheduledOutput,
    SchedulerDraw,
    Step,
)

__all__ = ["KV_CONFIG_FIELDS", "replay_oplog", "run_config", "scheduled_output"]

# What KV-cache planning writes onto the KVCacheConfig (fuzz.adapter._compat.record_resolved_sizes).
KV_CONFIG_FIELDS = ("prefix_cache_retention_interval", "hash_block_size", "cache_hit_alignment_tokens")

def run_config(draw: SchedulerDraw, built: Any, groups: tuple[Any, ...] = ()) -> RunConfig:
    cache = built.scheduler.vllm_config.cache_config
    kv = built.kv_config
    return RunConfig(
        draw=draw,
        model_json=json.dumps(draw.engine.config_dict() if draw.engine is not None else _MODEL_CONFIGS[draw.model]),
        block_size=cache.block_size,
        prefix_match_unit=cache.prefix_match_unit,
        scheduler_block_size=built.scheduler_block_size,
        hash_block_size=built.hash_block_size,
        max_model_len=built.scheduler.vllm_config.model_config.max_model_len,
        kv_config_fields=tuple((f, getattr(kv, f)) for f in KV_CONFIG_FIELDS if hasattr(kv, f)),
        groups=tuple(groups),
        null_block_id=built.scheduler.kv_cache_manager.block_pool.null_block.block_id,
    )


def scheduled_output(out: Any) -> ScheduledOutput:
    cached = out.scheduled_cached_reqs
    resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
    return ScheduledOutput(
        new_requests=tuple(
            (n.req_id, n.num_computed_tokens, tuple(tuple(g) for g in n.block_ids)) for n in out.scheduled_new_reqs
        ),
        cached_requests=tuple(
            (rid, cached.num_computed_tokens[i], rid in resumed) for i, rid in enumerate(cached.req_ids)
        ),
        num_scheduled=tuple(out.num_scheduled_tokens.items()),
        preempted=tuple(sorted(out.preempted_req_ids or ())),
        finished=tuple(sorted(out.finished_req_ids or ())),
        copies=tuple((c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or ()),
    )


def model_runner_output(fed: FedOutput) -> Any:
    """The ``ModelRunnerOutput`` a :class:`FedOutput` describes."""
    failure_kw = {"failed_recving": set(fed.failed_recving)} if _compat.HAS_FAILED_RECVING else {}
    connector = (
        KVConnectorOutput(
            finished_sending=set(fed.finished_sending),
            finished_recving=set(fed.finished_recving),
            invalid_block_ids=set(fed.invalid_block_ids),
            **failure_kw,
        )
        if fed.finished_recving or fed.failed_recving or fed.invalid_block_ids or fed.finished_sending
        else None
    )
    return ModelRunnerOutput(
        req_ids=list(fed.req_ids),
        req_id_to_index={r: i for i, r in enumerate(fed.req_ids)},
        sampled_token_ids=[list(t) for t in fed.sampled_token_ids],
        kv_connector_output=connector,
    )


def request_of(op: AddRequest, hash_block_size: int, lookahead: int = 0) -> Request:
    """The vLLM ``Request`` that ``op`` adds (the harness's and a replay's):
    ``SamplingParams.skip_reading_prefix_cache`` only when set (None is
    vLLM's default), its cache salt, LoRA adapter and multimodal items
    (the caller grants the scheduler an encoder budget first:
    :func:`grant_budget_for`); a request sending
    prompt embeddings has no token ids and no skip. ``lookahead``: the
    tokens after each block its hash covers, as ``EngineCore`` builds the
    hasher (``VllmConfig.num_hash_lookahead_tokens``: an EAGLE drafter
    without a KV connector); 0, the legacy hashes."""
    hasher = _compat.request_block_hasher(hash_block_size, lookahead)
    return Request(
        request_id=op.request_id,
        prompt_token_ids=list(op.token_ids),
        sampling_params=SamplingParams(
            max_tokens=op.max_tokens,
            ignore_eos=op.ignore_eos,
            **({"skip_reading_prefix_cache": True} if op.skip_reading_prefix_cache else {}),
        ),
        pooling_params=None,
        block_hasher=hasher,
        **({"cache_salt": op.cache_salt} if op.cache_salt else {}),
        **_compat.request_lora_kw(op.lora),
        **_compat.request_mm_kw(op.mm),
    ) if op.embeds is None else Request(
        request_id=op.request_id,
        prompt_token_ids=None,
        prompt_embeds=_compat.prompt_embeds(op.embeds, len(op.token_ids)),
        sampling_params=SamplingParams(max_tokens=op.max_tokens, ignore_eos=op.ignore_eos),
        pooling_params=None,
        block_hasher=hasher,
        **({"cache_salt": op.cache_salt} if op.cache_salt else {}),
        **_compat.request_lora_kw(op.lora),
    )


def grant_budget_for(scheduler: Any, op: AddRequest) -> None:
    """Before ``op``'s request reaches ``scheduler``: the encoder budget its
    multimodal items need (none for a text-only request)."""
    if op.mm:
        _compat.grant_encoder_budget(scheduler, max(length for *_, length in op.mm))


def replay_oplog(log: OpLog) -> list[ScheduledOutput | None]:
    """Run ``log`` on a fresh scheduler; one output per ``schedule()`` (None
    where it raised; replay stops there). Each fed output goes to the step it
    belongs to (``Step.fed_step``: async scheduling feeds one step late)."""
    replay = _Replay(build_scheduler(log.config.draw))
    for op in log.ops:
        if not replay.visit(op):
            break
    return replay.outputs


class _Replay(OpVisitor[bool]):
    """Each operation done to a fresh scheduler; False: the replay stops there."""

    def __init__(self, built: Any) -> None:
        self.built, self.sched, self.script = built, built.scheduler, _connector.SCRIPT
        self.outputs: list[ScheduledOutput | None] = []
        self.scheduled: dict[int, Any] = {}  # step index -> its SchedulerOutput, until fed back
        self.during: list[str] = []  # aborts that arrive while the model runs the next step

    def on_add_request(self, op: AddRequest) -> bool:
        if op.reply is not None:
            self.script.replies[op.request_id] = op.reply
        grant_budget_for(self.sched, op)
        self.sched.add_request(request_of(op, self.built.hash_block_size, _compat.hash_lookahead(self.sched)))
        return True

    def on_abort(self, op: Abort) -> bool:
        if op.during_step:  # applied inside the next step
            self.during.append(op.request_id)
        else:
            self.sched.finish_requests(op.request_id, RequestStatus.FINISHED_ABORTED)
        return True

    def on_evict(self, op: Evict) -> bool:
        self.sched.kv_cache_manager.evict_blocks(set(op.block_ids))
        return True

    def on_reset_prefix_cache(self, op: ResetPrefixCache) -> bool:
        try:
            self.sched.reset_prefix_cache(op.reset_running)
        except Exception:  # noqa: BLE001 - the log's next step says it raised
            self.outputs.append(None)
            return False
        return True

    def on_step(self, op: Step) -> bool:
        sched = self.sched
        out = None
        if op.output is not None or op.error is not None:  # else: no schedule() (async, nothing left)
            try:
                out = sched.schedule()
            except Exception:  # noqa: BLE001 - the log says where it raised
                self.outputs.append(None)
                return False
            self.outputs.append(scheduled_output(out))
            self.scheduled[op.index] = out
        if op.fed is None:
            if op.error is not None or out is None:
                return False
            # Async scheduling: this step's output is fed later; aborts
            # that came during it are applied after it.
            if self.during:
                sched.finish_requests(self.during, RequestStatus.FINISHED_ABORTED)
                self.during = []
            return True
        self.script.loads_in_flight.difference_update(op.fed.finished_recving)
        self.script.loads_in_flight.difference_update(op.fed.failed_recving)
        try:
            if self.during:  # EngineCore._process_aborts_queue, before update_from_output
                sched.finish_requests(self.during, RequestStatus.FINISHED_ABORTED)
                self.during = []
            sched.update_from_output(self.scheduled.pop(op.fed_step or op.index), model_runner_output(op.fed))
            if op.fed.drafts:  # EngineCore.post_step hands the drafter's proposals over
                ids = [r for r, _ in op.fed.drafts]
                sched.update_draft_token_ids(DraftTokenIds(ids, [list(d) for _, d in op.fed.drafts]))
        except Exception:  # noqa: BLE001
            return False
        return True
