"""The vocabulary of :class:`fuzz.model.Fact` subjects, each rendered as an
assertion on vLLM's own objects in an upstream-form repro.

A check that fails attaches what it found as facts (``subject``, ``args``,
``observed``, ``expected``, ``relation``); :func:`fact_lines` turns one into
the statements that assert it in the test, with a message naming the
request, blocks and step. The expected value is the fact's, which the
check took from the suite's model of what the harness did (style rule 19);
the expression only reads what vLLM did.

Subjects (their ``args``):

* ``cached-blocks`` (request, tokens, group[, why]): the blocks the
  prefix-cache index holds under the request's key for its first
  ``tokens`` tokens (``!=``: ``why`` says what the block holds instead);
* ``hit-tokens`` (request[, why]): the tokens the admitting ``schedule()``
  found computed for the request (its hit), before the tokens it scheduled
  (``<=``: ``why`` says what the first position past the bound holds);
* ``places`` (request): the places the scheduler keeps the request in
  (``running``, ``waiting``, ``kv_holding_waiting``);
* ``status`` (request[, why]): the request's ``RequestStatus`` name;
* ``handed-blocks`` (request, group): the block ids ``request_finished_all_groups``
  handed the connector for the group;
* ``encoder-freed`` (mm hash, request, placeholder): the step's
  ``free_encoder_mm_hashes`` names it while the request reads the placeholder;
* ``encoder-scheduled`` (request, item): the step's ``scheduled_encoder_inputs``
  runs the request's item;
* ``stored-event`` (request, tokens, field): a field of the ``BlockStored``
  entry the block pool queued for the request's key over its first
  ``tokens`` tokens (``token_ids``: that block's slice);
* ``same-key`` (request a, tokens a, request b, tokens b): the request
  hasher gave b's first ``tokens b`` tokens the key of a's first ``tokens a``;
* ``table-block`` (request, group, index, start, positions[, why]): the
  block at ``index`` of the request's table in the group (as a list of at
  most one), where its step computing from ``start`` reads ``positions``;
* ``preempted-request`` (request, field): what the request resumes from
  (``status``, ``num_computed_tokens``, ``num_output_placeholders``,
  ``spec_token_ids``: their number, ``blocks held``: in all groups);
* ``evicted-before`` (request b, tokens b, request c, tokens c, group,
  block b, block c, why): the index still holds b's entry, or no longer
  c's (an allocation took block b while block c, which the free order
  reuses first, stayed cached);
* ``block-held`` (block, request, group, index, step, start): the block's
  ``ref_cnt``, which the request's step in flight (computing from
  ``start``) reads at ``index`` of its table in the group;
* ``scheduled`` (request, why): the step's ``schedule()`` schedules the
  request (``why``: what says it must, or must not);
* ``block-hash`` (block, request, how, policy): the block carries a
  prefix-cache hash (after the request's load into it failed);
* ``computed-tokens`` (request, why): the request's ``num_computed_tokens``;
* ``finished-calls`` (request, method): how many times the connector (the
  file's recording one) heard the request finished;
* ``connector-meta`` (): the step's output carries connector metadata;
* ``sync-loads-flag`` (request, tokens): the step's output says
  ``has_sync_kv_loads``;
* ``raises`` (exception type, requests): what the step's ``schedule()``
  raised (``is None``), while admitting the requests; its lines make the
  call themselves.
* those of block ownership, KV events, stale outputs and leaks:
  :mod:`fuzz.upstream._pool_facts`.

Speculative decoding's:

* ``table-covers`` (request, group, start, scheduled, lookahead): the
  positions the request's table in the group covers (its blocks times the
  group's block size) when its step computes ``scheduled`` tokens from
  ``start`` and the drafter writes ``lookahead`` positions past them;
* ``rolled-back`` (request, drafts, accepted): how far the
  ``update_from_output()`` that verified the request's drafts took its
  ``num_computed_tokens`` down (read before it: :data:`BEFORE_UPDATE`);
* ``recorded-token`` (request, position, step): the token vLLM records at
  the position (``all_token_ids``), whose KV the runner computed in the
  step from the token the fact expects.

What the scheduler told the connector (the file's recording one), in the
``schedule()`` that admitted the request:

* ``connector-asked`` (request, why): the ``num_computed_tokens`` that
  ``get_num_new_matched_tokens`` got;
* ``connector-told`` (request, why): the ``num_external_tokens`` that
  ``update_state_after_alloc`` got;
* ``connector-load-blocks`` (request, group, first, end, null block, what):
  the block ids ``update_state_after_alloc`` handed for the group at
  indices ``[first, end)``, the null block left out (``len``: one real
  block at each index);
* ``started-from`` (request): the ``num_computed_tokens`` the step's output
  gives the model runner for a request it schedules new or resumed.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable

from fuzz.model import Fact
from fuzz.upstream._file import Context, assert_lines, message_lines
from fuzz.upstream._pool_facts import POOL_PRELUDES, POOL_SUBJECTS, STORED_EVENTS

__all__ = ["BEFORE_UPDATE", "PRELUDES", "SUBJECTS", "Context", "fact_lines"]


def _cached_blocks(fact: Fact, ctx: Context) -> list[str] | None:
    rid, tokens, group, *why = fact.args
    k = ctx.key_index(tokens, group)
    if k is None:
        return None
    fact = dataclasses.replace(fact, expected=list(fact.expected))  # type: ignore[arg-type]
    blocks = ", ".join(map(str, fact.expected))  # type: ignore[call-overload]
    text = (f"the prefix cache dropped {rid}'s first {tokens} tokens (group {group}, block {blocks}): a free keeps "
            "a block's key; only reusing the block, evict_blocks or a reset drops it")
    if fact.relation == "!=":  # the block must not stand for the prefix: why not
        text = f"the prefix cache files block {blocks} under {rid}'s first {tokens} tokens (group {group}): {why[0]}"
    return [f"    cached = block_pool.get_cached_block({ctx.names[rid]}.block_hashes[{k}], [{group}])"] + assert_lines(
        "[block.block_id for block in cached or []]", fact, f"step {ctx.step}: {text}")


def _hit_tokens(fact: Fact, ctx: Context) -> list[str] | None:
    rid, *why = fact.args
    name = ctx.names[rid]
    allows = "holds at least" if fact.relation == ">=" else "allows exactly"
    text = f"the cache {allows} {fact.expected} of its prefix"
    if fact.relation == "<=":  # the first position it may not adopt, and why
        text = f"it may adopt at most {fact.expected}: {why[0]}"
    elif why:  # where it must start, and why
        text = f"it must start from {fact.expected}: {why[0]}"
    return assert_lines(f'{name}.num_computed_tokens - {ctx.output}.num_scheduled_tokens["{rid}"]', fact, (
        f"step {ctx.step}: {rid}'s prefix-cache lookup served {fact.observed} tokens; {text}"))


def _table_block(fact: Fact, ctx: Context) -> list[str] | None:
    rid, group, index, start, positions, *why = fact.args
    # A slice: where vLLM holds the request back, its table is shorter.
    held = dataclasses.replace(fact, expected=[fact.expected])
    return assert_lines(f'scheduler.kv_cache_manager.get_block_ids("{rid}")[{group}][{index}:{index + 1}]', held, (
        f"step {ctx.step}: {rid} computes from position {start} and reads positions {list(positions)} in block "
        f"{fact.observed} (group {group}), " + (why[0] if why else f"which no step filled with their KV under "
                                                                    f"{rid}'s prefix")))


def _places(fact: Fact, ctx: Context) -> list[str] | None:
    (rid,) = fact.args
    where = ", ".join(fact.observed) or "none"  # type: ignore[arg-type]
    return [
        "    places = [",
        "        name",
        '        for name, queue in (("running", scheduler.running), ("waiting", scheduler.waiting),',
        '                            ("kv_holding_waiting", scheduler.kv_holding_waiting))',
        f"        if {ctx.names[rid]} in queue",
        "    ]",
    ] + assert_lines(
        "places", fact, (f"after step {ctx.step}, {rid} (neither finished nor aborted) is in {where} of the "
                         "scheduler's places: it must be in exactly one"))


def _status(fact: Fact, ctx: Context) -> list[str] | None:
    rid, *why = fact.args
    expected = fact.expected if fact.relation == "in" else (fact.expected,)
    wanted = " or ".join(expected)  # type: ignore[arg-type]
    if fact.relation not in ("in", "=="):
        return None
    statuses = [f"RequestStatus.{s}" for s in expected]  # type: ignore[union-attr]
    test = (f"{ctx.names[rid]}.status in ({', '.join(statuses)})" if len(statuses) > 1
            else f"{ctx.names[rid]}.status == {statuses[0]}")
    text = (f"step {ctx.step}: {rid} is {fact.observed} after the step, though {why[0]}: it must be {wanted}"
            if why else _status_text(rid, ctx.step, fact.observed, wanted))
    return [f"    assert {test}, (", *message_lines(text), "    )"]


def _status_text(rid: str, step: int, observed: object, wanted: str) -> str:
    return (f"step {step}: schedule() left {rid} {observed} with nothing running, the pool free and its connector "
            f"answer decided: it must be {wanted}")


def _handed_blocks(fact: Fact, ctx: Context) -> list[str] | None:
    rid, group = fact.args
    return assert_lines(f'list(scheduler.connector.handed["{rid}"][{group}])', fact, (
        f"step {ctx.step}: request_finished_all_groups handed blocks {fact.observed} of {rid} (group {group}); "
        f"its table holds {fact.expected} for its computed tokens"))


def _encoder_freed(fact: Fact, ctx: Context) -> list[str] | None:
    mm_hash, rid, (offset, length) = fact.args
    if fact.expected is not False:
        return None
    return assert_lines(f'"{mm_hash}" not in {ctx.output}.free_encoder_mm_hashes', dataclasses.replace(fact, expected=True), (
        f"step {ctx.step}: schedule() tells the worker to free the encoder output of {mm_hash} while {rid} "
        f"still reads it (its placeholder [{offset}, {offset + length}))"))


def _encoder_scheduled(fact: Fact, ctx: Context) -> list[str] | None:
    rid, item = fact.args
    return assert_lines(f'{item} in {ctx.output}.scheduled_encoder_inputs.get("{rid}", [])', fact, (
        f"step {ctx.step}: {rid} computes inside its item {item}'s placeholder, whose encoder output the "
        "worker does not hold, and no encoder run is scheduled"))


_EVENT_FIELDS = ("token_ids", "lora_name", "lora_id", "medium")


def _stored_event(fact: Fact, ctx: Context) -> list[str] | None:
    rid, tokens, field = fact.args
    size = ctx.block_sizes[0] if len(set(ctx.block_sizes)) == 1 else None
    k = ctx.key_index(tokens, 0 if size else None)
    if k is None or size is None or field not in _EVENT_FIELDS:
        return None
    read = f"event.token_ids[i * {size}:(i + 1) * {size}]" if field == "token_ids" else f"event.{field}"
    expected = list(fact.expected) if field == "token_ids" else fact.expected  # type: ignore[call-overload]
    place = "i" if field == "token_ids" else "_"
    return [f"    event, {place} = announced[maybe_convert_block_hash({ctx.names[rid]}.block_hashes[{k}])]"] + assert_lines(
        read, dataclasses.replace(fact, expected=expected), (
            f"step {ctx.step}: BlockStored announces {rid}'s block over tokens [{tokens - size}, {tokens}) "
            f"with {field}={fact.observed!r}; the block holds {field}={expected!r}"))




def _same_key(fact: Fact, ctx: Context) -> list[str] | None:
    a, tokens_a, b, tokens_b = fact.args
    ka, kb = ctx.key_index(tokens_a), ctx.key_index(tokens_b)
    if ka is None or kb is None:
        return None
    if fact.expected is not False:
        return None
    distinct = dataclasses.replace(fact, expected=True)
    return assert_lines(f"{ctx.names[b]}.block_hashes[{kb}] != {ctx.names[a]}.block_hashes[{ka}]", distinct, (
        f"{b}'s first {tokens_b} tokens get the prefix-cache key of {a}'s first {tokens_a}, another prefix: "
        f"{b} would read {a}'s KV"))


# What a preempted request resumes from, as vLLM's objects show it.
_RESTART_FIELDS = {
    "status": "{name}.status.name",
    "num_computed_tokens": "{name}.num_computed_tokens",
    "num_output_placeholders": "{name}.num_output_placeholders",
    "spec_token_ids": "len({name}.spec_token_ids)",
    "blocks held": 'sum(map(len, scheduler.kv_cache_manager.get_block_ids("{rid}")))',
}


def _preempted_request(fact: Fact, ctx: Context) -> list[str] | None:
    rid, field = fact.args
    if field not in _RESTART_FIELDS:
        return None
    return assert_lines(_RESTART_FIELDS[field].format(name=ctx.names[rid], rid=rid), fact, (
        f"step {ctx.step}: schedule() preempted {rid} (freeing every block it held) and left its {field} at "
        f"{fact.observed}: a preempted request restarts from {fact.expected}"))


def _evicted_before(fact: Fact, ctx: Context) -> list[str] | None:
    rid_b, tokens_b, rid_c, tokens_c, group, block_b, block_c, why = fact.args
    kb, kc = ctx.key_index(tokens_b, group), ctx.key_index(tokens_c, group)
    if kb is None or kc is None or fact.expected is not True:
        return None
    return [f"    evicted = block_pool.get_cached_block({ctx.names[rid_b]}.block_hashes[{kb}], [{group}])",
            f"    ahead = block_pool.get_cached_block({ctx.names[rid_c]}.block_hashes[{kc}], [{group}])"] + assert_lines(
        "evicted or not ahead", fact, (
        f"step {ctx.step}: allocating evicted block {block_b} ({rid_b}'s first {tokens_b} tokens) while block "
        f"{block_c} ({rid_c}'s first {tokens_c} tokens) stays cached, though vLLM's free order reuses it first: "
        f"{why}"))


def _block_held(fact: Fact, ctx: Context) -> list[str] | None:
    block, rid, group, index, step, start = fact.args
    return assert_lines(f"scheduler.kv_cache_manager.block_pool.blocks[{block}].ref_cnt", fact, (
        f"step {ctx.step}: schedule() freed block {block} (index {index} of {rid}'s table, group {group}) while "
        f"step {step}, still in flight, computes {rid} from position {start} and reads it"))


def _scheduled(fact: Fact, ctx: Context) -> list[str] | None:
    rid, why = fact.args
    if fact.expected not in (True, False):
        return None
    test = f'"{rid}" {"in" if fact.expected else "not in"} {ctx.output}.num_scheduled_tokens'
    what = f"leaves {rid} unscheduled" if fact.expected else f"schedules {rid}"
    return assert_lines(test, dataclasses.replace(fact, expected=True), f"step {ctx.step}: schedule() {what}, though {why}")


def _connector_meta(fact: Fact, ctx: Context) -> list[str] | None:
    return assert_lines(f"{ctx.output}.kv_connector_metadata is not None", fact, (
        f"step {ctx.step}: schedule() returned without build_connector_meta: every schedule() with a connector "
        "builds its metadata once (an async load admitted in an empty step starts from it)"))


def _sync_loads_flag(fact: Fact, ctx: Context) -> list[str] | None:
    rid, tokens = fact.args
    return assert_lines(f"{ctx.output}.has_sync_kv_loads", fact, (
        f"step {ctx.step}: {rid} was told to load {tokens} external tokens synchronously in this step, but "
        "the output says has_sync_kv_loads=False"))


def _block_hash(fact: Fact, ctx: Context) -> list[str] | None:
    block, rid, how, policy = fact.args
    if fact.expected is not False:
        return None
    return assert_lines(f"scheduler.kv_cache_manager.block_pool.blocks[{block}].block_hash is None",
                   dataclasses.replace(fact, expected=True), (
        f"step {ctx.step}: block {block} still carries a prefix-cache hash after {rid}'s load into it failed "
        f"({how}, kv_load_failure_policy={policy!r}): another request can adopt its garbage as a hit"))


def _computed_tokens(fact: Fact, ctx: Context) -> list[str] | None:
    rid, why = fact.args
    return assert_lines(f"{ctx.names[rid]}.num_computed_tokens", fact, (
        f"step {ctx.step}: {rid} has num_computed_tokens={fact.observed} after the step, though {why}"))


def _finished_calls(fact: Fact, ctx: Context) -> list[str] | None:
    rid, method = fact.args
    return assert_lines(f'scheduler.connector.finished.count("{rid}")', fact, (
        f"step {ctx.step}: the connector heard {method}({rid}) {fact.observed} time(s): it must hear it exactly "
        f"once, when the request finishes"))


# Speculative decoding's subjects.
def _table_covers(fact: Fact, ctx: Context) -> list[str] | None:
    rid, group, start, scheduled, lookahead = fact.args
    if group >= len(ctx.block_sizes):
        return None
    size = ctx.block_sizes[group]
    return assert_lines(f'len(scheduler.kv_cache_manager.get_block_ids("{rid}")[{group}]) * {size}', fact, (
        f"step {ctx.step}: {rid} computes positions [{start}, {start + scheduled}) and its drafter writes "
        f"{lookahead} position(s) past them: group {group}'s table (blocks of {size}) covers {fact.observed} "
        f"positions, {fact.expected} needed"))


def _rolled_back(fact: Fact, ctx: Context) -> list[str] | None:
    rid, drafts, accepted = fact.args
    name = ctx.names[rid]
    return assert_lines(f"{name}_computed - {name}.num_computed_tokens", fact, (
        f"step {ctx.step}: update_from_output() verified {drafts} drafts of {rid} and the runner accepted "
        f"{accepted}: num_computed_tokens must go down by the {fact.expected} rejected; it went down by "
        f"{fact.observed}"))


def _recorded_token(fact: Fact, ctx: Context) -> list[str] | None:
    rid, position, written = fact.args
    return assert_lines(f"{ctx.names[rid]}.all_token_ids[{position}]", fact, (
        f"step {ctx.step}: the runner computed position {position} of {rid} (step {written}) from token "
        f"{fact.expected}, but vLLM records token {fact.observed} there: its next tokens are sampled from another "
        "sequence"))


# What the scheduler told the connector, and the model runner.
def _connector_asked(fact: Fact, ctx: Context) -> list[str] | None:
    rid, why = fact.args
    return assert_lines(f'scheduler.connector.asked["{rid}"]', fact, (
        f"step {ctx.step}: get_num_new_matched_tokens asked about {rid} from num_computed_tokens={fact.observed}, "
        f"though {why}: the connector's answer must start where the local part ends ({fact.expected})"))


def _connector_told(fact: Fact, ctx: Context) -> list[str] | None:
    rid, why = fact.args
    bound = "at most " if fact.relation == "<=" else ""
    return assert_lines(f'scheduler.connector.told["{rid}"]', fact, (
        f"step {ctx.step}: update_state_after_alloc told the connector to load {fact.observed} external "
        f"token{'s' * (fact.observed != 1)} "
        f"of {rid}, though {why}: it must load {bound}{fact.expected}"))


def _connector_load_blocks(fact: Fact, ctx: Context) -> list[str] | None:
    rid, group, first, end, null, what = fact.args
    handed = f'scheduler.connector.blocks["{rid}"][{group}][{first}:{end}]'
    return assert_lines(f"[block for block in {handed} if block != {null}]", fact, (
        f"step {ctx.step}: update_state_after_alloc handed {rid}'s load blocks {fact.observed} at indices "
        f"[{first}, {end}) of group {group}: it loads {what} and needs a real block (not the null block "
        f"{null}) at each of them"))


def _started_from(fact: Fact, ctx: Context) -> list[str] | None:
    (rid,) = fact.args
    return [f"    started = {{new.req_id: new.num_computed_tokens for new in {ctx.output}.scheduled_new_reqs}}",
            f"    cached = {ctx.output}.scheduled_cached_reqs",
            "    started.update(zip(cached.req_ids, cached.num_computed_tokens))"] + assert_lines(
        f'started["{rid}"]', fact, (
            f"step {ctx.step}: schedule() hands the model runner {rid} from num_computed_tokens={fact.observed}, "
            f"with num_tokens={fact.expected}: a request it schedules leaves at least one token to compute "
            "(the last one's logits sample its next token)"))
def _raises(fact: Fact, ctx: Context) -> list[str] | None:
    kind, requests = fact.args
    if fact.expected is not None or not isinstance(getattr(builtins, kind, None), type):
        return None  # only a builtin exception is caught by its name
    who = f" while admitting {', '.join(requests)}" if requests else ""
    detail = str(fact.observed).removeprefix(f"{kind}:").strip()
    return ["    try:", "        scheduler.schedule()", "        raised = None", f"    except {kind} as error:",
            "        raised = error"] + assert_lines("raised", fact, (
        f"step {ctx.step}: schedule() raised {kind}{f' ({detail})' if detail else ''}{who}: no exception may "
        "escape schedule() for a configuration vLLM accepted"))


SUBJECTS = {
    "cached-blocks": _cached_blocks,
    "hit-tokens": _hit_tokens,
    "places": _places,
    "status": _status,
    "handed-blocks": _handed_blocks,
    "encoder-freed": _encoder_freed,
    "encoder-scheduled": _encoder_scheduled,
    "stored-event": _stored_event,
    "same-key": _same_key,
    "table-block": _table_block,
    "preempted-request": _preempted_request,
    "evicted-before": _evicted_before,
    "block-held": _block_held,
    "scheduled": _scheduled,
    "block-hash": _block_hash,
    "computed-tokens": _computed_tokens,
    "finished-calls": _finished_calls,
    "connector-meta": _connector_meta,
    "sync-loads-flag": _sync_loads_flag,
    "raises": _raises,
    # Speculative decoding's.
    "table-covers": _table_covers,
    "rolled-back": _rolled_back,
    "recorded-token": _recorded_token,
    # What the scheduler told the connector, and the model runner.
    "connector-asked": _connector_asked,
    "connector-told": _connector_told,
    "connector-load-blocks": _connector_load_blocks,
    "started-from": _started_from,
}


def _computed_before_update(fact: Fact, ctx: Context) -> list[str]:
    name = ctx.names.get(fact.args[0])  # none: the fact itself is not stated
    return [f"    {name}_computed = {name}.num_computed_tokens  # the drafts included"] if name else []


# What a subject's fact due after an ``update_from_output()`` reads right
# before that call (the lines, given the fact and its context).
BEFORE_UPDATE: dict[str, Callable[[Fact, Context], list[str]]] = {
    "rolled-back": _computed_before_update,
}


# What a subject's facts read first, once per step where some are stated:
# (the lines, the imports they need as (module, name)).
PRELUDES: dict[str, tuple[list[str], tuple[tuple[str, str], ...]]] = {
    "cached-blocks": (["    block_pool = scheduler.kv_cache_manager.block_pool"], ()),
    "evicted-before": (["    block_pool = scheduler.kv_cache_manager.block_pool"], ()),
    "status": ([], (("vllm.v1.request", "RequestStatus"),)),
    "stored-event": STORED_EVENTS,
}


# Block ownership, KV events, stale outputs and leaks (their own module).
SUBJECTS.update(POOL_SUBJECTS)
PRELUDES.update(POOL_PRELUDES)


def fact_lines(fact: Fact, ctx: Context) -> list[str] | None:
    """The statements asserting ``fact`` in the test (None: the vocabulary
    cannot state it there)."""
    render = SUBJECTS.get(fact.subject)
    try:
        return None if render is None else render(fact, ctx)
    except KeyError:  # a request the shrunk run no longer has
        return None
