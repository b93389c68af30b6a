"""An upstream-form repro: a failing run written as a test in vLLM's own
idiom, for vLLM's ``tests/v1/core`` (or ``tests/v1/kv_connector/unit``
where a KV connector is part of the case).

:func:`upstream_repro` writes it from the (shrunk) operation log
(:class:`fuzz.model.OpLog`) and the violation its replay raised, whose
:attr:`~fuzz.model.InvariantViolation.facts` say what to assert:

* the scheduler comes from vLLM's helpers (``create_scheduler`` of
  ``tests/v1/core/utils.py``; with a connector, ``create_vllm_config`` and
  ``create_scheduler`` of ``tests/v1/kv_connector/unit/utils.py`` and its
  ``MockKVConnector``); what they cannot give (a second KV-cache group, KV
  events, an encoder budget, a connector that keeps what it is handed, the
  mock's answers where they change, the count ``get_num_blocks_to_allocate``
  gives) is built in a few explicit lines; a drafter as
  :mod:`fuzz.upstream._speculation` states it;
* each request is a ``Request`` with the run's tokens;
* the run is concrete steps: add, ``schedule()``, feed a
  ``ModelRunnerOutput`` (``create_model_runner_output`` where one token per
  request does), abort, evict, reset; no driver loop, no recording class;
* it stops at the last fact, each asserted where the check saw it (right
  after the step's ``schedule()`` or its ``update_from_output()``, or right
  before a ``schedule()`` that raises on what the fact shows), with a
  message naming the request, blocks and step, the general claim (the
  check's docstring) in the test's docstring.

Nothing of the suite travels in the file: the full record stays in the
campaign's sidecar, which ``python -m fuzz replay`` reruns under every claim.
Generated Python is built as plain statements here (style rule 17).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap

from fuzz.adapter import VLLM_VERSION
from fuzz.model import (
    Abort,
    AddRequest,
    Evict,
    Fact,
    FedOutput,
    InvariantViolation,
    OpLog,
    OpVisitor,
    ResetPrefixCache,
    Step,
)
from fuzz.upstream._answers import connector_answers
from fuzz.upstream._claims import CLAIMS
from fuzz.upstream._connector import RECORDS, connector_config, declare_recorder
from fuzz.upstream._facts import BEFORE_UPDATE, PRELUDES, Context, fact_lines
from fuzz.upstream._file import CORE as _CORE
from fuzz.upstream._file import UNIT as _UNIT
from fuzz.upstream._file import File as _File
from fuzz.upstream._file import Unwritable as _Unwritable
from fuzz.upstream._pool_facts import POOL_SETUPS
from fuzz.upstream._speculation import (
    connector_stands_in,
    draft_lines,
    speculation_args,
    unstated,
)
from invariants.table import INVARIANTS

__all__ = ["upstream_form", "upstream_path", "upstream_repro"]

# Facts a file asserts at most (the rest are named in a comment).
MAX_FACTS = 3

def _name(request_id: str) -> str:
    name = "".join(c if c.isalnum() else "_" for c in request_id)
    return name if name[:1].isalpha() else f"req_{name}"


def _claim(invariant: str) -> str:
    """The general claim ``invariant`` states."""
    if invariant in CLAIMS:
        return CLAIMS[invariant]
    for row in INVARIANTS:
        if row.name == invariant and row.tier == "scheduler":
            doc = inspect.getdoc(row.check) or invariant
            return " ".join(doc.split("\n\n")[0].split())
    return invariant


def _spec(f: _File, kind: str, block_size: int, params: dict[str, int]) -> str:
    """A group's spec, by vLLM's test factories where one builds it."""
    if kind == "FullAttentionSpec" and not params:
        f.need(_CORE, "new_kv_cache_spec")
        return f"new_kv_cache_spec(block_size={block_size}, num_kv_heads=1, head_size=1)"
    if kind == "SlidingWindowSpec" and set(params) == {"sliding_window"}:
        f.need(_CORE, "new_sliding_window_spec")
        return (f"new_sliding_window_spec(block_size={block_size}, num_kv_heads=1, head_size=1, "
                f"sliding_window={params['sliding_window']})")
    if kind == "SlidingWindowMLASpec" and set(params) == {"sliding_window"}:
        f.need("vllm.v1.kv_cache_interface", "SlidingWindowMLASpec")
        f.need("torch")
        return (f"SlidingWindowMLASpec(block_size={block_size}, num_kv_heads=1, head_size=1, dtype=torch.float32, "
                f"sliding_window={params['sliding_window']})")
    if kind == "ChunkedLocalAttentionSpec" and set(params) == {"attention_chunk_size"}:
        f.need("vllm.v1.kv_cache_interface", "ChunkedLocalAttentionSpec")
        f.need("torch")
        return (f"ChunkedLocalAttentionSpec(block_size={block_size}, num_kv_heads=1, head_size=1, "
                f"dtype=torch.float32, attention_chunk_size={params['attention_chunk_size']})")
    if kind == "MambaSpec" and set(params) <= {"num_speculative_blocks"}:
        f.need(_CORE, "new_mamba_spec")
        return (f"new_mamba_spec(block_size={block_size}, shapes=((1,), (1,)), "
                f"num_speculative_blocks={params.get('num_speculative_blocks', 0)}, mamba_cache_mode=\"align\")")
    raise _Unwritable(f"a {kind} group")


def _scheduler(f: _File, log: OpLog, facts: tuple[Fact, ...]) -> None:
    cfg, draw = log.config, log.config.draw
    groups = draw.layout.groups
    if draw.prefill_schedule_interval != 1:
        raise _Unwritable("a prefill interval")
    # The helpers build schedulers with both on: a file would replay another engine.
    if not draw.prefix_caching:
        raise _Unwritable("prefix caching off")
    if not draw.chunked_prefill:
        raise _Unwritable("chunked prefill off")
    if unstated(log):
        raise _Unwritable(unstated(log))
    connector = _has_connector(log)
    plain = len(groups) == 1 and groups[0].kind == "FullAttentionSpec" and not groups[0].params
    mamba = any(g.kind == "MambaSpec" for g in groups)
    # The helpers' own spec is one full-attention group: others are stated.
    specs = [] if plain else [_spec(f, g.kind, g.block_size, dict(g.params)) for g in groups]
    limits = (f"block_size={cfg.scheduler_block_size}, max_num_seqs={draw.max_num_seqs}, "
              f"max_num_batched_tokens={draw.max_num_batched_tokens}, max_model_len={cfg.max_model_len}")
    b = f.body
    if connector:
        f.need(_UNIT, "create_scheduler", "create_vllm_config")
        # The mock lacks the hybrid allocator's hand-off (more than one group
        # needs it) and keeps nothing it is handed: a small subclass has both.
        keeps = any(fact.subject == "handed-blocks" for fact in facts)
        counts = any(fact.subject == "finished-calls" for fact in facts)
        # What the scheduler told the connector, where a fact reads it.
        records = tuple(r for r in RECORDS if any(fact.subject == RECORDS[r][0] for fact in facts))
        answers = connector_answers(log)
        store = answers is not None and answers.store
        hand_off = len(groups) > 1 or keeps or counts
        recorder = "HandOffRecorder" if hand_off else "CallRecorder"
        handed = hand_off or bool(records) or store
        extra = connector_config(log)
        b += ["    vllm_config = create_vllm_config(",
              f"        {limits},",
              f'        kv_connector="{recorder if handed else "MockKVConnector"}",'
              + (" kv_connector_module_path=__name__," if handed else ""),
              f'        kv_role="{draw.kv_role}", kv_load_failure_policy="{draw.kv_load_failure_policy}",',
              "        kv_connector_extra_config={" + ", ".join(f'"{k}": {v!r}' for k, v in extra.items()) + "},",
              "    )"]
        if handed:
            declare_recorder(f, draw.kv_role == "kv_producer", keeps, counts, records, hand_off, store)
        config = "vllm_config"
    else:
        f.need(_CORE, "create_scheduler")
        config = "scheduler.vllm_config"
    more = []
    if draw.long_prefill_token_threshold:
        more.append(("long_prefill_token_threshold", draw.long_prefill_token_threshold))
    if draw.async_scheduling:
        more.append(("async_scheduling", True))
    if connector:
        b += [f"    vllm_config.scheduler_config.{k} = {v!r}" for k, v in more]
        if draw.max_loras and any(r.lora for r in log.requests):
            f.need("vllm.config", "LoRAConfig")
            b.append(f"    vllm_config.lora_config = LoRAConfig(max_loras={draw.max_loras})")
        if mamba:  # prefix caching with a Mamba group needs align mode
            b.append('    vllm_config.cache_config.mamba_cache_mode = "align"')
        if specs:  # the helper's own group is full attention with the config's block size
            b += _kv_cache_config(f, log, specs)
        b.append(f"    scheduler = create_scheduler(vllm_config, num_blocks={draw.layout.num_blocks}"
                 + (f", kv_cache_config=kv_cache_config, hash_block_size={cfg.hash_block_size})" if specs else ")"))
    else:
        args = ["enable_prefix_caching=True", limits, f"num_blocks={draw.layout.num_blocks}"]
        args += [f"{k}={v!r}" for k, v in more]
        args += speculation_args(f, log)
        if len(groups) == 1 and specs and not mamba:
            args.append(f"kv_cache_spec={specs[0]}")
        if draw.max_loras and any(r.lora for r in log.requests):
            f.need("vllm.config", "LoRAConfig")
            args.append(f"lora_config=LoRAConfig(max_loras={draw.max_loras})")
        if draw.model_runner is not None:
            args.append(f"use_v2_model_runner={draw.model_runner == 'v2'}")
        b += ["    scheduler = create_scheduler("] + [
            f"        {line}" for line in textwrap.wrap(", ".join(args) + ",", 100)] + ["    )"]
        if len(groups) > 1 or mamba:
            b.append("    # The helper builds one KV-cache group" + (", no Mamba align mode" if mamba else "")
                     + ": the same scheduler on this run's groups.")
            if mamba:
                b.append(f'    {config}.cache_config.mamba_cache_mode = "align"')
            if cfg.block_size != cfg.scheduler_block_size:  # the block a Mamba chunk split aligns to
                b.append(f"    {config}.cache_config.block_size = {cfg.block_size}  # the smallest cacheable group's")
            b += _kv_cache_config(f, log, specs)
            f.need("vllm.v1.structured_output", "StructuredOutputManager")
            b += ["    scheduler = type(scheduler)(",
                  f"        vllm_config={config}, kv_cache_config=kv_cache_config, block_size={cfg.scheduler_block_size},",
                  f"        hash_block_size={cfg.hash_block_size}, log_stats=True,",
                  f"        structured_output_manager=StructuredOutputManager({config}),",
                  "    )"]
    if connector and draw.model_runner is not None:
        b.append(f"    scheduler.use_v2_model_runner = {draw.model_runner == 'v2'}")
    if draw.kv_events:
        b.append("    # --kv-events-config: the block pool queues BlockStored / BlockRemoved events.")
        b.append("    scheduler.kv_cache_manager.block_pool.enable_kv_cache_events = True")
    items = [n for r in log.requests for *_, n in r.mm]
    if items:
        size = max(draw.max_num_batched_tokens, *items)
        f.need("vllm.v1.core.encoder_cache_manager", "EncoderCacheManager")
        b += ["    # A multimodal model's encoder budget (a text model's scheduler has none): one batch or one item.",
              f"    scheduler.max_num_encoder_input_tokens = {size}",
              f"    scheduler.encoder_cache_manager = EncoderCacheManager(cache_size={size})"]


def _kv_cache_config(f: _File, log: OpLog, specs: list[str]) -> list[str]:
    """The run's ``KVCacheConfig``, with what the engine's KV-cache planning
    writes onto it (a lookup's alignment and retention read those fields)."""
    f.need("vllm.v1.kv_cache_interface", "KVCacheConfig", "KVCacheGroupSpec")
    planned = ", ".join(f"{k}={v!r}" for k, v in log.config.kv_config_fields if v is not None)
    return (["    kv_cache_config = KVCacheConfig(",
             f"        num_blocks={log.config.draw.layout.num_blocks},",
             *([f"        {planned},"] if planned else []),
             "        kv_cache_tensors=[],",
             "        kv_cache_groups=["]
            + [f'            KVCacheGroupSpec(["layer{i}"], {spec}),' for i, spec in enumerate(specs)]
            + ["        ],", "    )"])


def _request(f: _File, add: AddRequest, hash_block_size: int, embeds: tuple[str, ...] = ()) -> list[str]:
    f.need("vllm.v1.request", "Request")
    f.need("vllm.sampling_params", "SamplingParams")
    f.need("vllm.v1.core.kv_cache_utils", "get_request_block_hasher")
    f.need("vllm.utils.hashing", "sha256")
    tokens = list(add.token_ids)
    if tokens == list(range(tokens[0], tokens[0] + len(tokens))):
        prompt = f"list(range({tokens[0]}, {tokens[0] + len(tokens)}))" if tokens[0] else f"list(range({len(tokens)}))"
    else:
        prompt = repr(tokens)
    if add.embeds is not None:  # prompt embeddings instead of tokens (vLLM records zeros)
        prompt = "None"
    keywords = [f'request_id="{add.request_id}"', f"prompt_token_ids={prompt}",
                f"sampling_params=SamplingParams(max_tokens={add.max_tokens}, ignore_eos={add.ignore_eos})",
                "pooling_params=None", f"block_hasher=get_request_block_hasher({hash_block_size}, sha256)"]
    if add.embeds is not None:  # vLLM hashes each block's rows: one value per tag tells the tags apart
        f.need("torch")
        keywords.append(f"prompt_embeds=torch.full(({len(tokens)}, 4), {embeds.index(add.embeds) + 1}.0)")
    if add.cache_salt:
        keywords.append(f"cache_salt={add.cache_salt!r}")
    if add.lora:
        from fuzz.adapter._identity import lora_identity

        f.need("vllm.lora.request", "LoRARequest")
        keywords.append(f"lora_request=LoRARequest{lora_identity(add.lora)!r}")
    if add.skip_reading_prefix_cache:
        keywords[2] = keywords[2][:-1] + ", skip_reading_prefix_cache=True)"
    if add.mm:
        f.need("vllm.multimodal.inputs", "MultiModalFeatureSpec", "MultiModalKwargsItem", "PlaceholderRange")
        features = ", ".join(
            f'MultiModalFeatureSpec(data=MultiModalKwargsItem.dummy(), modality="image", identifier="{name}", '
            f"mm_position=PlaceholderRange(offset={offset}, length={length}))" for name, offset, length in add.mm)
        keywords.append(f"mm_features=[{features}]")
    text = f"    {_name(add.request_id)} = Request(" + ", ".join(keywords) + ")"
    if len(text) <= 120:
        return [text]
    return [f"    {_name(add.request_id)} = Request("] + [f"        {k}," for k in keywords] + ["    )"]


def _feed(f: _File, fed: FedOutput, output: str) -> list[str]:
    """``update_from_output`` with the output the harness fed back (then,
    speculating synchronously, the drafter's proposals)."""
    return _update(f, fed, output) + draft_lines(f, fed)


def _update(f: _File, fed: FedOutput, output: str) -> list[str]:
    names = "[" + ", ".join(_name(r) for r in fed.req_ids) + "]"
    sampled = [list(t) for t in fed.sampled_token_ids]
    kv = {k: set(v) for k, v in (("finished_sending", fed.finished_sending), ("finished_recving", fed.finished_recving),
                                ("invalid_block_ids", fed.invalid_block_ids)) if v}
    one_token = len({tuple(s) for s in sampled}) == 1 and len(sampled[0]) == 1 if sampled else False
    if one_token and not fed.failed_recving:
        f.need(_UNIT, "create_model_runner_output")
        extra = "".join(f", {k}={v!r}" for k, v in kv.items())
        return [(f"    scheduler.update_from_output({output}, create_model_runner_output("
                 f"{names}, token_id={sampled[0][0]}{extra}))")]
    if not fed.req_ids and not kv and not fed.failed_recving:
        f.need("vllm.v1.outputs", "EMPTY_MODEL_RUNNER_OUTPUT")
        return [f"    scheduler.update_from_output({output}, EMPTY_MODEL_RUNNER_OUTPUT)"]
    f.need("vllm.v1.outputs", "ModelRunnerOutput")
    ids = [f'"{r}"' for r in fed.req_ids]
    fields = [f"req_ids=[{', '.join(ids)}]", "req_id_to_index={" + ", ".join(f"{r}: {i}" for i, r in enumerate(ids)) + "}",
              f"sampled_token_ids={sampled!r}"]
    if len(", ".join(fields)) <= 88 and not kv and not fed.failed_recving:
        return [f"    scheduler.update_from_output({output}, ModelRunnerOutput(", f"        {', '.join(fields)}))"]
    lines = [f"    scheduler.update_from_output({output}, ModelRunnerOutput("] + [f"        {x}," for x in fields]
    if kv or fed.failed_recving:
        f.need("vllm.v1.outputs", "KVConnectorOutput")
        if fed.failed_recving:
            kv["failed_recving"] = set(fed.failed_recving)
        lines.append("        kv_connector_output=KVConnectorOutput("
                     + ", ".join(f"{k}={v!r}" for k, v in kv.items()) + "),")
    return lines + ["    ))"]


def _scheduled(step: Step) -> str:
    if step.error and step.error_where == "schedule":
        return f"schedule() raises {step.error.split(':')[0]}"
    if step.output is None or not step.output.num_scheduled:
        return "schedules nothing"
    return "schedules " + ", ".join(f"{n} token{'s' * (n != 1)} of {r}" for r, n in step.output.num_scheduled) + (
        f"; preempts {', '.join(step.output.preempted)}" if step.output.preempted else "")


def _facts_at(f: _File, facts: list[Fact], ctx: Context) -> list[str]:
    lines: list[str] = []
    for subject in dict.fromkeys(fact.subject for fact in facts):
        prelude, imports = PRELUDES.get(subject, ([], ()))
        lines += prelude
        for module, name in imports:
            f.need(module, name)
    for fact in facts:
        rendered = fact_lines(fact, ctx)
        if rendered is None:
            raise _Unwritable(f"a {fact.subject} fact")
        lines += rendered
    return lines


def _program(f: _File, log: OpLog, facts: tuple[Fact, ...]) -> None:
    last = log.steps[-1].index
    at: dict[tuple[int, str], list[Fact]] = {}
    for fact in facts:
        at.setdefault((fact.step or last, fact.after), []).append(fact)
    program = _Program(f, log, at)
    for op in log.ops:
        if not program.visit(op):
            return


class _Program(OpVisitor[bool]):
    """Each operation as the test's lines, with the facts due after each
    step's ``schedule()`` and ``update_from_output()``; False: the program
    ends there (the last step a fact is due at)."""

    def __init__(self, f: _File, log: OpLog, at: dict[tuple[int, str], list[Fact]]) -> None:
        self.f, self.at, self.cfg = f, at, log.config
        # No facts (a steps-only file, fuzz.upstream._steps): every step of the log.
        self.stop = max(at)[0] if at else log.steps[-1].index
        self.names = {r.request_id: _name(r.request_id) for r in log.requests}
        self.embeds = tuple(dict.fromkeys(r.embeds for r in log.requests if r.embeds is not None))
        # The connector's config as each step changes it (the first is the file's).
        answers = connector_answers(log) if self.cfg.draw.connector else None
        self.answers = dict(list(answers.configs.items())[1:]) if answers is not None else {}
        self.store = answers is not None and answers.store
        self.log = log
        self.added = False
        self.block_sizes = tuple(g.block_size for g in self.cfg.draw.layout.groups)
        self.during: list[str] = []

    def on_add_request(self, op: AddRequest) -> bool:
        b, self.added = self.f.body, True
        if b[-1].startswith("    scheduler.update_from_output("):
            b.append("")
        b += _request(self.f, op, self.cfg.hash_block_size, self.embeds)
        b.append(f"    scheduler.add_request({self.names[op.request_id]})")
        return True

    def on_abort(self, op: Abort) -> bool:
        if op.during_step:
            self.during.append(op.request_id)
        else:
            self.f.need("vllm.v1.request", "RequestStatus")
            self.f.body.append(f'    scheduler.finish_requests("{op.request_id}", RequestStatus.FINISHED_ABORTED)')
        return True

    def on_evict(self, op: Evict) -> bool:
        self.f.body.append(f"    scheduler.kv_cache_manager.evict_blocks({set(op.block_ids)!r})")
        return True

    def on_reset_prefix_cache(self, op: ResetPrefixCache) -> bool:
        self.f.body.append(f"    scheduler.reset_prefix_cache(reset_running_requests={op.reset_running})")
        return True

    def on_step(self, op: Step) -> bool:
        f, b, at, stop = self.f, self.f.body, self.at, self.stop
        if op.index > stop:
            return False
        async_ = self.cfg.draw.async_scheduling
        asserted = any((op.index, after) in at for after in ("schedule", "update"))
        if not self.added and not async_ and not asserted and op.output is not None and not op.output.num_scheduled:
            return True  # a schedule() before any request does nothing (and no fact is due there)
        output = f"output_{op.index}" if async_ else "output"
        ctx = Context(self.names, output, op.index, self.cfg.hash_block_size, self.block_sizes)
        if (op.index, "before") in at:  # stated before the step's schedule(), where the test stops
            b += ["", f"    # Step {op.index}: before its schedule()."] + _facts_at(f, at[op.index, "before"], ctx)
            return False
        b.append("")
        if op.index in self.answers:
            f.need(_UNIT, "MockKVConfig")
            fields = ", ".join(f"{k}={v!r}" for k, v in connector_config(self.log, self.answers[op.index]).items())
            matched, _, defers = self.answers[op.index]
            b += [f"    # From step {op.index} on, the connector "
                  + (f"holds the first {matched} tokens of each prompt" if self.store else f"matches {matched} tokens")
                  + (f", after {defers} 'not yet' answers." if defers else "."),
                  f"    scheduler.connector.config = MockKVConfig({fields})"]
        if (op.output is None or op.error) and (at or op.index != stop):
            # A steps-only file (fuzz.upstream._steps) ends on it: vLLM raises there.
            due = at.get((op.index, "schedule"), [])
            if op.error_where != "schedule" or not any(fact.subject == "raises" for fact in due):
                raise _Unwritable("a step that raised")
            b += [f"    # Step {op.index}: schedule() raises."] + _facts_at(f, due, ctx)
            return False
        b += [f"    # Step {op.index}: {_scheduled(op)}.", f"    {output} = scheduler.schedule()"]
        scheduled_at = len(b) - 1
        b += _facts_at(f, at.get((op.index, "schedule"), []), ctx)
        if at and op.index == stop and (stop, "update") not in at:
            if not any(output in line for line in b[scheduled_at + 1:]):
                b[scheduled_at] = "    scheduler.schedule()"
            return False
        if op.fed is not None:
            if self.during:
                f.need("vllm.v1.request", "RequestStatus")
            b += [f'    scheduler.finish_requests("{r}", RequestStatus.FINISHED_ABORTED)  # while the model runs'
                  for r in self.during]
            self.during = []
            b += [line for fact in at.get((op.index, "update"), []) if fact.subject in BEFORE_UPDATE
                  for line in BEFORE_UPDATE[fact.subject](fact, ctx)]
            b += _feed(f, op.fed, f"output_{op.fed_step}" if async_ and op.fed_step else output)
        b += _facts_at(f, at.get((op.index, "update"), []), ctx)
        return op.index != stop


def _cut_at_schedule(log: OpLog, facts: tuple[Fact, ...]) -> OpLog:
    """``log`` whose last step's ``update_from_output()`` raised, where every
    fact due there follows its ``schedule()``: the file stops before the
    update, so the step is written as one that fed nothing."""
    last = log.steps[-1]
    due = [f for f in facts if (f.step or last.index) == last.index]
    if last.error_where != "update_from_output" or not due or any(f.after != "schedule" for f in due):
        return log
    cut = dataclasses.replace(last, fed=None, error=None, error_where=None)
    return dataclasses.replace(log, ops=[cut if op is last else op for op in log.ops])


def _drop_unread_outputs(body: list[str]) -> None:
    """Under async scheduling a step's output is fed a step late: where the
    test stops before feeding it, its ``schedule()`` is a bare call."""
    for i, line in enumerate(body):
        name, _, call = line.strip().partition(" = ")
        if call == "scheduler.schedule()" and name.startswith("output_") and not any(
                name in re.findall(r"\w+", other) for other in body[i + 1:]):
            body[i] = "    scheduler.schedule()"


def upstream_path(log: OpLog) -> str:
    """Where the file belongs in vLLM's tests tree: the connector unit tests
    where the case has a KV connector, else the core tests."""
    return "v1/kv_connector/unit" if _has_connector(log) else "v1/core"


def _has_connector(log: OpLog) -> bool:
    """Whether the file builds the run's KV connector (an EAGLE run's idle
    one it states as what it changed: :func:`connector_stands_in`)."""
    return log.config.draw.connector and not connector_stands_in(log)


def upstream_repro(oplog: OpLog, violation: InvariantViolation, *, vllm_version: str | None = None) -> str | None:
    """The source of a pytest file in vLLM's idiom that replays ``oplog``
    and asserts ``violation``'s facts on vLLM's state (None where it has
    none, or the run uses what the writer does not state)."""
    facts = tuple(violation.facts)
    if not facts or not oplog.steps:
        return None
    oplog = _cut_at_schedule(oplog, facts[:MAX_FACTS])
    shown, left = facts[:MAX_FACTS], len(facts) - MAX_FACTS
    f = _File()
    f.need("vllm.utils.hashing", "sha256")
    f.need("vllm.v1.core.kv_cache_utils", "init_none_hash")
    invariant = violation.invariant
    f.body += [f"def test_{invariant.replace('-', '_')}():",
               textwrap.fill(_claim(invariant), 92, initial_indent='    """', subsequent_indent="    ") + '"""',
               "    init_none_hash(sha256)"]
    try:
        _scheduler(f, oplog, shown)
        for subject in dict.fromkeys(fact.subject for fact in shown if fact.subject in POOL_SETUPS):
            f.body += ["", *POOL_SETUPS[subject]]
        f.body.append("")
        _program(f, oplog, shown)
    except _Unwritable:
        return None
    _drop_unread_outputs(f.body)
    if left > 0:
        f.body.append(f"    # ... and {left} more like these.")
    return _source(f, violation, vllm_version)


def _source(f: _File, violation: InvariantViolation, vllm_version: str | None) -> str:
    """The file: its docstring, imports, the connector's class and the test."""
    version = vllm_version or VLLM_VERSION
    head = [
        "# SPDX-License-Identifier: Apache-2.0",
        f'"""vLLM {version} breaks \'{violation.invariant}\' in {violation.where or "the scheduler"} (kvtrunc-fuzz).',
        "",
        'The campaign\'s JSON sidecar keeps the whole run for `python -m fuzz replay`."""',
        "",
    ]
    return "\n".join([*head, *f.import_lines(), "", "pytestmark = pytest.mark.cpu_test", "", "",
                      *([*f.top, "", ""] if f.top else []), *f.body, ""])


def upstream_form(log: OpLog, invariant: str) -> tuple[str, str, InvariantViolation] | None:
    """``log``'s failure of ``invariant`` in upstream form: (its path in
    vLLM's tests tree, its source, the violation whose facts it asserts).
    The log is shrunk with the claim's check alone and replayed; where the
    shrunk run's violation has no facts the file can state (a shorter run
    may break the claim where the vocabulary says nothing), the whole run
    is. None when neither replay breaks the claim with facts a file states."""
    from fuzz.repro.shrink import replay_violation, shrink_oplog

    rows = [row for row in INVARIANTS if row.name == invariant and row.tier == "scheduler"]
    if not rows:
        return None
    checks = (rows[0].check,)
    whole = replay_violation(log, invariant, checks)
    if whole is None:
        return None
    for violation in (replay_violation(shrink_oplog(log, invariant, checks=checks), invariant, checks), whole):
        if violation is None or not isinstance(violation.oplog, OpLog):
            continue
        source = upstream_repro(violation.oplog, violation)
        if source is not None:
            return f"{upstream_path(violation.oplog)}/test_{invariant.replace('-', '_')}.py", source, violation
    return None
