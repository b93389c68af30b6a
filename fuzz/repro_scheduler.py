"""Standalone repros of scheduler-tier failures, written from the operation log.

The log (:class:`fuzz.model.OpLog`) says everything a run did to vLLM; this
module turns it into a pytest file in vLLM's ``tests/v1/core`` idiom that
imports vLLM and the standard library only:

* ``pytestmark = pytest.mark.cpu_test``, small ``_make_*`` helpers, the
  model's ``config.json`` written into ``tmp_path`` (never a hub);
* a scripted KV connector class in the file itself, loaded through
  ``KVTransferConfig`` by the file's own module path (``__name__``), which
  answers by each request's recorded store rule (the answers the recorded
  run got are listed beside it);
* the program: each request, abort, hand-picked eviction and step, in order,
  with the ``ModelRunnerOutput`` each step feeds back computed as the
  harness computed it (one sampled token per finished prefill, async loads
  reported done or failed), so a fixed vLLM that schedules differently is
  still driven sensibly;
* at the step where the invariant broke, the same claim, checked on vLLM's
  own objects, with a message naming the group, its block size and the
  numbers; then every request is run to the end and the pool must be whole
  again (vLLM's own leak check: every block but the null block free, no
  ``ref_cnt`` left).

It fails on the vLLM that produced it and passes once the bug is gone.
:func:`shrink_oplog` first drops whatever the failure does not need (requests,
their twins, fills and probes; trailing steps), by replaying the log through
the harness with every check on. :data:`WRITABLE` names the invariants the
file can state on vLLM's objects; for the others no file is written.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import textwrap
from typing import Any
from collections.abc import Callable, Iterable

from fuzz import adapter
from fuzz.model import Abort, AddRequest, Evict, InvariantViolation, OpLog, SpecDraw, Step
from fuzz.model import group_behaviour
from fuzz.model import Behaviour, classification_of_kind

__all__ = ["WRITABLE", "repro_size", "scheduler_repro", "scheduler_repro_from_last_run", "shrink_oplog"]

# Invariant -> the check function emitted into the file (None: the step itself
# must not raise; the pool check is in every file).
_CHECK_OF = {
    "no-exception": None,
    "no-leaked-blocks": None,
    "computed-below-num-tokens": "_check_computed_below_num_tokens",
    "copy-source-ready": "_check_copy_sources_ready",
    "computed-adds-up": "_check_computed_tokens_add_up",
    "local-part-covered": "_check_local_part_covered",
    "truncated-view": "_check_truncated_view",
    "mamba-state-at-boundary": "_check_mamba_state_at_resume_boundary",
    "diverged-falls-back": "_check_diverged_hit_falls_back",
    "skip-reads-no-cache": "_check_skipping_request_reads_no_cache",
    # The KV-connector protocol (invariants/connector.py).
    "external-contiguous": "_check_external_range_contiguous",
    "load-blocks-cover": "_check_load_blocks_cover_range",
    "told-external-accounted": "_check_told_external_accounted",
    "meta-built-once": "_check_meta_built_once",
    "sync-load-announced": "_check_sync_load_announced",
    "finished-once": "_check_finished_once",
    "stale-output-dropped": "_check_stale_output_dropped",
    "dropped-answer-loads-nothing": "_check_dropped_answer_loads_nothing",
    "meta-names-scheduled": "_check_meta_names_scheduled",
    "async-load-lands-first": "_check_async_load_lands_first",
    "failed-load-recomputed": "_check_failed_load_recomputed",
    "failed-load-not-cached": "_check_failed_load_not_cached",
    # Block ownership (invariants/ownership.py).
    "read-blocks-held": "_check_read_blocks_held",
    "same-step-hazard": "_check_no_same_step_hazard",
    "reservation-covers-allocation": "_check_reservation_covers_allocation",
    "lookup-within-limit": "_check_lookup_within_limit",
    # Speculative decoding (invariants/scheduler.py).
    "rejected-drafts-rolled-back": "_check_rejected_drafts_rolled_back",
    # Liveness (invariants/scheduler.py).
    "running-request-progresses": "_check_running_requests_progress",
    # What a block holds (invariants/scheduler.py).
    "kv-matches-tokens": "_check_kv_matches_tokens",
    "reads-written": "_check_reads_written",
    "index-written": "_check_index_written",
}
WRITABLE = frozenset(_CHECK_OF)

# The invariants stated on the model of block contents (the file carries
# fuzz/adapter/_contents.py and keeps it as it drives the scheduler).
_CONTENTS = frozenset({"reads-written", "index-written"})

# The invariants whose checks need READ_RULES (which blocks a step reads).
_READS = frozenset({"read-blocks-held", "same-step-hazard"}) | _CONTENTS

# ... and those stated on what the watch recorded inside schedule(), so that
# they hold even when schedule() raises after the broken call.
_EVEN_IF_IT_RAISES = frozenset({"reservation-covers-allocation", "lookup-within-limit"})

_ROLE = {Behaviour.MUST_COVER: "must-cover", Behaviour.MAY_BE_SHORT: "whole-state", Behaviour.SCRATCH: "scratch"}


# ---------------------------------------------------------------------------
# Shrinking the log
# ---------------------------------------------------------------------------


def _replay_checked(log: OpLog, invariant: str, checks: tuple[Callable[..., None], ...] | None = None) -> OpLog | None:
    """Run ``log``'s operations through a fresh harness with ``checks`` on
    (default: every check); the new log (up to the step that broke) when
    ``invariant`` still breaks."""
    from fuzz.runners.scheduler import ALL_CHECKS, Stepper
    from invariants.scheduler import check_no_leaked_blocks

    checks = ALL_CHECKS if checks is None else checks

    try:
        harness = adapter.SchedulerHarness(log.config.draw)
    except adapter.InvalidLayout:
        return None
    run = Stepper(harness, checks)
    # The steps whose own schedule() admitted the synchronous loads a fed
    # output reports invalid (with async scheduling, fed one step late).
    sync_failing = {op.fed_step or op.index for op in log.steps if op.fed and op.fed.invalid_block_ids}
    try:
        for op in log.ops:
            if isinstance(op, AddRequest):
                harness.add_request(op.token_ids, max_tokens=op.max_tokens, reply=op.reply, request_id=op.request_id,
                                    skip_reading_prefix_cache=op.skip_reading_prefix_cache, cache_salt=op.cache_salt)
            elif isinstance(op, Abort):
                if op.during_step or op.request_id in harness.live_request_ids:
                    harness.abort(op.request_id, during_step=op.during_step)
            elif isinstance(op, Evict):
                harness.evict_shortcut(set(op.block_ids))
            elif isinstance(op, Step):
                if harness.broken:
                    break
                for rid in op.fed.failed_recving if op.fed else ():
                    harness.fail_async_load(rid)
                if op.index in sync_failing and harness.can_report_invalid_blocks:
                    harness.fail_next_sync_loads()
                run.step()
        run.drain()
        if not harness.broken and check_no_leaked_blocks in checks:
            check_no_leaked_blocks(harness.pool_observation())
    except InvariantViolation as exc:
        return harness.oplog if exc.invariant == invariant else None
    except Exception:  # noqa: BLE001 - another failure: not this one
        return None
    return None


def _without_request(log: OpLog, request_id: str) -> OpLog:
    ops = [op for op in log.ops if getattr(op, "request_id", None) != request_id]
    return OpLog(log.config, ops)


def _without_step(log: OpLog, index: int) -> OpLog:
    return OpLog(log.config, [op for op in log.ops if not (isinstance(op, Step) and op.index == index)])


def _without_group(log: OpLog, index: int) -> OpLog:
    draw = log.config.draw
    groups = draw.layout.groups[:index] + draw.layout.groups[index + 1 :]
    layout = dataclasses.replace(draw.layout, groups=groups)
    config = dataclasses.replace(log.config, draw=dataclasses.replace(draw, layout=layout))
    return OpLog(config, list(log.ops))


def shrink_oplog(
    log: OpLog, invariant: str, *, budget: int = 60, checks: tuple[Callable[..., None], ...] | None = None
) -> OpLog:
    """Drop the KV-cache groups, then the requests, then the steps that
    ``invariant``'s failure does not need (greedy, one at a time, each
    candidate replayed with every check), and cut the log at the step that
    breaks. At most ``budget`` replays, each with ``checks`` (default: all)."""
    current = _replay_checked(log, invariant, checks)
    if current is None:
        return log  # not reproducible by replay: keep what was recorded
    tries = 1
    changed = True
    while changed and tries < budget:
        changed = False
        # An engine-planned configuration keeps its groups: the engine decides them.
        groups = len(current.config.draw.layout.groups) if current.config.draw.engine is None else 0
        for index in range(groups if groups > 1 else 0):
            if tries >= budget:
                break
            tries += 1
            smaller = _replay_checked(_without_group(current, index), invariant, checks)
            if smaller is not None:
                current, changed = smaller, True
                break
        if changed:
            continue
        for req in list(current.requests):
            if tries >= budget:
                break
            tries += 1
            smaller = _replay_checked(_without_request(current, req.request_id), invariant, checks)
            if smaller is not None:
                current, changed = smaller, True
                break
        if changed:
            continue
        for step in reversed(current.steps[:-1]):
            if tries >= budget:
                break
            tries += 1
            smaller = _replay_checked(_without_step(current, step.index), invariant, checks)
            if smaller is not None and len(smaller.steps) < len(current.steps):
                current, changed = smaller, True
                break
    return current


def _broken_step(log: OpLog) -> int:
    """The step a check failed after: the log's last step (the runners stop there)."""
    return log.steps[-1].index if log.steps else 0


def repro_size(log: OpLog) -> dict[str, int]:
    """Groups, blocks, requests and ``schedule()`` steps up to the failure."""
    return log.until_step(_broken_step(log)).size()


# ---------------------------------------------------------------------------
# Writing the file
# ---------------------------------------------------------------------------


def _spec_code(draw: SpecDraw) -> str:
    cls, kwargs = adapter.spec_constructor(draw)
    args = ", ".join(f"{k}={_value(v)}" for k, v in kwargs.items())
    return f"{cls.__name__}({args})"


def _value(v: object) -> str:
    if isinstance(v, SpecDraw):
        return _spec_code(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, tuple):
        items = [_value(x) for x in v]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return repr(v)


def _spec_classes(draws: Iterable[SpecDraw]) -> set[str]:
    out: set[str] = set()
    for d in draws:
        out.add(adapter.spec_constructor(d)[0].__name__)
        out |= _spec_classes(d.inner)
    return out


def _tokens(name: str, tokens: tuple[int, ...]) -> str:
    if len(tokens) >= 2 and tokens[1] > tokens[0]:
        start, stride = tokens[0], tokens[1] - tokens[0]
        if tokens == tuple(range(start, start + stride * len(tokens), stride)):
            step = "" if stride == 1 else f", {stride}"
            return f"{name} = list(range({start}, {start + stride * len(tokens)}{step}))  # {len(tokens)} tokens"
    body = textwrap.fill(", ".join(map(str, tokens)), 84, initial_indent="    ", subsequent_indent="    ")
    return f"{name} = [\n{body}\n]  # {len(tokens)} tokens"


def _const(request_id: str) -> str:
    return "PROMPT_" + "".join(c if c.isalnum() else "_" for c in request_id).upper()


def _program(log: OpLog, broken: int, invariant: str) -> list[str]:
    """The test body's lines, up to and including the step that breaks."""
    lines: list[str] = []
    pending_plain = 0
    first_plain = 0
    # Async scheduling feeds a step's output a step late: the contents model
    # learns which blocks its synchronous loads fail at the step that issues them.
    failing_at = {
        op.fed_step: set(op.fed.invalid_block_ids)
        for op in log.steps
        if invariant in _CONTENTS and op.fed is not None and op.fed.invalid_block_ids and op.fed_step is not None
    }

    def flush() -> None:
        nonlocal pending_plain
        if pending_plain == 1:
            lines.append(f"    _step(scheduler, watch)  # step {first_plain}")
        elif pending_plain > 1:
            lines.append(f"    for _ in range({pending_plain}):  # steps {first_plain}-{first_plain + pending_plain - 1}")
            lines.append("        _step(scheduler, watch)")
        pending_plain = 0

    for op in log.until_step(broken).ops:
        if isinstance(op, Step):
            fed = op.fed
            args = ""
            if fed is not None and fed.failed_recving:
                args += f", failed_loads={set(fed.failed_recving)!r}"
            if fed is not None and fed.invalid_block_ids:
                args += f", invalid_block_ids={set(fed.invalid_block_ids)!r}"
            if op.index in failing_at:
                args += f", failing_blocks={failing_at[op.index]!r}"
            if op.index == broken:
                flush()
                lines += _breaking_step(op, args, invariant)
            elif args:
                flush()
                lines.append(f"    _step(scheduler, watch{args})  # step {op.index}")
            else:
                if pending_plain == 0:
                    first_plain = op.index
                pending_plain += 1
            continue
        flush()
        if isinstance(op, AddRequest):
            skip = ", skip_reading_prefix_cache=True" if op.skip_reading_prefix_cache else ""
            lines.append(
                f'    scheduler.add_request(_make_request("{op.request_id}", {_const(op.request_id)}, '
                f"max_tokens={op.max_tokens}{skip}))"
            )
        elif isinstance(op, Abort) and op.during_step:
            lines.append(f'    watch.aborts.append("{op.request_id}")  # arrives while the model runs the next step')
        elif isinstance(op, Abort):
            lines.append(f'    scheduler.finish_requests("{op.request_id}", RequestStatus.FINISHED_ABORTED)')
        elif isinstance(op, Evict):
            lines.append("    # Blocks dropped from the prefix cache by hand (the search shortcut).")
            lines.append(f"    scheduler.kv_cache_manager.evict_blocks({set(op.block_ids)!r})")
    flush()
    return lines


def _breaking_step(op: Step, args: str, invariant: str) -> list[str]:
    sched = "" if op.output is None else f" (it scheduled {dict(op.output.num_scheduled)})"
    if invariant == "no-exception":
        what = op.error or "an exception"
        return [
            f"    # Step {op.index}: vLLM raised {what.splitlines()[0][:120]}{sched}.",
            "    # No exception may escape schedule() / update_from_output() for a",
            "    # configuration vLLM accepted: it kills the engine core.",
            "    try:",
            f"        _step(scheduler, watch{args})",
            "    except Exception as exc:",
            "        at = traceback.extract_tb(exc.__traceback__)[-1]",
            f'        pytest.fail(f"step {op.index}: {{type(exc).__name__}}({{exc}}) escaped the scheduler from "',
            '                    f"{at.name} ({at.filename.rsplit(\'/vllm/\', 1)[-1]}:{at.lineno}); "',
            '                    f"groups: {_describe_groups()}")',
        ]
    check = _CHECK_OF[invariant]
    if check is None:  # the pool check at the end states it
        return [f"    _step(scheduler, watch{args})  # step {op.index}"]
    if invariant in _EVEN_IF_IT_RAISES:
        return [
            f"    # Step {op.index}{sched}: the step where '{invariant}' broke.",
            "    # What schedule() did is checked even if it raised (the check needs no output).",
            "    out = None",
            "    try:",
            f"        out = _step(scheduler, watch{args})",
            "    finally:",
            f"        {check}(scheduler, out, watch, step={op.index})",
        ]
    return [
        f"    # Step {op.index}{sched}: the step where '{invariant}' broke.",
        f"    out = _step(scheduler, watch{args})",
        f"    {check}(scheduler, out, watch, step={op.index})",
    ]


def _roles(log: OpLog) -> list[str]:
    """Per group: must-cover, windowed (must-cover, but its attention span
    skips old tokens: the file's checks leave it out), whole-state, scratch."""
    roles = []
    for g, draw in zip(log.config.groups, log.config.draw.layout.groups):
        role = _ROLE.get(group_behaviour(g), "scratch")
        span = classification_of_kind(draw.kind).span
        if role == "must-cover" and span is not None and draw.param(span[0]) is not None:
            role = "windowed"
        roles.append(role)
    return roles


def _read_rules(log: OpLog) -> list[tuple[str, int]]:
    """Per group, which of a running request's blocks a step reads: the
    ownership model's rule (:func:`invariants.ownership.read_indices`), from
    the layout as the harness derives it."""
    from types import SimpleNamespace

    from fuzz.adapter._ownership import read_rules

    draws = log.config.draw.layout.groups
    spans = []
    for draw in draws:
        span = classification_of_kind(draw.kind).span
        value = None if span is None or draw.inner else draw.param(span[0])
        spans.append(None if value is None else (span[0], value))
    config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=adapter.build_spec(d)) for d in draws])
    behaviours = tuple(group_behaviour(g).value for g in log.config.groups)
    return list(read_rules(config, log.config.groups, tuple(spans), behaviours))


def scheduler_repro(
    log: OpLog, *, invariant: str, target: str, seed: object, violation: str, vllm_version: str | None = None
) -> str | None:
    """The source of a standalone pytest file reproducing ``log``'s failure of
    ``invariant`` at its last step (None when the file cannot state it)."""
    if invariant not in _CHECK_OF or not log.steps:
        return None
    from fuzz.repro import repro_header

    cfg = log.config
    draw = cfg.draw
    broken = _broken_step(log)
    size = repro_size(log)
    header = repro_header(
        title=f"Repro: Scheduler.schedule() violates '{invariant}'.",
        vllm_version=vllm_version or adapter.VLLM_VERSION,
        target=target,
        seed=seed,
        invariant=invariant,
        violation=violation,
        scenario=(
            f"{draw!r}; {size['groups']} groups, {size['blocks']} blocks, {size['requests']} requests, "
            f"{size['steps']} schedule() steps"
        ),
    )
    kinds = sorted(_spec_classes(draw.layout.groups) | {"KVCacheConfig", "KVCacheGroupSpec"})
    requests = log.until_step(broken).requests
    store = {r.request_id: None if r.reply is None else dataclasses.astuple(r.reply) for r in requests}
    answers = {r.request_id: [(a.num_computed_tokens, a.answer, a.load_async) for a in log.answers_for(r.request_id)]
               for r in requests}
    model = json.loads(cfg.model_json)
    lines = [
        header,
        "import json",
        "import traceback",
        "from collections.abc import Iterable, Mapping, Sequence",
        "from typing import Any",
        "",
        "import pytest",
        "import torch",
        "",
        "from vllm.config import (",
        "    CacheConfig,",
        "    DeviceConfig,",
        "    KVTransferConfig,",
        "    ModelConfig,",
        *(["    ParallelConfig,"] if draw.speculative_method is not None else []),
        "    SchedulerConfig,",
        *(["    SpeculativeConfig,"] if draw.speculative_method is not None else []),
        "    VllmConfig,",
        ")",
        "from vllm.distributed.kv_transfer.kv_connector.v1.base import (",
        "    KVConnectorBase_V1,",
        "    KVConnectorMetadata,",
        "    SupportsHMA,",
        ")",
        "from vllm.sampling_params import SamplingParams",
        "from vllm.utils.hashing import sha256",
        "from vllm.v1.core.kv_cache_utils import (",
        "    generate_scheduler_kv_cache_config,",
        *(["    get_group_id,"] if invariant in _CONTENTS else []),
        "    get_request_block_hasher,",
        "    init_none_hash,",
        ")",
        "from vllm.v1.core.sched.scheduler import Scheduler",
        "from vllm.v1.kv_cache_interface import (",
        *[f"    {k}," for k in kinds],
        ")",
        "from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput",
        "from vllm.v1.request import Request, RequestStatus",
        "from vllm.v1.structured_output import StructuredOutputManager",
        "",
        "pytestmark = pytest.mark.cpu_test",
        "",
        "# A tiny local model: vLLM reads its config.json only (no weights, no hub).",
        "MODEL_CONFIG = " + _wrap_dict(model),
        "SPECS = [",
        *[f"    {_spec_code(g)}," for g in draw.layout.groups],
        "]",
        f"# Per group, what it must hold of a request's local prefix: every block",
        f"# (must-cover), its state at the boundary (whole-state), nothing (scratch);",
        f"# 'windowed' groups skip old tokens (their window is not checked here).",
        f"ROLES = {_roles(log)!r}",
        *(
            [
                "# Per group, which block indices of its table a request computing tokens",
                "# [s, e) reads, block size b: 'full' [0, ceil(e/b)); ('window', W) from",
                "# (s-W+1)//b; ('chunk', C) from the chunk of s; ('rswa', W) the prompt's",
                "# blocks and from (s-W)//b; 'state' the state blocks at ceil(s/b)-1 (the",
                "# one it resumes from) and ceil(e/b)-1 (the one it writes); 'none' nothing.",
                f"READ_RULES = {_read_rules(log)!r}",
            ]
            if invariant in _READS
            else []
        ),
        f"NUM_BLOCKS = {draw.layout.num_blocks}  # block {cfg.null_block_id} is the null block",
        f"NULL_BLOCK = {cfg.null_block_id}",
        f"BLOCK_SIZE = {cfg.block_size}  # the smallest prefix-cacheable group block, as the engine sets it",
        f"PREFIX_MATCH_UNIT = {cfg.prefix_match_unit}",
        f"SCHEDULER_BLOCK_SIZE = {cfg.scheduler_block_size}  # LCM of the group block sizes",
        f"HASH_BLOCK_SIZE = {cfg.hash_block_size}",
        f"MAX_MODEL_LEN = {cfg.max_model_len}",
        f"MAX_NUM_SEQS = {draw.max_num_seqs}",
        f"MAX_NUM_BATCHED_TOKENS = {draw.max_num_batched_tokens}",
        f"LONG_PREFILL_TOKEN_THRESHOLD = {draw.long_prefill_token_threshold}",
        *(
            [f"PREFILL_SCHEDULE_INTERVAL = {draw.prefill_schedule_interval}  # --prefill-schedule-interval"]
            if draw.prefill_schedule_interval > 1
            else []
        ),
        *(_speculation_constants(draw) if draw.speculative_method is not None else []),
        f"KV_LOAD_FAILURE_POLICY = {draw.kv_load_failure_policy!r}",
        *(
            ["# The connector's kv_role: a P/D prefill instance (it never loads, so vLLM",
             "# frees blocks at once and may preempt a request whose step is in flight).",
             f"KV_ROLE = {draw.kv_role!r}"]
            if draw.kv_role != "kv_both"
            else []
        ),
        f"# What the engine's KV-cache planning writes onto the KVCacheConfig.",
        f"KV_CONFIG_FIELDS = {dict(cfg.kv_config_fields)!r}",
        f"# The connector's supports_divergent_local_hybrid_hits.",
        f"DIVERGENT_HITS = {draw.divergent_hits!r}",
        "",
        "# The external store, per request: (kind, tokens held, first answers",
        "# 'not yet', tokens over-reported, async). kind 'store': it holds the first",
        "# tokens-held tokens; 'zero': nothing; 'undecided': None for the first",
        "# answers, then as 'store'; 'over': more than the prompt (a contract breach);",
        "# 'saved': the connector's own store of what finished requests computed.",
        "STORE = " + _wrap_dict(store),
        "# The answers the recorded run got, (num_computed_tokens, answer, async) per call.",
        "RECORDED_ANSWERS = " + _wrap_dict(answers),
        "",
    ]
    for r in requests:
        lines.append(_tokens(_const(r.request_id), r.token_ids))
    lines.append("")
    body = _async_body(_BODY) if draw.async_scheduling else _BODY
    if draw.prefill_schedule_interval > 1:
        body = _with_prefill_cadence(body)
    if draw.kv_role != "kv_both":
        body = _with_kv_role(body)
    if draw.speculative_method is not None:
        body = _with_speculation(body, draw.async_scheduling)
    lines.append(body)
    lines.append(_worker_kit())
    if invariant in _CONTENTS:
        lines.append(_contents_kit())
    lines.append(_CHECKS.get(invariant, ""))
    lines += [
        "",
        "",
        f"def test_scheduler_{invariant.replace('-', '_')}_repro(tmp_path, monkeypatch):",
    ]
    if draw.model_runner is not None:
        lines.append(
            f'    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "{1 if draw.model_runner == "v2" else 0}")'
        )
    lines += [
        "    init_none_hash(sha256)",
        "    scheduler = _make_scheduler(tmp_path)",
        "    watch = _Watch(scheduler)",
        *(["    watch.contents = _make_contents(scheduler)"] if invariant in _CONTENTS else []),
        *_program(log, broken, invariant),
        "",
        "    # Every request runs to its end; then the pool must be whole again.",
        "    _drain(scheduler, watch)",
        "    _assert_no_leaked_blocks(scheduler)",
        "",
    ]
    return "\n".join(lines)


def _worker_kit() -> str:
    """The scripted model runner's record, as the suite keeps it: the source
    of :class:`fuzz.adapter._reports.WorkerRecord` and its helper, copied
    into the file (they import nothing but the standard library)."""
    from fuzz.adapter import _reports

    parts = [inspect.getsource(_reports.computed_before), inspect.getsource(_reports.WorkerRecord)]
    return "\n\n# The model runner's own record (the fuzz suite's WorkerRecord).\n\n" + "\n\n".join(parts)


def _contents_kit() -> str:
    """The model of block contents, as the suite keeps it: the source of
    :mod:`fuzz.adapter._contents` (standard library only), and the calls
    that keep it from what the file drives."""
    from fuzz.adapter import _contents

    marks = [f"{name} = {getattr(_contents, name)}" for name in ("COPIED_BEFORE_FILL", "COPIED_FROM_COPY", "FAILED_LOAD")]
    parts = [inspect.getsource(x) for x in (_contents.read_positions, _contents.BlockContents, _contents.entries_of)]
    return (
        "\n\n# What each block holds (the fuzz suite's BlockContents), kept from what the\n"
        "# model runner and the connector's worker see.\n"
        + "\n".join(marks) + "\n\n\n" + "\n\n".join(parts) + _CONTENTS_CALLS
    )


def _wrap_dict(d: dict) -> str:
    if not d:
        return "{}"
    items = [f"    {k!r}: {v!r}," for k, v in d.items()]
    return "{\n" + "\n".join(items) + "\n}"


def scheduler_repro_from_last_run(*, target: str, seed: object, invariant: str, violation: str) -> str | None:
    """The repro of the last scheduler run in this process (the minimal
    failing example: Hypothesis runs it last), shrunk further by replay."""
    log = adapter.last_oplog()
    if log is None or invariant not in _CHECK_OF:
        return None
    if _replay_checked(log, invariant) is None:
        return None  # the last run is not this failure (several failures replayed at once)
    log = shrink_oplog(log, invariant)
    return scheduler_repro(log, invariant=invariant, target=target, seed=seed, violation=violation)


_BODY = '''
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
            async_scheduling=False,  # --no-async-scheduling: one batch in flight
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
    return Scheduler(
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
        self.aborts = []  # aborts that arrive while the model runs the next step
        self.send_started = {}  # request id -> the first step begun after its send started
        self.worker = WorkerRecord(async_scheduling=False)  # what the model runner knows (see _worker_done)
        self.kv_wrong = []  # this step's positions computed from a token vLLM does not record (see _settle_tokens)
        self.contents = None  # what each block holds, where the file states it (see _make_contents)
        self.starts = {}  # request id -> where this step's tokens start (see _worker_done)
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
                diverged=bool(result[3]) if len(result) > 3 else False,
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
    """One engine step: schedule(), then what a model runner returns (a
    sampled token for each request whose prefill completes, none for a
    partial chunk; each async load in flight reported done, or failed)."""
    connector = scheduler.connector
    _begin_step(scheduler, watch)
    out = scheduler.schedule()
    watch.hold(scheduler, out)
    watch.preempted_at.update(dict.fromkeys(out.preempted_req_ids or (), watch.step))
    watch.async_answers_seen = dict(connector.async_answers)
    watch.settle(scheduler, out)
    ids = list(out.num_scheduled_tokens)
    sampled = [[1000 + watch.step % 24] if done else [] for done in _worker_done(out, watch)]
    _worker_sampled(watch, out, sampled)
    if watch.contents is not None:
        _contents_issue(scheduler, watch, out, sampled, invalid_block_ids)
    _abort_during_step(scheduler, watch)
    # Every load in flight, whether or not the scheduler still lists its request.
    recving = set(connector.loads_in_flight)
    connector.loads_in_flight -= recving
    if watch.contents is not None:
        for rid in recving:
            watch.contents.land_async_load(rid, watch.step, rid in set(failed_loads))
    sending = _sends_done(scheduler, watch, watch.step)
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
    watch.worker.fed(watch.step)
    scheduler.update_from_output(
        out,
        ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=connector_output,
        ),
    )
    _settle_tokens(scheduler, out, watch)
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
    schedule() and reports the send in that step's output), whether or not
    the scheduler still lists the request."""
    connector = scheduler.connector
    sending = {r for r in connector.sends_in_flight if watch.send_started.get(r, index + 1) <= index}
    connector.sends_in_flight -= sending
    for rid in sending:
        watch.send_started.pop(rid, None)
    return sending


def _worker_done(out, watch):
    """Per request of ``out``, whether its scheduled tokens reach the end of
    the tokens the worker knows (then it samples), after the worker has
    taken the token lists the output resends and noted the KV it computes
    (WorkerRecord): decided from the output and the worker's own record,
    as a model runner decides it, never from scheduler.requests."""
    watch.worker.resync(out)
    before = computed_before(out)
    watch.starts = {rid: watch.worker.start(rid, before) for rid in out.num_scheduled_tokens if rid in before}
    for rid in out.num_scheduled_tokens:
        watch.worker.write(out, rid, before, watch.step)
    return [watch.worker.reaches_end(out, rid, before) for rid in out.num_scheduled_tokens]


def _worker_sampled(watch, out, sampled):
    """The worker knows the tokens it sampled as soon as it sampled them, and
    the drafts it rejected (vLLM learns them when it is fed the output)."""
    for rid, tokens in zip(out.num_scheduled_tokens, sampled):
        watch.worker.sampled(rid, tokens)
        if tokens:
            drafts = (out.scheduled_spec_decode_tokens or {}).get(rid) or ()
            watch.worker.rejected(rid, watch.step, len(drafts) - (len(tokens) - 1))


def _settle_tokens(scheduler, out, watch):
    """After the step: the positions the worker computed for a live request,
    below its num_computed_tokens, whose token vLLM records differently."""
    preempted = (out.preempted_req_ids or ()) if out is not None else ()
    watch.kv_wrong = watch.worker.settle(scheduler.requests, preempted)


def _busy(scheduler, watch):
    """Requests left, or reports the worker still owes (loads, sends in flight)."""
    connector = scheduler.connector
    return bool(scheduler.requests or connector.loads_in_flight or connector.sends_in_flight)


def _drain(scheduler, watch, max_steps=400):
    for _ in range(max_steps):
        if not _busy(scheduler, watch):
            return
        _step(scheduler, watch)
    for rid in list(scheduler.requests):  # stalled: end them
        scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
    while _busy(scheduler, watch):
        _step(scheduler, watch)


def _assert_no_leaked_blocks(scheduler):
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == NUM_BLOCKS - 1, (
        f"{pool.get_num_free_blocks()} free blocks after every request finished, "
        f"expected {NUM_BLOCKS - 1} (all but the null block); groups: {_describe_groups()}"
    )
    held = [(b.block_id, b.ref_cnt) for b in pool.blocks if b.ref_cnt and not b.is_null]
    assert not held, f"blocks still referenced (block_id, ref_cnt): {held}"
'''

_CHECKS = {
    "failed-load-recomputed": '''

def _check_failed_load_recomputed(scheduler, out, watch, step):
    """A load reported failed is never taken as computed: policy "fail" ends
    its request (FINISHED_ERROR); "recompute" sends it back to at most its
    first failed block, and with a whole-state (Mamba) group to at most the
    load's start (that group holds one state, at the load's end)."""
    for rid, f in watch.failed.items():
        if f["finished_before"]:  # aborted while the step ran: vLLM leaves it finished
            continue
        request = f["request"]
        status, computed = request.status.name, request.num_computed_tokens
        if KV_LOAD_FAILURE_POLICY == "fail":
            assert status == "FINISHED_ERROR", (
                f"step {step}: request {rid}'s load failed ({f['how']}) under kv_load_failure_policy='fail', "
                f"but the request is {status}; groups: {_describe_groups()}"
            )
            continue
        bound = f["start"] if "whole-state" in ROLES else f["first"]
        assert status != "FINISHED_ERROR" and computed <= bound, (
            f"step {step}: request {rid}'s load of tokens from {f['start']} failed ({f['how']}, first failed "
            f"token {f['first']}) under kv_load_failure_policy='recompute', but it is {status} with "
            f"num_computed_tokens={computed} (at most {bound} expected); groups: {_describe_groups()}"
        )
''',
    "failed-load-not-cached": '''

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
''',
    "computed-below-num-tokens": '''

def _check_computed_below_num_tokens(scheduler, out, watch, step):
    """A request scheduled for the first time (or resumed) leaves at least
    one token to compute: num_computed_tokens < num_tokens."""
    cached = out.scheduled_cached_reqs
    rows = [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs]
    rows += [(r, cached.num_computed_tokens[i]) for i, r in enumerate(cached.req_ids) if r in cached.resumed_req_ids]
    for rid, computed in rows:
        num_tokens = watch.num_tokens[rid]
        assert computed < num_tokens, (
            f"step {step}: request {rid} scheduled with num_computed_tokens={computed} >= "
            f"num_tokens={num_tokens}: nothing left to compute; groups: {_describe_groups()}"
        )
''',
    "copy-source-ready": '''

def _check_copy_sources_ready(scheduler, out, watch, step):
    """No copy-on-write copy of a step reads another copy's destination."""
    copies = [(c.src_block_id, c.dst_block_id) for c in out.kv_cache_block_copies or []]
    written = {dst for _, dst in copies}
    chained = [c for c in copies if c[0] in written]
    assert not chained, f"step {step}: copies {chained} read blocks written by copies of the same step: {copies}"
''',
    "computed-adds-up": '''

def _check_computed_tokens_add_up(scheduler, out, watch, step):
    """num_computed_tokens == local tokens handed to allocate_slots + external
    tokens the connector was told to load, and no group adopts a cached block
    past the local part: at most ceil(local / block_size) (none for scratch)."""
    for rid, adm in watch.admissions.items():
        local = adm["num_computed_tokens"] - adm["external"]
        assert adm["local"] == local, (
            f"step {step}, request {rid}: num_computed_tokens={adm['num_computed_tokens']} - external "
            f"{adm['external']} = {local} local tokens, but allocate_slots got "
            f"num_new_computed_tokens={adm['local']}"
        )
        for g, (spec, role, adopted) in enumerate(zip(SPECS, ROLES, adm["adopted"])):
            limit = 0 if role == "scratch" else _cdiv(local, spec.block_size)
            assert len(adopted) <= limit, (
                f"step {step}, request {rid}: group {g} {type(spec).__name__} (block_size="
                f"{spec.block_size}) adopted {len(adopted)} cached blocks {adopted}, but the local "
                f"part is {local} tokens (num_computed_tokens={adm['num_computed_tokens']} = local "
                f"{local} + external {adm['external']}): at most ceil({local} / {spec.block_size}) "
                f"= {limit}"
            )
''',
    "local-part-covered": '''

def _check_local_part_covered(scheduler, out, watch, step):
    """Every must-cover group holds each block of the local part the request
    resumes from: an adopted cached block, or (only for a connector that
    completes divergent hits and loads external tokens, for a group whose
    own hit lags) a real block handed to the connector."""
    null = scheduler.kv_cache_manager.block_pool.null_block.block_id
    for rid, adm in watch.admissions.items():
        local = adm["num_computed_tokens"] - adm["external"]
        completes = DIVERGENT_HITS and adm["external"] > 0
        for g, (spec, role) in enumerate(zip(SPECS, ROLES)):
            if role != "must-cover":
                continue
            adopted, table = adm["adopted"][g], adm["table"][g]
            lagging = completes and adm["per_group"][g] < local
            missing = [
                i for i in range(_cdiv(local, spec.block_size))
                if not ((i < len(adopted) and adopted[i] != null) or (lagging and i < len(table) and table[i] != null))
            ]
            assert not missing, (
                f"step {step}, request {rid}: group {g} {type(spec).__name__} (block_size={spec.block_size}) "
                f"must hold the local tokens [0, {local}) it resumes from at {adm['num_computed_tokens']}, "
                f"but block indices {missing} are not held: adopted {adopted}, table {table}, "
                f"own hit {adm['per_group'][g]}"
            )
''',
    "truncated-view": '''

def _check_truncated_view(scheduler, out, watch, step):
    """When the connector's answer exceeds the local sub-block tail P = H % S,
    the local part is the aligned H - P and each group adopts exactly its
    lookup truncated there (whole-state groups: at most what they hold)."""
    for rid, adm in watch.admissions.items():
        hit = adm["local_hit"]
        tail = hit % SCHEDULER_BLOCK_SIZE
        answer = 0 if adm["skips"] else adm["answer"]  # vLLM drops a skipping request's answer
        if not tail or answer is None or answer <= tail:
            continue
        aligned = hit - tail
        local = adm["num_computed_tokens"] - adm["external"]
        assert local == aligned, (
            f"step {step}, request {rid}: the answer {answer} exceeds the sub-block tail {tail} of the "
            f"local hit {hit}, so the local part must be {aligned}; it is {local}"
        )
        for g, (spec, role) in enumerate(zip(SPECS, ROLES)):
            keep = aligned // spec.block_size
            looked_up = adm["lookup"][g]
            expected = [] if role == "scratch" else looked_up[: min(keep, len(looked_up))]
            assert adm["adopted"][g] == expected, (
                f"step {step}, request {rid}: group {g} {type(spec).__name__} (block_size={spec.block_size}) "
                f"adopted {adm['adopted'][g]}, not its lookup {looked_up} truncated at {aligned}: {expected}"
            )
''',
    "mamba-state-at-boundary": '''

def _check_mamba_state_at_resume_boundary(scheduler, out, watch, step):
    """With no external tokens, each whole-state (Mamba) group's adopted
    blocks end in a real state block exactly at the local boundary."""
    null = scheduler.kv_cache_manager.block_pool.null_block.block_id
    for rid, adm in watch.admissions.items():
        local = adm["num_computed_tokens"] - adm["external"]
        if adm["external"] or local == 0:
            continue
        for g, (spec, role) in enumerate(zip(SPECS, ROLES)):
            if role != "whole-state":
                continue
            adopted = adm["adopted"][g]
            idx = _cdiv(local, spec.block_size) - 1
            state = adopted[idx] if idx < len(adopted) else None
            assert state is not None and state != null, (
                f"step {step}, request {rid}: it resumes at {local} with no external tokens, but group {g} "
                f"{type(spec).__name__} (block_size={spec.block_size}) has no state there: adopted "
                f"{adopted} (index {idx} is {'missing' if state is None else 'the null block'})"
            )
''',
    "diverged-falls-back": '''

def _check_diverged_hit_falls_back(scheduler, out, watch, step):
    """With no external tokens, a local hit deeper than the joint hit every
    group agrees on falls back to exactly that joint hit and its blocks."""
    for rid, adm in watch.admissions.items():
        local = adm["num_computed_tokens"] - adm["external"]
        if adm["external"] or adm["local_hit"] <= adm["joint_hit"]:
            continue
        assert local == adm["joint_hit"] and adm["adopted"] == adm["joint"], (
            f"step {step}, request {rid}: the local hit {adm['local_hit']} runs deeper than the joint hit "
            f"{adm['joint_hit']} (per-group hits {adm['per_group']}) with no external tokens, so the "
            f"scheduler must fall back to {adm['joint_hit']} with blocks {adm['joint']}; it kept {local} "
            f"local tokens, blocks {adm['adopted']}; groups: {_describe_groups()}"
        )
''',
    "skip-reads-no-cache": '''

def _check_skipping_request_reads_no_cache(scheduler, out, watch, step):
    """A request with SamplingParams(skip_reading_prefix_cache=True) reads no
    cached tokens, local or external: its lookup finds nothing, it adopts no
    cached block, the connector is told to load 0 tokens (vLLM asks it, then
    drops the answer), and it is admitted at num_computed_tokens 0."""
    for rid, adm in watch.admissions.items():
        if not adm["skips"]:
            continue
        adopted = [g for g in adm["adopted"] if g]
        assert not (adm["local_hit"] or adm["local"] or adopted or adm["alloc_external"] or adm["external"]
                    or adm["num_computed_tokens"]), (
            f"step {step}, request {rid} set skip_reading_prefix_cache=True, so it reads neither the local "
            f"prefix cache nor an external hit and computes from token 0; but its lookup hit "
            f"{adm['local_hit']} tokens, allocate_slots got {adm['local']} local tokens (adopted blocks "
            f"{adopted}) and {adm['alloc_external']} external, the connector (answer {adm['answer']}) was told "
            f"to load {adm['external']}, and it was admitted at num_computed_tokens="
            f"{adm['num_computed_tokens']} (per-group hits {adm['per_group']}); groups: {_describe_groups()}"
        )
''',
}

_CHECKS.update({
    "external-contiguous": '''

def _check_external_range_contiguous(scheduler, out, watch, step):
    """A load starts where the local part ends: the local tokens kept equal
    the num_computed_tokens the connector was asked with, the external count
    equals its answer, and local + external stays within the prompt."""
    connector = scheduler.connector
    for rid, adm in watch.admissions.items():
        ext = adm["external"]
        if not ext:
            continue
        local, asked, answer = adm["local"], connector.asked_with.get(rid), connector.answers.get(rid)
        assert asked is not None and local == asked, (
            f"step {step}, request {rid}: the scheduler kept {local} local tokens but asked the connector "
            f"from {asked}: the load [{local}, {local + ext}) does not start where the answer starts"
        )
        assert answer is None or ext == answer, (
            f"step {step}, request {rid}: the connector answered {answer} tokens but was told to load {ext}"
        )
        assert local + ext <= adm["num_tokens"], (
            f"step {step}, request {rid}: the load ends at {local + ext}, past the prompt "
            f"(num_tokens={adm['num_tokens']})"
        )
''',
    "load-blocks-cover": '''

def _check_load_blocks_cover_range(scheduler, out, watch, step):
    """The blocks update_state_after_alloc hands the connector hold the
    external range [local, local + external) at each group's block size (a
    whole-state group: its state block at the resume boundary)."""
    null = scheduler.kv_cache_manager.block_pool.null_block.block_id
    for rid, adm in watch.admissions.items():
        ext = adm["external"]
        if not ext:
            continue
        local = adm["local"]
        total = local + ext
        handed = scheduler.connector.told_blocks[rid]
        for g, (spec, role) in enumerate(zip(SPECS, ROLES)):
            b = spec.block_size
            if role == "whole-state":
                needed = [_cdiv(total, b) - 1]
            elif role == "must-cover":
                needed = list(range(local // b, _cdiv(total, b)))
            else:
                continue
            ids = handed[g]
            missing = [i for i in needed if i >= len(ids) or ids[i] == null]
            assert not missing, (
                f"step {step}, request {rid}: group {g} {type(spec).__name__} (block_size={b}): the connector "
                f"is told to load {ext} tokens after {local} local ones, so it needs block indices {needed}, "
                f"but was handed blocks {ids}: indices {missing} are missing or the null block ({null})"
            )
''',
    "told-external-accounted": '''

def _check_told_external_accounted(scheduler, out, watch, step):
    """update_state_after_alloc tells the connector the external count the
    request's allocate_slots call just before it accounted."""
    last_alloc = {}
    for event in scheduler.connector.events:
        if event[0] == "alloc":
            last_alloc[event[1]] = event
            continue
        _, rid, told = event
        alloc = last_alloc.get(rid)
        assert alloc is not None and alloc[3] == told, (
            f"step {step}: update_state_after_alloc told the connector to load {told} external tokens for "
            f"request {rid}, but its allocate_slots call "
            + ("was missing" if alloc is None else f"accounted num_external_computed_tokens={alloc[3]} "
               f"(num_new_computed_tokens={alloc[2]})")
        )
''',
    "meta-built-once": '''

def _check_meta_built_once(scheduler, out, watch, step):
    """Every schedule() that returns calls build_connector_meta exactly once,
    empty steps included."""
    metas = scheduler.connector.metas
    assert len(metas) == 1, (
        f"step {step}: schedule() returned after calling build_connector_meta {len(metas)} times "
        f"(expected once; {out.total_num_scheduled_tokens} tokens scheduled)"
    )
''',
    "sync-load-announced": '''

def _check_sync_load_announced(scheduler, out, watch, step):
    """A request told to load external tokens synchronously is scheduled in
    the output build_connector_meta receives, and that output says
    has_sync_kv_loads."""
    connector = scheduler.connector
    sync = [r for r, ext in connector.told.items() if ext and not connector.async_answers.get(r)]
    for meta in connector.metas:
        for rid in sync:
            assert rid in meta["named"] and rid in meta["scheduled"], (
                f"step {step}: request {rid} was told to load {connector.told[rid]} external tokens "
                f"synchronously, but the step's output does not schedule it"
            )
            assert meta["has_sync_kv_loads"] is not False, (
                f"step {step}: request {rid} was told to load {connector.told[rid]} external tokens "
                f"synchronously, but the step's output says has_sync_kv_loads=False"
            )
''',
    "finished-once": '''

def _check_finished_once(scheduler, out, watch, step):
    """The connector hears request_finished exactly once per request, for a
    finished request, and no request leaves the scheduler without it."""
    connector = scheduler.connector
    for rid, nth, status in connector.finish_calls:
        assert nth == 1 and status.startswith("FINISHED"), (
            f"step {step}: request_finished({rid}) was called "
            + (f"again (call #{nth} for it)" if nth != 1 else f"while the request was {status}")
        )
    untold = sorted(r for r in watch.seen if r not in scheduler.requests and not connector.finished.get(r))
    assert not untold, f"step {step}: requests {untold} left the scheduler without request_finished"
''',
})

_CHECKS.update({
    "stale-output-dropped": '''

def _check_stale_output_dropped(scheduler, out, watch, step):
    """A request preempted while a step that scheduled it was still running
    (async scheduling) gets none of that step's sampled tokens when the
    scheduler drops stale output (its connector hands KV off:
    requires_kv_delivery): the preemption freed the blocks that output's KV
    was in, and the resumed request samples those positions again."""
    if not scheduler.requires_kv_delivery:
        return
    for rid, (request, before) in watch.stale.items():
        assert request.num_tokens == before, (
            f"step {step}: request {rid}, preempted after the step whose output was fed, "
            f"went from {before} to {request.num_tokens} tokens: its stale output was appended"
        )
''',
    "dropped-answer-loads-nothing": '''

def _check_dropped_answer_loads_nothing(scheduler, out, watch, step):
    """When the local hit ends in a sub-block tail P and the connector's
    answer does not exceed it (0 < answer <= P), the scheduler keeps the tail
    and loads nothing: update_state_after_alloc and allocate_slots both get 0
    external tokens."""
    for rid, adm in watch.admissions.items():
        tail = adm["local_hit"] % SCHEDULER_BLOCK_SIZE
        answer = 0 if adm["skips"] else adm["answer"]  # vLLM drops a skipping request's answer
        if not (tail and answer is not None and 0 < answer <= tail):
            continue
        assert not adm["external"] and not adm.get("alloc_external"), (
            f"step {step}, request {rid}: the local hit {adm['local_hit']} ends in a sub-block tail of {tail} "
            f"tokens and the answer {answer} does not exceed it, yet update_state_after_alloc got "
            f"num_external_tokens={adm['external']} and allocate_slots num_external_computed_tokens="
            f"{adm.get('alloc_external')}"
        )
''',
    "meta-names-scheduled": '''

def _check_meta_names_scheduled(scheduler, out, watch, step):
    """The output build_connector_meta receives names (as new or cached
    requests) exactly the requests with tokens scheduled, and none the
    connector was already told had finished."""
    for meta in scheduler.connector.metas:
        extra = sorted(meta["named"] - meta["scheduled"])
        unnamed = sorted(meta["scheduled"] - meta["named"])
        assert not (extra or unnamed or meta["already_finished"]), (
            f"step {step}: the output handed to build_connector_meta names {extra} with no tokens scheduled, "
            f"schedules {unnamed} without naming them, names {meta['already_finished']} already finished"
        )
''',
    "async-load-lands-first": '''

def _check_async_load_lands_first(scheduler, out, watch, step):
    """No request whose async load is in flight (from an earlier step, not
    yet reported, or started in this one) has tokens scheduled."""
    connector = scheduler.connector
    started = {r for r, ext in connector.told.items() if ext and connector.async_answers.get(r)}
    early = sorted(r for r in out.num_scheduled_tokens if r in watch.loads_in_flight | started)
    assert not early, (
        f"step {step}: requests {early} have tokens scheduled "
        f"({ {r: out.num_scheduled_tokens[r] for r in early} }) while their async load is in flight"
    )
''',
})

# The block-ownership invariants (invariants/ownership.py), stated on what the
# watch saw: _Watch.hold (tables and pool state right after schedule()) and
# _Watch._watch_blocks (fresh blocks, counts against takes, lookups).
_CHECKS.update({
    "read-blocks-held": '''

def _read_indices(rule, block_size, start, end, num_prompt_tokens, table_len):
    """Block indices a step computing tokens [start, end) reads (READ_RULES)."""
    kind, value = rule
    last = _cdiv(end, block_size)
    if kind == "full":
        return list(range(last))
    if kind == "window":  # the window of the first computed token
        return list(range(max(0, start - value + 1) // block_size, last))
    if kind == "chunk":  # the current chunk
        return list(range(start // value * value // block_size, last))
    if kind == "rswa":  # the prompt, and the last `value` tokens
        head = _cdiv(num_prompt_tokens, block_size)
        tail = max(num_prompt_tokens, start - value) // block_size
        return list(range(min(head, last))) + list(range(max(head, tail), last))
    if kind == "state":  # the state it resumes from, and the one it writes
        # With `value` speculative state blocks the worker resumes from the
        # state index it recorded the step before (plus the drafts accepted):
        # only the state it writes is claimed, the first of the table's last
        # 1 + value blocks (MambaManager.allocate_new_blocks).
        if value:
            return [table_len - 1 - value if table_len > value else last - 1]
        return sorted({last - 1} | ({_cdiv(start, block_size) - 1} if start > 0 else set()))
    return []


def _check_read_blocks_held(scheduler, out, watch, step):
    """Every block a request scheduled in this step reads is a real block of
    its table that it holds: not the null block, ref_cnt > 0, not in the free
    queue, and shared with another request only as a cached prefix block
    whose ref_cnt counts every holder."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    holders = {}
    for row in watch.held.values():
        for table in row["tables"]:
            for bid in set(table) - {NULL_BLOCK}:
                holders[bid] = holders.get(bid, 0) + 1
    for rid, row in watch.held.items():
        if not row["scheduled"]:
            continue
        start = row["computed_before"]
        end = start + row["scheduled"]
        for g, (spec, rule, table) in enumerate(zip(SPECS, READ_RULES, row["tables"])):
            block_size = managers[g].block_size
            wanted = _read_indices(rule, block_size, start, end, row["num_prompt_tokens"], len(table))
            problems = []
            for i in wanted:
                bid = table[i] if i < len(table) else None
                ref_cnt, free, cached = watch.blocks.get(bid, (0, False, False))
                if bid is None:
                    problems.append(f"index {i} is past the table's {len(table)} blocks")
                elif bid == NULL_BLOCK:
                    problems.append(f"index {i} is the null block")
                elif ref_cnt <= 0:
                    problems.append(f"block {bid} (index {i}) has ref_cnt {ref_cnt}")
                elif free:
                    problems.append(f"block {bid} (index {i}) sits in the free queue")
                elif holders[bid] > 1 and not cached:
                    problems.append(f"block {bid} (index {i}) is in {holders[bid]} block tables but is no "
                                    f"cached prefix block")
                elif holders[bid] > ref_cnt:
                    problems.append(f"block {bid} (index {i}) is in {holders[bid]} block tables but has "
                                    f"ref_cnt {ref_cnt}")
            assert not problems, (
                f"step {step}: request {rid} computes tokens [{start}, {end}) and reads block indices "
                f"{wanted} of group {g} {type(spec).__name__} (block_size={block_size}, reads {rule}), but "
                f"they are not all held by it: " + "; ".join(problems) + f" (table {table}); "
                f"groups: {_describe_groups()}"
            )
''',
    "same-step-hazard": '''

def _check_no_same_step_hazard(scheduler, out, watch, step):
    """No block written in this step (a new block, a copy-on-write
    destination) is read by another request before the write: no
    copy-on-write copy reads it (the model runner applies the copies before
    the forward pass), and no recurrent-state group adopts it as a cached
    state (a state is read at the start of the step's scan, written at its
    end)."""
    copies = [(c.src_block_id, c.dst_block_id) for c in getattr(out, "kv_cache_block_copies", None) or []]
    written = {bid: (rid, "a new block") for bid, rid in watch.fresh}
    for rid, row in watch.held.items():
        for table in row["tables"]:
            written.update({dst: (rid, "a copy-on-write destination") for _, dst in copies if dst in table})
    for src, dst in copies:
        assert src not in written, (
            f"step {step}: the copy {src}->{dst} reads block {src}, which this step writes as "
            f"{written[src][1]} of request {written[src][0]}: the copy runs before the write; "
            f"copies {copies}; groups: {_describe_groups()}"
        )
    for rid, adm in watch.admissions.items():
        for g, (spec, rule, adopted) in enumerate(zip(SPECS, READ_RULES, adm["adopted"])):
            if rule[0] != "state":
                continue
            # A state dropped again in the same allocation is never read.
            kept = set(watch.held[rid]["tables"][g]) if rid in watch.held else set()
            early = [b for b in adopted if b != NULL_BLOCK and b in kept and written.get(b, (rid,))[0] != rid]
            assert not early, (
                f"step {step}: request {rid} adopts blocks {early} of group {g} {type(spec).__name__} "
                f"(block_size={spec.block_size}) as a cached state (adopted {adopted}), but "
                + ", ".join(f"request {written[b][0]} writes block {b} as {written[b][1]}" for b in early)
                + f" in this same step: the state is read before it exists; groups: {_describe_groups()}"
            )
''',
    "reservation-covers-allocation": '''

def _check_reservation_covers_allocation(scheduler, out, watch, step):
    """Every allocate_slots that passed its free-block check took from the
    pool, per group, no more than that group's get_num_blocks_to_allocate
    counted (a negative count covers nothing), and in all no more than the
    sum the free-block check compared with the pool (a negative sum admits
    what a zero sum admits)."""
    for a in watch.allocations:
        call = (
            f"allocate_slots({a['request']}, num_new_tokens={a['num_new_tokens']}, num_new_computed_tokens="
            f"{a['kwargs'].get('num_new_computed_tokens', 0)}, num_external_computed_tokens="
            f"{a['kwargs'].get('num_external_computed_tokens', 0)})" + (" (it raised)" if a["raised"] else "")
        )
        counted, taken = a["counted"], a["taken"]
        for g, (spec, n, took, takers) in enumerate(zip(SPECS, counted, taken, a["takers"])):
            assert took <= max(n or 0, 0), (
                f"step {step}: {call} counted {n} blocks for group {g} {type(spec).__name__} "
                f"(block_size={spec.block_size}) in get_num_blocks_to_allocate but took {took} from the pool "
                f"({', '.join(sorted(takers))}): a pool holding exactly the count runs dry; "
                f"groups: {_describe_groups()}"
            )
        # The free-block check compared this sum with the free blocks (never
        # negative): a negative sum admits no less than a zero one.
        total = sum(n or 0 for n in counted)
        assert sum(taken) <= max(total, 0), (
            f"step {step}: {call} counted {total} blocks in all (per group {counted}) but took {sum(taken)} "
            f"(per group {taken}): a negative per-group count hides blocks another group takes; "
            f"groups: {_describe_groups()}"
        )
''',
    "lookup-within-limit": '''

def _check_lookup_within_limit(scheduler, out, watch, step):
    """No prefix-cache lookup of the step returns a hit, joint or per group,
    longer than the max_cache_hit_length its caller passed, and no local hit
    of an admitted request reaches the prompt's last token (num_tokens - 1)."""
    for call, limit, hits in watch.lookups:
        over = [(g, hit) for g, hit in enumerate(hits) if hit > limit]
        assert not over, (
            f"step {step}: coordinator.{call}(block_hashes, max_cache_hit_length={limit}) returned "
            + ", ".join(
                f"the joint hit {hit}" if call == "find_longest_cache_hit"
                else f"group {g} {type(SPECS[g]).__name__} (block_size={SPECS[g].block_size}) hit {hit}"
                for g, hit in over
            )
            + f", past the limit {limit}; groups: {_describe_groups()}"
        )
    for rid, hit, num_tokens in watch.local_hits:
        assert hit <= num_tokens - 1, (
            f"step {step}: request {rid}'s local prefix-cache hit is {hit} tokens of a {num_tokens}-token "
            f"prompt, past the limit num_tokens - 1 = {num_tokens - 1}; groups: {_describe_groups()}"
        )
''',
})


# ---------------------------------------------------------------------------
# Async scheduling: the same file, with an AsyncScheduler driven as the
# engine core's batch queue drives it.
# ---------------------------------------------------------------------------

_ASYNC_STEP = '''def _step(scheduler, watch, failed_loads=(), invalid_block_ids=(), failing_blocks=()):
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
        sampled = [[1000 + watch.step % 24] if done else [] for done in _worker_done(out, watch)]
        _worker_sampled(watch, out, sampled)
        if watch.contents is not None:  # failing_blocks: those this step's sync loads fail
            _contents_issue(scheduler, watch, out, sampled, failing_blocks)
        watch.queue.insert(0, (watch.step, out, sampled, dict(watch.admissions)))
        if len(watch.queue) < 2 and (out.total_num_scheduled_tokens > 0 or scheduler.has_requests()):
            _abort_during_step(scheduler, watch)  # nothing fed back: they come after the step
            _settle_tokens(scheduler, out, watch)
            return out
    index, fed, sampled, admissions = watch.queue.pop()
    watch.worker.fed(index)
    _abort_during_step(scheduler, watch)
    recving = {r for r in connector.loads_in_flight if watch.load_started.get(r, 0) <= index}
    connector.loads_in_flight -= recving
    if watch.contents is not None:
        for rid in recving:
            watch.contents.land_async_load(rid, index, rid in set(failed_loads))
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
    _settle_tokens(scheduler, out, watch)
    return out


'''

def _speculation_constants(draw: Any) -> list[str]:
    from fuzz.adapter._config import _MODEL_CONFIGS

    lines = [
        "# --speculative-config: the method and its num_speculative_tokens k; how many",
        "# drafts the rejection sampler accepts at each verification, cycled over the",
        "# step's verified requests (capped at the drafts it could accept).",
        f"SPECULATIVE_METHOD = {draw.speculative_method!r}",
        f"NUM_SPECULATIVE_TOKENS = {draw.num_speculative_tokens}",
        f"DRAFT_ACCEPTANCE = {draw.draft_acceptance!r}",
    ]
    if draw.speculative_method == "eagle":
        lines.append("# The EAGLE draft head's config.json (no weights, no hub).")
        lines.append("DRAFT_MODEL_CONFIG = " + _wrap_dict(_MODEL_CONFIGS["eagle-draft"]))
    return lines


_SPECULATION = '''

def _speculative_config(tmp_path, model_config):
    """SpeculativeConfig as EngineArgs.create_speculative_config builds it."""
    parallel_config = ParallelConfig()
    draft = {}
    if SPECULATIVE_METHOD == "eagle":
        (tmp_path / "draft").mkdir()
        (tmp_path / "draft" / "config.json").write_text(json.dumps(DRAFT_MODEL_CONFIG))
        draft["model"] = str(tmp_path / "draft")
    return {
        "parallel_config": parallel_config,
        "speculative_config": SpeculativeConfig(
            method=SPECULATIVE_METHOD,
            num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
            target_model_config=model_config,
            target_parallel_config=parallel_config,
            **draft,
        ),
    }


def _sampled(out, done, step, asynchronous):
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
            verifiable = len(drafts) if asynchronous else next(
                (i for i, t in enumerate(drafts) if t < 0), len(drafts))
        accepted = 0
        if verifiable:
            accepted = min(verifiable, DRAFT_ACCEPTANCE[(step + position) % len(DRAFT_ACCEPTANCE)])
            position += 1
        sampled.append([1000 + (step + i) % 24 for i in range(1 + accepted)])
    return sampled


def _verified(scheduler, fed, sampled):
    """Per request whose drafts the output verifies: (drafts, accepted,
    num_computed_tokens right before update_from_output)."""
    drafts = fed.scheduled_spec_decode_tokens or {}
    return {
        rid: (len(drafts[rid]), len(tokens) - 1, scheduler.requests[rid].num_computed_tokens)
        for rid, tokens in zip(fed.num_scheduled_tokens, sampled)
        if drafts.get(rid) and tokens and rid in scheduler.requests
    }


def _propose_drafts(scheduler, out):
    """EngineCore.post_step (sync, when the model ran): the drafter's k drafts
    for every request of the batch, through update_draft_token_ids."""
    if out.total_num_scheduled_tokens == 0 or getattr(out, "skip_drafts", False):
        return
    ids = list(out.num_scheduled_tokens)
    drafts = [[3000 + i for i in range(NUM_SPECULATIVE_TOKENS)] for _ in ids]
    scheduler.update_draft_token_ids(DraftTokenIds(ids, drafts))
'''

_CHECKS["rejected-drafts-rolled-back"] = '''

def _check_rejected_drafts_rolled_back(scheduler, out, watch, step):
    """A running request whose k drafts the fed output verified with a
    accepted loses exactly k - a from num_computed_tokens in
    update_from_output (the rejected positions are not computed)."""
    for rid, (num_drafts, accepted, before) in watch.verified.items():
        req = scheduler.requests.get(rid)
        if req is None or req.status != RequestStatus.RUNNING or rid in watch.failed:
            continue
        assert before - req.num_computed_tokens == num_drafts - accepted, (
            f"step {step}: update_from_output() verified {num_drafts} drafts of request {rid} and accepted "
            f"{accepted}, so {num_drafts - accepted} positions must leave num_computed_tokens; it went "
            f"{before} -> {req.num_computed_tokens}; groups: {_describe_groups()}"
        )
'''

_CHECKS["kv-matches-tokens"] = '''

def _check_kv_matches_tokens(scheduler, out, watch, step):
    """What a block holds: every position the model runner computed, below a
    request's num_computed_tokens, was computed from the token vLLM records
    there (Request.all_token_ids). The runner feeds each position the token
    it has: the prompt and what it sampled (async: steps in flight too)."""
    assert not watch.kv_wrong, (
        f"step {step}: (request, position, token the model runner computed its KV from, token vLLM "
        f"records there, step that computed it): {watch.kv_wrong}; the request's later tokens are "
        f"sampled from a context that is not its sequence; groups: {_describe_groups()}"
    )
'''

_CONTENTS_CALLS = '''

def _make_contents(scheduler):
    """What each block holds, per group whose blocks hold per-position KV."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return BlockContents(
        [m.block_size for m in managers],
        [role in ("must-cover", "windowed") for role in ROLES],
        scheduler.kv_cache_manager.block_pool.null_block.block_id,
    )


def _contents_issue(scheduler, watch, out, sampled, failing):
    """The step as the worker runs it. Before the forward pass, what it takes
    from the output: its block tables and copies, and the loads the
    connector was told to do (a sync one lands now, but into the blocks the
    worker fails; an async one when it is reported landed; a divergent
    hybrid hit's lagging group is filled from the blocks it adopted). Then
    the positions each request computes (its drafts only as far as they
    were accepted); then what each reads below where it starts that its
    blocks do not hold, and the prefix-cache entries ahead of their blocks'
    contents."""
    contents, tokens = watch.contents, watch.worker.tokens
    contents.forget(out.finished_req_ids or ())
    contents.take_tables(out)
    for rid, adm in watch.admissions.items():
        if not adm.get("external"):
            continue
        start, end = adm["local"], adm["local"] + adm["external"]
        starts = [start] * len(contents.block_sizes)
        if adm.get("diverged"):
            starts = [min(start, len(a) * size) for a, size in zip(adm["adopted"], contents.block_sizes)]
        blocks = scheduler.connector.told_blocks[rid]
        if rid in scheduler.connector.loads_in_flight:
            contents.start_async_load(rid, blocks, starts, end, tokens.get(rid, []))
        else:
            contents.load(blocks, starts, end, watch.step, tokens.get(rid, []), failed=set(failing))
    for rid, new in zip(out.num_scheduled_tokens, sampled):
        if rid not in watch.starts:
            continue
        drafts = len((out.scheduled_spec_decode_tokens or {}).get(rid) or ())
        end = watch.starts[rid] + out.num_scheduled_tokens[rid] - drafts + max(len(new) - 1, 0)
        # Its KV from the tokens the worker had before this step's samples.
        known = tokens.get(rid, [])[: len(tokens.get(rid, [])) - len(new)]
        contents.write(rid, watch.starts[rid], end, watch.step, known)
    contents.settle_copies(watch.step)
    watch.unwritten_reads = [
        (rid, *missing)
        for rid, start in watch.starts.items()
        for missing in contents.unread(
            rid, start, watch.worker.prompt.get(rid, 0), READ_RULES, tokens.get(rid, []), failing
        )
    ]
    cached = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block._cache
    watch.unbacked = contents.unbacked_entries(entries_of(cached, get_group_id))
'''

_CHECKS["reads-written"] = '''

def _check_reads_written(scheduler, out, watch, step):
    """What a hit adopts: every position below a scheduled request's start
    that its step reads (by its group's span) is held, in the block the
    runner's table names, as that position's KV: computed by an earlier
    step, copied there, or loaded by a load that landed."""
    assert not watch.unwritten_reads, (
        f"step {step}: (request, group, block, position it reads, what the block holds there: (position, "
        f"step written), -1 or -2 lost to a same-step block copy): {watch.unwritten_reads}; "
        f"groups: {_describe_groups()}"
    )
'''

_CHECKS["index-written"] = '''

def _check_index_written(scheduler, out, watch, step):
    """What the prefix cache promises: as a step runs, every entry of the
    index names a block holding the KV of every position its key covers
    there (an async load's blocks count once it is reported landed)."""
    assert not watch.unbacked, (
        f"step {step}: (group, block, tokens its key covers, [(position it lacks, what it holds there: "
        f"(position, step written))]): {watch.unbacked}; groups: {_describe_groups()}"
    )
'''

_CHECKS["running-request-progresses"] = '''

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
'''

_SYNC_SAMPLED = "    sampled = [[1000 + watch.step % 24] if done else [] for done in _worker_done(out, watch)]\n"
_ASYNC_SAMPLED = "        sampled = [[1000 + watch.step % 24] if done else [] for done in _worker_done(out, watch)]\n"
_SYNC_FED = "    )\n    _settle_tokens(scheduler, out, watch)\n    return out\n"


def _with_speculation(body: str, asynchronous: bool) -> str:
    """The body with the drawn speculative decoding: the config, what the
    model runner samples, and (sync) the drafts handed over after each step."""
    fed = "fed" if asynchronous else "out"
    edits = [
        ("    watch.step += 1\n", "    watch.step += 1\n    watch.verified = {}  # (drafts, accepted, computed before) per request\n"),
        (
            f"    scheduler.update_from_output(\n        {fed},\n",
            f"    watch.verified = _verified(scheduler, {fed}, sampled)\n    scheduler.update_from_output(\n        {fed},\n",
        ),
        (
            "        model_config=_make_model_config(tmp_path),\n",
            "        model_config=(model_config := _make_model_config(tmp_path)),\n"
            "        **_speculative_config(tmp_path, model_config),\n",
        )
    ]
    if asynchronous:
        edits.append((
            _ASYNC_SAMPLED,
            "        sampled = _sampled(out, _worker_done(out, watch), watch.step, True)\n",
        ))
    else:
        edits.append((
            _SYNC_SAMPLED,
            "    sampled = _sampled(out, _worker_done(out, watch), watch.step, False)\n",
        ))
        edits.append((_SYNC_FED, _SYNC_FED.replace("    _settle", "    _propose_drafts(scheduler, out)\n    _settle")))
    for old, new in edits:
        if body.count(old) != 1:
            raise AssertionError(f"the repro body changed; cannot apply the speculation edit of {old!r}")
        body = body.replace(old, new)
    return body + _SPECULATION


def _with_prefill_cadence(body: str) -> str:
    """The body's scheduler config with the drawn prefill cadence."""
    old = "            long_prefill_token_threshold=LONG_PREFILL_TOKEN_THRESHOLD,\n"
    assert body.count(old) == 1, "the scheduler config template changed"
    return body.replace(old, old + "            prefill_schedule_interval=PREFILL_SCHEDULE_INTERVAL,\n")


def _with_kv_role(body: str) -> str:
    """The body's connector config with the drawn ``kv_role``."""
    old = '            kv_role="kv_both",\n'
    assert body.count(old) == 1, "the connector config template changed"
    return body.replace(old, "            kv_role=KV_ROLE,\n")


_ASYNC_EDITS = (
    # The engine's scheduler config: async scheduling on (its default).
    (
        "            async_scheduling=False,  # --no-async-scheduling: one batch in flight\n",
        "            async_scheduling=True,  # the engine's default\n",
    ),
    # The class EngineCore builds: scheduler_config.get_scheduler_cls() (AsyncScheduler).
    (
        "    return Scheduler(\n        vllm_config=vllm_config,",
        "    # The class the engine core builds (EngineCore: get_scheduler_cls()): AsyncScheduler.\n"
        "    return vllm_config.scheduler_config.get_scheduler_cls()(\n        vllm_config=vllm_config,",
    ),
    # The batch queue and when each async load started.
    (
        "        self.seen = set()  # every request seen in the scheduler\n",
        "        self.seen = set()  # every request seen in the scheduler\n"
        "        self.queue = []  # (step, SchedulerOutput, sampled, admissions) not fed back yet, newest first\n"
        "        self.load_started = {}  # request id -> the step whose schedule() started its async load\n",
    ),
    # The worker's record follows the V1 runner under async scheduling.
    (
        "        self.worker = WorkerRecord(async_scheduling=False)",
        "        self.worker = WorkerRecord(async_scheduling=True)",
    ),
    # Draining feeds the queued output too.
    ("    return bool(scheduler.requests or connector.loads_in_flight or connector.sends_in_flight)\n",
     "    return bool(scheduler.requests or connector.loads_in_flight or connector.sends_in_flight or watch.queue)\n"),
)


def _async_body(body: str) -> str:
    """:data:`_BODY` for an async-scheduling run (see :data:`_ASYNC_EDITS`)."""
    for old, new in _ASYNC_EDITS:
        if body.count(old) != 1:
            raise AssertionError(f"the repro body changed; cannot apply the async edit of {old!r}")
        body = body.replace(old, new)
    start, end = body.index("def _step(scheduler, watch"), body.index("def _abort_during_step(")
    return body[:start] + _ASYNC_STEP + body[end:]
