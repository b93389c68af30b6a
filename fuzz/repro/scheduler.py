"""Standalone repros of scheduler-tier failures, written from the operation log.

The log (:class:`fuzz.model.OpLog`) says everything a run did to vLLM; this
module turns it into a pytest file in vLLM's ``tests/v1/core`` idiom that
imports vLLM and the standard library only:

* ``pytestmark = pytest.mark.cpu_test``, small ``_make_*`` helpers, the
  model's ``config.json`` written into ``tmp_path`` (never a hub);
* where the program needs one, a scripted KV connector class in the file
  itself, loaded through ``KVTransferConfig`` by the file's own module path
  (``__name__``), which answers by each request's recorded store rule (the
  answers the recorded run got are listed beside it); a shrunk program
  whose failure reproduces without a connector gets none of it
  (``CONNECTOR = False``: no class, store, config or connector imports);
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

Everything after the constants is the repro kit's code (:mod:`fuzz.kit`,
real modules), copied with :func:`inspect.getsource` by
:mod:`fuzz.repro.source`: only what the test and its claim reach, each
``if`` on a constant (async scheduling, speculation, the connector and its
role, the request features the program uses, what the claim watches)
reduced to the branch the run takes, each docstring cut to its summary and
comment-only lines dropped (the failing check stays in full). Nothing of it
is a string template.

It fails on the vLLM that produced it and passes once the bug is gone.
:func:`shrink_oplog` (:mod:`fuzz.repro.shrink`) first drops whatever the
failure does not need (groups; the connector; requests, their twins, fills
and probes; trailing steps), by replaying the log through the harness with
every check on.
:data:`WRITABLE` names the invariants the file can state on vLLM's objects;
for the others no file is written.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import textwrap

from fuzz import adapter
from fuzz.kit import SUITE_CHECK_MODULES
from fuzz.repro.truncation import repro_header, spec_classes, specs_lines
from fuzz.repro.shrink import _replay_checked, shrink_oplog
from fuzz.repro.groups import behaviours_of, read_rules_of, roles_of, spans_of
from fuzz.repro.source import kit_attributes, kit_definitions, kit_source
from fuzz.model import Abort, AddRequest, Evict, InvariantViolation, OpLog, OpVisitor, ResetPrefixCache, Step
from invariants.scheduler import ADMISSION_CHECKS
from invariants.table import INVARIANTS

__all__ = ["WRITABLE", "repro_size", "scheduler_repro", "scheduler_repro_of_failure", "shrink_oplog", "shrunk_log_of_failure"]

# The claims every file states without a check of their own: the step must
# not raise, and the pool check closes every file.
_STATED_BY_EVERY_FILE = frozenset({"no-exception", "no-leaked-blocks"})

# The scheduler claims a file can state (invariants/table.py, ``repro``), and
# what the file watches for it (the row's ``watches``). A file states a claim
# with the kit's function of its check's name where the kit has one
# (``check_x`` -> ``_check_x``, called with the scheduler, the step's output
# and the watch), else with the suite's check itself, which the kit carries
# (:data:`fuzz.kit.SUITE_CHECK_MODULES`) and which reads the watch as a
# StepObservation.
_ROWS = {row.name: row for row in INVARIANTS if row.tier == "scheduler" and row.repro}


WRITABLE = frozenset(_ROWS)


@functools.cache
def _check_of(invariant: str) -> str | None:
    """The function a file states ``invariant`` with (None: every file states
    it). Asked, not tabled at import: the answer reads the kit's source."""
    row = _ROWS[invariant]
    if row.name in _STATED_BY_EVERY_FILE:
        return None
    name = row.check.__name__
    if "_" + name in kit_definitions():
        return "_" + name
    if row.check.__module__ not in SUITE_CHECK_MODULES:
        raise ValueError(f"{row.name}: neither the kit's _{name} nor a check the kit carries states it")
    return name


def _reads_output(check: str) -> bool:
    """The kit's checks take the step's output; the suite's read the watch alone."""
    return check.startswith("_")


# The suite's checks a file carries that judge one admission (the suite's
# ADMISSION_CHECKS): the hit claim's the file calls on each lookup the watch
# served this step (fuzz.kit's HitLookup), the others on each request the
# step admitted (fuzz.kit's Admission): each the admission's fields they read.
_PER_LOOKUP = frozenset(check.__name__ for check in ADMISSION_CHECKS if check.__module__ == "invariants.hits")
_PER_ADMISSION = frozenset(
    check.__name__ for check in ADMISSION_CHECKS if check.__module__ in SUITE_CHECK_MODULES) - _PER_LOOKUP


def _check_call(check: str, out: str, step: int, indent: str) -> list[str]:
    """The lines that state a claim at step ``step`` (``out``: its output)."""
    if _reads_output(check):
        return [f"{indent}{check}(scheduler, {out}, watch, step={step})"]
    if check in _PER_LOOKUP:
        return [f"{indent}for lookup in watch.lookups_served.values():  # step {step}",
                f"{indent}    {check}(lookup)"]
    if check in _PER_ADMISSION:
        return [f"{indent}for admission in watch.admissions:  # step {step}",
                f"{indent}    {check}(admission)"]
    return [f"{indent}{check}(watch)  # step {step}"]


# The row's watches that are kit constants of their own (WATCH_POOL, ...).
_WATCH_CONSTANTS = ("pool", "tables", "contents", "tokens", "unwritten", "namespaces", "lookahead", "events",
                    "preempted", "in-flight", "index", "hits", "evictions", "resets")


def _watches(invariant: str, what: str) -> bool:
    """The file watches ``what`` (a name of :attr:`invariants.table.Invariant.watches`) for ``invariant``."""
    row = _ROWS.get(invariant)
    return row is not None and what in row.watches


# The rooms of the admission claims a file states: they read, beside each
# lookup, the joint hit and each group's own (WATCH_JOINT_HITS).
_READ_JOINT_HITS = ("fuzz.kit._checks_scheduler", "fuzz.kit._checks_connector", "invariants.scheduler")


def _reads_joint_hits(invariant: str) -> bool:
    check = _check_of(invariant) if invariant in WRITABLE else None
    return check is not None and kit_definitions().get(check) in _READ_JOINT_HITS


# The watch's records a file keeps only where its code, written without the
# record, still reads it (constant -> the watch's attribute): what the claim's
# check and the step loop read decides, not a list beside them.
_KEPT_WHERE_READ = {"WATCH_ADMISSIONS": ("admitting", "admissions"), "WATCH_ADMITTED": ("admissions",),
                    "WATCH_ORPHANS": ("event_orphans",),
                    "WATCH_READS": ("unwritten_reads",), "WATCH_UNBACKED": ("unbacked_entries",)}


def _records_read(roots: set[str], values: dict[str, object], **kit: object) -> dict[str, bool]:
    """Per constant of :data:`_KEPT_WHERE_READ`: on where the file, written
    with the records off, still reads its record. From all off, the records
    still read go on until none more is (turning one on only adds reads): a
    file writes every record it reads, and one probe usually settles it."""
    on: set[str] = set()
    while True:
        flags = {constant: constant in on for constant in _KEPT_WHERE_READ}
        probe = kit_source(roots, {**values, **flags}, **kit)  # type: ignore[arg-type]
        read = kit_attributes(probe.code + "\n" + str(kit.get("extra", "")))
        more = {c for c, records in _KEPT_WHERE_READ.items() if c not in on and read & set(records)}
        if not more:
            return flags
        on |= more


def _broken_step(log: OpLog) -> int:
    """The step a check failed after: the log's last step (the runners stop there)."""
    return log.steps[-1].index if log.steps else 0


def repro_size(log: OpLog) -> dict[str, int]:
    """Groups, blocks, requests and ``schedule()`` steps up to the failure."""
    return log.until_step(_broken_step(log)).size()


# ---------------------------------------------------------------------------
# Writing the file
# ---------------------------------------------------------------------------


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
    # Async scheduling feeds a step's output a step late: the contents model
    # learns which blocks its synchronous loads fail at the step that issues them.
    failing_at = {
        op.fed_step: set(op.fed.invalid_block_ids)
        for op in log.steps
        if _watches(invariant, "contents") and op.fed is not None and op.fed.invalid_block_ids and op.fed_step is not None
    }
    program = _Program(broken, invariant, failing_at)
    for op in log.until_step(broken).ops:
        program.visit(op)
    program.flush()
    return program.lines


class _Program(OpVisitor[None]):
    """Each operation as the test's lines; a run of plain steps as one loop."""

    def __init__(self, broken: int, invariant: str, failing_at: dict[int, set[int]]) -> None:
        self.broken, self.invariant, self.failing_at = broken, invariant, failing_at
        self.lines: list[str] = []
        self.plain: list[int] = []  # the plain steps not written yet

    def flush(self) -> None:
        plain, self.plain = self.plain, []
        if len(plain) == 1:
            self.lines.append(f"    _step(scheduler, watch)  # step {plain[0]}")
        elif len(plain) > 1:
            self.lines.append(f"    for _ in range({len(plain)}):  # steps {plain[0]}-{plain[0] + len(plain) - 1}")
            self.lines.append("        _step(scheduler, watch)")

    def on_step(self, op: Step) -> None:
        fed = op.fed
        args = ""
        if fed is not None and fed.failed_recving:
            args += f", failed_loads={set(fed.failed_recving)!r}"
        if fed is not None and fed.invalid_block_ids:
            args += f", invalid_block_ids={set(fed.invalid_block_ids)!r}"
        if op.index in self.failing_at:
            args += f", failing_blocks={self.failing_at[op.index]!r}"
        if op.index == self.broken:
            self.flush()
            self.lines += _breaking_step(op, args, self.invariant)
        elif args:
            self.flush()
            self.lines.append(f"    _step(scheduler, watch{args})  # step {op.index}")
        else:
            self.plain.append(op.index)

    def on_add_request(self, op: AddRequest) -> None:
        self.flush()
        skip = ", skip_reading_prefix_cache=True" if op.skip_reading_prefix_cache else ""
        salt = f", cache_salt={op.cache_salt!r}" if op.cache_salt else ""
        lora = f", lora={op.lora!r}" if op.lora else ""
        lora += f", embeds={op.embeds!r}" if op.embeds else ""
        lora += f", mm={op.mm!r}" if op.mm else ""
        self.lines.append(
            f'    scheduler.add_request(_make_request("{op.request_id}", {_const(op.request_id)}, '
            f"max_tokens={op.max_tokens}{skip}{salt}{lora}))"
        )

    def on_abort(self, op: Abort) -> None:
        self.flush()
        if op.during_step:
            self.lines.append(f'    watch.aborts.append("{op.request_id}")  # arrives while the model runs the next step')
        else:
            self.lines.append(f'    scheduler.finish_requests("{op.request_id}", RequestStatus.FINISHED_ABORTED)')

    def on_evict(self, op: Evict) -> None:
        self.flush()
        self.lines.append("    # Blocks dropped from the prefix cache by hand (the search shortcut).")
        self.lines.append(f"    scheduler.kv_cache_manager.evict_blocks({set(op.block_ids)!r})")

    def on_reset_prefix_cache(self, op: ResetPrefixCache) -> None:
        self.flush()
        self.lines.append(f"    _reset_prefix_cache(scheduler, watch, reset_running_requests={op.reset_running})")


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
    check = _check_of(invariant)
    if check is None:  # the pool check at the end states it
        return [f"    _step(scheduler, watch{args})  # step {op.index}"]
    if _watches(invariant, "even-if-it-raises"):
        return [
            f"    # Step {op.index}{sched}: the step where '{invariant}' broke.",
            "    # What schedule() did is checked even if it raised (the check needs no output).",
            *(["    out = None"] if _reads_output(check) else []),
            "    try:",
            f"        {'out = ' if _reads_output(check) else ''}_step(scheduler, watch{args})",
            "    finally:",
            *_check_call(check, "out", op.index, "        "),
        ]
    if op.error and op.error_where == "update_from_output" and op.output is not None:
        # vLLM raised feeding the output back, after schedule() did what the claim judges.
        return [
            f"    # Step {op.index}{sched}: the step where '{invariant}' broke. vLLM then raises",
            f"    # {op.error.splitlines()[0][:100]} in update_from_output(): the check reads what",
            "    # schedule() did before that escapes.",
            "    try:",
            f"        _step(scheduler, watch{args})",
            "    finally:",
            *_check_call(check, "watch.last_output", op.index, "        "),
        ]
    return [
        f"    # Step {op.index}{sched}: the step where '{invariant}' broke.",
        f"    {'out = ' if _reads_output(check) else ''}_step(scheduler, watch{args})",
        *_check_call(check, "out", op.index, "    "),
    ]


# The vLLM dataclasses whose declared defaults a file leaves unsaid.
_DEFAULTED = ("vllm.config.ModelConfig", "vllm.config.SchedulerConfig", "vllm.config.CacheConfig",
              "vllm.v1.outputs.ModelRunnerOutput")


def scheduler_repro(
    log: OpLog, *, invariant: str, target: str, seed: object, violation: str, vllm_version: str | None = None
) -> str | None:
    """The source of a standalone pytest file reproducing ``log``'s failure of
    ``invariant`` at its last step (None when the file cannot state it)."""
    if invariant not in WRITABLE or not log.steps:
        return None
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
            f"{draw!r}; " + ", ".join(f"{size[k]} {noun if size[k] == 1 else noun + 's'}" for k, noun in
                                      (("groups", "group"), ("blocks", "block"), ("requests", "request"),
                                       ("steps", "schedule() step")))
        ),
    )
    requests = log.until_step(broken).requests
    constants = _constants(log, invariant, requests)
    test = _test_function(log, broken, invariant)
    scalars = (bool, int, str, type(None))  # the constants a file may state inline
    values = {name: value for name, (value, _) in constants.items() if isinstance(value, scalars)}
    more_imports = {
        "init_none_hash": ("vllm.v1.core.kv_cache_utils", "init_none_hash"),
        "sha256": ("vllm.utils.hashing", "sha256"),
        "pytest": ("pytest", None),
        "traceback": ("traceback", None),
        "torch": ("torch", None),
        **{k: ("vllm.v1.kv_cache_interface", k) for k in spec_classes(draw.layout.groups)},
    }
    roots = {"pytest", "ScriptedConnector"} if draw.connector else {"pytest"}
    defaults = adapter.declared_defaults(_DEFAULTED)
    values.update(_records_read(roots, values, constant_names=constants, extra=test, more_imports=more_imports,
                                defaults=defaults))
    kit = kit_source(roots, values, constant_names=constants, extra=test, more_imports=more_imports, defaults=defaults)
    prompts = [_tokens(_const(r.request_id), r.token_ids) for r in requests]
    emitted = [line for name, (_, text) in constants.items() if name in kit.constants for line in text]
    # The constants' values name spec classes (and torch dtypes): their imports too.
    kit = kit_source(roots, values, constant_names=constants, extra=test + "\n" + "\n".join(emitted),
                     more_imports=more_imports, in_full={_check_of(invariant)}, defaults=defaults)
    return "\n".join([
        header,
        *kit.imports,
        "",
        "pytestmark = pytest.mark.cpu_test",
        "",
        *emitted,
        "",
        *prompts,
        "",
        "",
        kit.code,
        "",
        "",
        test,
    ])


def _constants(log: OpLog, invariant: str, requests: list[AddRequest]) -> dict[str, tuple[object, list[str]]]:
    """Every constant a file may define (:mod:`fuzz.kit._params`): name ->
    (value, its lines with their comments). The file keeps those its code reads."""
    cfg = log.config
    draw = cfg.draw
    store = {r.request_id: None if r.reply is None else dataclasses.astuple(r.reply) for r in requests}
    answers = {r.request_id: [(a.num_computed_tokens, a.answer, a.load_async) for a in log.answers_for(r.request_id)]
               for r in requests}
    spec_method = draw.speculative_method
    c: dict[str, tuple[object, list[str]]] = {
        "MODEL_CONFIG": (None, [
            "# A tiny local model: vLLM reads its config.json only (no weights, no hub).",
            "MODEL_CONFIG = " + _compact_dict(json.loads(cfg.model_json)),
        ]),
        "SPECS": (None, specs_lines(draw.layout.groups)),
        "ROLES": (None, [
            "# Per group, what it holds of a request's prefix: every block (must-cover), the state",
            "# at the boundary (whole-state), nothing (scratch); 'windowed' (skips old tokens): unchecked.",
            f"ROLES = {roles_of(log)!r}",
        ]),
        "BEHAVIOURS": (None, [
            "# Per group, how the spec-kind table says it must truncate (Behaviour).",
            f"BEHAVIOURS = {behaviours_of(log)!r}",
        ]),
        "SPANS": (None, [
            "# Per group, its attention span: (parameter, value, how it skips old tokens: Span) or None.",
            f"SPANS = {spans_of(log)!r}",
        ]),
        "READ_RULES": (None, [
            "# Per group, which block indices of its table a request computing tokens",
            "# [s, e) reads, block size b: 'full' [0, ceil(e/b)); ('window', W) from",
            "# (s-W+1)//b; ('chunk', C) from the chunk of s; ('rswa', W) the prompt's",
            "# blocks and from (s-W)//b; 'state' the state blocks at ceil(s/b)-1 (the",
            "# one it resumes from) and ceil(e/b)-1 (the one it writes); 'none' nothing.",
            f"READ_RULES = {read_rules_of(log)!r}" if _watches(invariant, "reads") else "READ_RULES = []",
        ]),
        "NUM_BLOCKS": (draw.layout.num_blocks,
                       [f"NUM_BLOCKS = {draw.layout.num_blocks}  # block {cfg.null_block_id} is the null block"]),
        "NULL_BLOCK": (cfg.null_block_id, [f"NULL_BLOCK = {cfg.null_block_id}"]),
        "BLOCK_SIZE": (cfg.block_size, [
            f"BLOCK_SIZE = {cfg.block_size}  # the smallest prefix-cacheable group block, as the engine sets it"
        ]),
        "PREFIX_MATCH_UNIT": (cfg.prefix_match_unit, [f"PREFIX_MATCH_UNIT = {cfg.prefix_match_unit}"]),
        "SCHEDULER_BLOCK_SIZE": (cfg.scheduler_block_size, [
            f"SCHEDULER_BLOCK_SIZE = {cfg.scheduler_block_size}  # LCM of the group block sizes"
        ]),
        "HASH_BLOCK_SIZE": (cfg.hash_block_size, [f"HASH_BLOCK_SIZE = {cfg.hash_block_size}"]),
        "MAX_MODEL_LEN": (cfg.max_model_len, [f"MAX_MODEL_LEN = {cfg.max_model_len}"]),
        "MAX_NUM_SEQS": (draw.max_num_seqs, [f"MAX_NUM_SEQS = {draw.max_num_seqs}"]),
        "MAX_NUM_BATCHED_TOKENS": (draw.max_num_batched_tokens,
                                   [f"MAX_NUM_BATCHED_TOKENS = {draw.max_num_batched_tokens}"]),
        "LONG_PREFILL_TOKEN_THRESHOLD": (draw.long_prefill_token_threshold,
                                         [f"LONG_PREFILL_TOKEN_THRESHOLD = {draw.long_prefill_token_threshold}"]),
        "PREFILL_SCHEDULE_INTERVAL": (draw.prefill_schedule_interval, [
            f"PREFILL_SCHEDULE_INTERVAL = {draw.prefill_schedule_interval}  # --prefill-schedule-interval"
        ]),
        "ASYNC_SCHEDULING": (draw.async_scheduling, [
            f"ASYNC_SCHEDULING = {draw.async_scheduling}"
            + ("  # the engine's default: AsyncScheduler, outputs fed one step late" if draw.async_scheduling
               else "  # --no-async-scheduling: one batch in flight")
        ]),
        "SPECULATIVE_METHOD": (spec_method, [
            "# --speculative-config: the method and its num_speculative_tokens k; how many",
            "# drafts the rejection sampler accepts at each verification, cycled over the",
            "# step's verified requests (capped at the drafts it could accept).",
            f"SPECULATIVE_METHOD = {spec_method!r}",
        ]),
        "NUM_SPECULATIVE_TOKENS": (draw.num_speculative_tokens if spec_method else 0,
                                   [f"NUM_SPECULATIVE_TOKENS = {draw.num_speculative_tokens if spec_method else 0}"]),
        "DRAFT_ACCEPTANCE": (None, [f"DRAFT_ACCEPTANCE = {draw.draft_acceptance!r}"]),
        "DRAFT_MODEL_CONFIG": (None, [
            "# The EAGLE draft head's config.json (no weights, no hub).",
            "DRAFT_MODEL_CONFIG = " + _wrap_dict(_draft_model_config() if spec_method == "eagle" else {}),
        ]),
        "KV_LOAD_FAILURE_POLICY": (draw.kv_load_failure_policy,
                                   [f"KV_LOAD_FAILURE_POLICY = {draw.kv_load_failure_policy!r}"]),
        "CONNECTOR": (draw.connector, []),
        # No connector, no role: the kit's producer branches go with it.
        "KV_ROLE": (draw.kv_role if draw.connector else None, [
            *(["# The connector's kv_role: a P/D prefill instance (it never loads, so vLLM",
               "# frees blocks at once and may preempt a request whose step is in flight)."]
              if draw.kv_role == "kv_producer" else []),
            f"KV_ROLE = {draw.kv_role!r}",
        ]),
        "KV_CONFIG_FIELDS": (None, [
            "# What the engine's KV-cache planning writes onto the KVCacheConfig.",
            f"KV_CONFIG_FIELDS = {dict(cfg.kv_config_fields)!r}",
        ]),
        "DIVERGENT_HITS": (draw.divergent_hits, [
            "# The connector's supports_divergent_local_hybrid_hits.",
            f"DIVERGENT_HITS = {draw.divergent_hits!r}",
        ]),
        "KV_EVENTS": (draw.kv_events, [f"KV_EVENTS = {draw.kv_events!r}"]),
        "ENGINE_METRICS": (draw.metrics, [f"ENGINE_METRICS = {draw.metrics!r}"]),
        "FINISHED_SETS": (draw.finished_sets, [f"FINISHED_SETS = {draw.finished_sets!r}"]),
        # --enable-lora, stated only where a request runs under an adapter.
        "MAX_LORAS": (loras := draw.max_loras if any(r.lora for r in requests) else 0, [f"MAX_LORAS = {loras!r}"]),
        # What _make_request builds only where some request asks for it.
        "CACHE_SALTS": (any(r.cache_salt for r in requests), []),
        "PROMPT_EMBEDS": (any(r.embeds for r in requests), []),
        "MULTIMODAL": (images := max((n for r in requests for *_, n in r.mm), default=0), [f"MULTIMODAL = {images!r}"]),
        "SKIPS_PREFIX_CACHE": (any(r.skip_reading_prefix_cache for r in requests), []),
        "STORE": (None, [
            "",
            "# The external store, per request: (kind, tokens held, first answers",
            "# 'not yet', tokens over-reported, async). kind 'store': it holds the first",
            "# tokens-held tokens; 'zero': nothing; 'undecided': None for the first",
            "# answers, then as 'store'; 'over': more than the prompt (a contract breach);",
            "# 'saved': the connector's own store of what finished requests computed.",
            "STORE = " + _wrap_dict(store),
            *(["# The answers the recorded run got, (num_computed_tokens, answer, async) per call.",
               "RECORDED_ANSWERS = " + _wrap_dict(answers)] if any(answers.values()) else []),
        ]),
        # What the file watches beyond what every claim needs (the kit's
        # if-branches on them are kept or dropped as the file is written).
        **{f"WATCH_{what.upper().replace('-', '_')}": (_watches(invariant, what), []) for what in _WATCH_CONSTANTS},
        "WATCH_JOINT_HITS": (_reads_joint_hits(invariant), []),
        **{constant: (True, []) for constant in _KEPT_WHERE_READ},  # scheduler_repro turns off the unread
        "FAILING_LOADS": (any(op.fed is not None and (op.fed.failed_recving or op.fed.invalid_block_ids)
                              for op in log.until_step(_broken_step(log)).steps), []),
        "SAVED_STORE": (any(r.reply is not None and r.reply.kind == "saved" for r in requests), []),
    }
    return c


def _draft_model_config() -> dict:
    from fuzz.adapter._config import _MODEL_CONFIGS

    return dict(_MODEL_CONFIGS["eagle-draft"])


def _test_function(log: OpLog, broken: int, invariant: str) -> str:
    """The test: the program up to the broken step, the claim there, then
    every request to its end and vLLM's own leak check."""
    draw = log.config.draw
    lines = [f"def test_scheduler_{invariant.replace('-', '_')}_repro(tmp_path, monkeypatch):"]
    if draw.model_runner is not None:
        lines.append(
            f'    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "{1 if draw.model_runner == "v2" else 0}")'
        )
    lines += [
        "    init_none_hash(sha256)",
        "    scheduler = _make_scheduler(tmp_path)",
        "    watch = _Watch(scheduler)",
        *_program(log, broken, invariant),
        "",
        "    # Every request runs to its end; then the pool must be whole again.",
        "    _drain(scheduler, watch)",
        "    _assert_no_leaked_blocks(scheduler)",
        "",
    ]
    return "\n".join(lines)


def _compact_dict(d: dict) -> str:
    """``d`` as a literal, its items filled into lines of at most 120 characters."""
    body = textwrap.fill(", ".join(f"{k!r}: {v!r}" for k, v in d.items()), 116, initial_indent="    ",
                         subsequent_indent="    ", break_on_hyphens=False)
    return "{\n" + body + ",\n}"


def _wrap_dict(d: dict) -> str:
    if not d:
        return "{}"
    items = [f"    {k!r}: {v!r}," for k, v in d.items()]
    return "{\n" + "\n".join(items) + "\n}"


def shrunk_log_of_failure(failure: BaseException | None, invariant: str) -> OpLog | None:
    """The operation log a repro of ``failure`` replays: the one its run
    attached to it (:func:`fuzz.runners.scheduler.carrying_oplog`; Hypothesis
    raises the minimal example's), shrunk further by replay. None when the
    failure carries no log, the log does not show it (several failures
    replayed at once), or the file cannot state ``invariant``."""
    log = getattr(failure, "oplog", None)
    if not isinstance(log, OpLog) or invariant not in WRITABLE:
        return None
    if _replay_checked(log, invariant) is None:
        return None
    return shrink_oplog(log, invariant)


def scheduler_repro_of_failure(
    *, target: str, seed: object, invariant: str, violation: str, failure: BaseException | None
) -> str | None:
    """The repro of ``failure`` (:func:`shrunk_log_of_failure`); None when
    there is none."""
    log = shrunk_log_of_failure(failure, invariant)
    if log is None:
        return None
    if isinstance(failure, InvariantViolation):  # the sidecar keeps the log the file came from
        failure.repro_oplog = log
    return scheduler_repro(log, invariant=invariant, target=target, seed=seed, violation=violation)
