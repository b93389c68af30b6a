"""What the model runner of a standalone repro knows and returns.

The worker's record (the suite's own WorkerRecord) takes each
SchedulerOutput as a model runner does: whether a request's scheduled
tokens reach its end (then it samples), and the KV positions it computes.
With speculative decoding (SPECULATIVE_METHOD) the rejection sampler
accepts DRAFT_ACCEPTANCE drafts in turn and, sync, the drafter proposes
NUM_SPECULATIVE_TOKENS drafts after each step.
"""

from __future__ import annotations

from vllm.v1.outputs import DraftTokenIds

from fuzz.adapter._reports import computed_before
from fuzz.kit._params import (
    ASYNC_SCHEDULING,
    DRAFT_ACCEPTANCE,
    NUM_SPECULATIVE_TOKENS,
    SPECULATIVE_METHOD,
    WATCH_TOKENS,
)


def _worker_done(out, watch):
    """Per request of ``out``, whether its scheduled tokens reach the end of
    the tokens the worker knows (then it samples), after the worker has
    taken the token lists the output resends and noted the KV it computes
    (WorkerRecord): decided from the output and the worker's own record,
    as a model runner decides it, never from scheduler.requests."""
    watch.worker.resync(out)
    before = computed_before(out)
    watch.starts = {rid: watch.worker.start(rid, before) for rid in out.num_scheduled_tokens if rid in before}
    if WATCH_TOKENS:
        for rid in out.num_scheduled_tokens:
            watch.worker.compute(out, rid, before, watch.step)
    return [watch.worker.reaches_end(out, rid, before) for rid in out.num_scheduled_tokens]


def _worker_sampled(watch, out, sampled):
    """The worker knows the tokens it sampled as soon as it sampled them.

    With speculation, the drafts it rejected too (vLLM learns them when it
    is fed the output)."""
    for rid, tokens in zip(out.num_scheduled_tokens, sampled):
        watch.worker.sampled(rid, tokens)
        if SPECULATIVE_METHOD is not None:
            if tokens:
                drafts = (out.scheduled_spec_decode_tokens or {}).get(rid) or ()
                watch.worker.rejected(rid, watch.step, len(drafts) - (len(tokens) - 1))


def _sampled(out, done, step):
    """The tokens the model runner samples for each request of ``out``: one
    for each whose scheduled tokens reach its end (done), none for a partial
    prefill chunk; with speculative decoding, the accepted drafts too."""
    if SPECULATIVE_METHOD is None:
        return [[1000 + step % 24] if ends else [] for ends in done]
    else:
        return _drafts_sampled(out, done, step)


def _drafts_sampled(out, done, step):
    """What the model runner samples: for each request whose scheduled tokens
    reach its end (done), the drafts the rejection sampler accepts then one
    token. A request admitted this step was padded with -1 rows (nothing to
    accept); otherwise, sync, the drafts before the first -1; async, every
    placeholder (the worker fills them with its drafts)."""
    new = {n.req_id for n in out.scheduled_new_reqs} | set(out.scheduled_cached_reqs.resumed_req_ids or ())
    sampled, position = [], 0
    for rid, ends in zip(out.num_scheduled_tokens, done):
        if not ends:
            sampled.append([])
            continue
        drafts = (out.scheduled_spec_decode_tokens or {}).get(rid) or []
        verifiable = 0
        if drafts and rid not in new:
            verifiable = len(drafts) if ASYNC_SCHEDULING else next(
                (i for i, t in enumerate(drafts) if t < 0), len(drafts))
        accepted = 0
        if verifiable:
            accepted = min(verifiable, DRAFT_ACCEPTANCE[(step + position) % len(DRAFT_ACCEPTANCE)])
            position += 1
        sampled.append([1000 + (step + i) % 24 for i in range(1 + accepted)])
    return sampled


def _propose_drafts(scheduler, out):
    """EngineCore.post_step (sync, when the model ran): the drafter's k drafts
    for every request of the batch, through update_draft_token_ids."""
    if out.total_num_scheduled_tokens == 0 or getattr(out, "skip_drafts", False):
        return
    ids = list(out.num_scheduled_tokens)
    drafts = [[3000 + i for i in range(NUM_SPECULATIVE_TOKENS)] for _ in ids]
    scheduler.update_draft_token_ids(DraftTokenIds(ids, drafts))
