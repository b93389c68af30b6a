"""Shrinking a scheduler run's operation log by replay, before a repro is written.

A failing run's log (:class:`fuzz.model.OpLog`) holds everything the run did;
most of it the failure does not need. :func:`shrink_oplog` drops KV-cache
groups, requests (with their twins, fills and probes), steps and the KV
connector one at a time, replaying each candidate through a fresh harness with
the suite's checks on, and keeps a candidate when the same invariant still
breaks.
:mod:`fuzz.upstream` writes the repro file from what is left; the
campaign's sidecar keeps it, and ``python -m fuzz replay`` replays it with
:func:`first_violation`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from fuzz import adapter
from fuzz.model import (
    Abort,
    AddRequest,
    Evict,
    InvariantViolation,
    OpLog,
    OpVisitor,
    ResetPrefixCache,
    Step,
)

__all__ = ["first_violation", "replay_violation", "shrink_oplog"]


def _replay_checked(log: OpLog, invariant: str, checks: tuple[Callable[..., None], ...] | None = None) -> OpLog | None:
    """Run ``log``'s operations through a fresh harness with ``checks`` on
    (default: the checks of the rows marked ``repro`` in
    :data:`invariants.table.INVARIANTS`, the set the replay has always
    shrunk with); the new log (up to the step that broke) when
    ``invariant`` still breaks."""
    violation = replay_violation(log, invariant, checks)
    return None if violation is None else violation.oplog  # type: ignore[return-value]


def replay_violation(
    log: OpLog, invariant: str, checks: tuple[Callable[..., None], ...] | None = None
) -> InvariantViolation | None:
    """:func:`_replay_checked`'s replay: the violation of ``invariant`` it
    raised, carrying the new log as its ``oplog`` (None: it did not break)."""
    try:
        harness = adapter.SchedulerHarness(log.config.draw)
    except adapter.InvalidLayout:
        return None
    try:
        violation = _play(harness, log, checks)
    except Exception:  # noqa: BLE001 - another failure: not this one
        return None
    return violation if violation is not None and violation.invariant == invariant else None


def first_violation(log: OpLog, checks: tuple[Callable[..., None], ...] | None = None) -> InvariantViolation | None:
    """Replay ``log`` through a fresh harness with ``checks`` on (default as
    :func:`replay_violation`'s; known vLLM bugs set aside, as in a campaign):
    the first violation of any claim, carrying the new log as its ``oplog``;
    None when the run ends clean. Anything else raises (``InvalidLayout``:
    this vLLM cannot build the log's layout)."""
    return _play(adapter.SchedulerHarness(log.config.draw), log, checks)


def _play(harness: adapter.SchedulerHarness, log: OpLog,
          checks: tuple[Callable[..., None], ...] | None) -> InvariantViolation | None:
    from fuzz.runners.scheduler import ALL_CHECKS, Stepper, checks_for
    from invariants.scheduler import check_no_leaked_blocks
    from invariants.table import INVARIANTS

    if checks is None:
        unstated = {row.check for row in INVARIANTS if row.tier == "scheduler" and not row.repro}
        checks = tuple(c for c in ALL_CHECKS if c not in unstated)
    run = Stepper(harness, checks_for(log.config.draw, checks))
    # The steps whose own schedule() admitted the synchronous loads a fed
    # output reports invalid (with async scheduling, fed one step late).
    sync_failing = {op.fed_step or op.index for op in log.steps if op.fed and op.fed.invalid_block_ids}
    player = _Player(harness, run, sync_failing)
    try:
        for op in log.ops:
            if not player.visit(op):
                break
        run.drain()
        if not harness.broken and check_no_leaked_blocks in checks:
            check_no_leaked_blocks(harness.pool_observation())
    except InvariantViolation as exc:
        exc.oplog = harness.oplog
        return exc
    return None


class _Player(OpVisitor[bool]):
    """Each operation done again through a harness, its steps checked;
    False: the harness broke, the replay stops."""

    def __init__(self, harness: adapter.SchedulerHarness, run: Any, sync_failing: set[int]) -> None:
        self.harness, self.run, self.sync_failing = harness, run, sync_failing

    def on_add_request(self, op: AddRequest) -> bool:
        self.harness.add_request(
            op.token_ids, max_tokens=op.max_tokens, reply=op.reply, request_id=op.request_id,
            skip_reading_prefix_cache=op.skip_reading_prefix_cache, cache_salt=op.cache_salt,
            lora=op.lora, embeds=op.embeds, mm=op.mm)
        return True

    def on_abort(self, op: Abort) -> bool:
        if op.during_step or op.request_id in self.harness.live_request_ids:
            self.harness.abort(op.request_id, during_step=op.during_step)
        return True

    def on_evict(self, op: Evict) -> bool:
        self.harness.evict_shortcut(set(op.block_ids))
        return True

    def on_reset_prefix_cache(self, op: ResetPrefixCache) -> bool:
        self.harness.reset_prefix_cache(reset_running=op.reset_running)
        return True

    def on_step(self, op: Step) -> bool:
        harness = self.harness
        if harness.broken:
            return False
        for rid in op.fed.failed_recving if op.fed else ():
            harness.fail_async_load(rid)
        if op.index in self.sync_failing and harness.can_report_invalid_blocks:
            harness.fail_next_sync_loads()
        self.run.step()
        return True


def _without_request(log: OpLog, request_id: str) -> OpLog:
    ops = [op for op in log.ops if getattr(op, "request_id", None) != request_id]
    return OpLog(log.config, ops)


def _without_step(log: OpLog, index: int) -> OpLog:
    return OpLog(log.config, [op for op in log.ops if not (isinstance(op, Step) and op.index == index)])


def _without_connector(log: OpLog) -> OpLog:
    """``log`` on a scheduler built without a KV connector (so nothing
    claims divergent hybrid hits, and there is no role), its requests with
    no external store."""
    draw = dataclasses.replace(log.config.draw, connector=False, divergent_hits=False, kv_role="kv_both")
    config = dataclasses.replace(log.config, draw=draw)
    ops = [dataclasses.replace(op, reply=None) if isinstance(op, AddRequest) else op for op in log.ops]
    return OpLog(config, ops)


def _decided(log: OpLog, request_id: str) -> OpLog:
    """``log`` whose connector answers ``request_id`` at once: its store's
    answer without the 'not yet' answers before it (a plant may change what
    the scheduler does with those, and so the steps before the failure)."""
    ops = [dataclasses.replace(op, reply=dataclasses.replace(op.reply, kind="store", undecided=0))
           if isinstance(op, AddRequest) and op.request_id == request_id and op.reply is not None else op
           for op in log.ops]
    return OpLog(log.config, ops)


def _may_drop_connector(log: OpLog, invariant: str) -> bool:
    """Whether a replay without the connector can show ``invariant``'s
    failure: not a claim about the connector itself (with none, its records
    are empty and its checks would judge that), and no load the run fails
    on purpose (those are the connector's), and prefix caching on (with
    neither, the engine hashes no block: :class:`fuzz.model.SchedulerDraw`)."""
    from invariants.table import INVARIANTS

    about_connector = any(row.name == invariant and row.check.__module__ == "invariants.connector"
                          for row in INVARIANTS)
    failing = any(op.fed is not None and (op.fed.failed_recving or op.fed.invalid_block_ids) for op in log.steps)
    draw = log.config.draw
    return draw.connector and draw.prefix_caching and not about_connector and not failing


def _without_group(log: OpLog, index: int) -> OpLog:
    draw = log.config.draw
    groups = draw.layout.groups[:index] + draw.layout.groups[index + 1 :]
    layout = dataclasses.replace(draw.layout, groups=groups)
    config = dataclasses.replace(log.config, draw=dataclasses.replace(draw, layout=layout))
    return OpLog(config, list(log.ops))


def shrink_oplog(
    log: OpLog, invariant: str, *, budget: int = 60, checks: tuple[Callable[..., None], ...] | None = None
) -> OpLog:
    """Drop the KV-cache groups, then the requests, the connector's 'not
    yet' answers (each request's once), the prefix-cache resets, then the
    steps, then the KV connector that ``invariant``'s failure does
    not need (greedy, one at a time, each candidate replayed with every
    check; after each drop the passes start over; the connector is tried
    once before the requests too), and cut the log at the step that breaks.
    At most ``budget`` replays, each with ``checks`` (default: all)."""
    current = _replay_checked(log, invariant, checks)
    if current is None:
        return log  # not reproducible by replay: keep what was recorded
    tries = 1
    changed = True
    needed_connector: frozenset[str] | None = None  # the requests of the last replay that needed the connector

    def without_connector() -> OpLog | None:
        """``current`` replayed without the connector, where it may go and
        its requests did not need it last time; None if it stays."""
        nonlocal tries, needed_connector
        requests = frozenset(r.request_id for r in current.requests)
        if requests == needed_connector or tries >= budget or not _may_drop_connector(current, invariant):
            return None
        tries += 1
        smaller = _replay_checked(_without_connector(current), invariant, checks)
        if smaller is None:
            needed_connector = requests
        return smaller

    def first_smaller(candidates: Iterator[OpLog], shorter: bool = False) -> OpLog | None:
        """The first candidate whose replay still breaks ``invariant``
        (``shorter``: in fewer steps), each replay counted against the budget."""
        nonlocal tries
        for candidate in candidates:
            if tries >= budget:
                return None
            tries += 1
            smaller = _replay_checked(candidate, invariant, checks)
            if smaller is not None and (not shorter or len(smaller.steps) < len(current.steps)):
                return smaller
        return None

    def request_drops(log: OpLog) -> Iterator[OpLog]:
        return (_without_request(log, r.request_id) for r in list(log.requests))

    def decided_answers(log: OpLog) -> Iterator[OpLog]:
        for rid in [r.request_id for r in log.requests if r.reply is not None and r.reply.kind == "undecided"
                    and r.request_id not in undecided_kept]:
            undecided_kept.add(rid)  # tried once: a request whose answer must wait keeps it
            yield _decided(log, rid)

    def reset_drops(log: OpLog) -> Iterator[OpLog]:
        return (OpLog(log.config, [op for op in log.ops if op is not reset])
                for reset in [op for op in log.ops if isinstance(op, ResetPrefixCache)])

    early = True
    undecided_kept: set[str] = set()
    while changed and tries < budget:
        # An engine-planned configuration keeps its groups: the engine decides them.
        groups = len(current.config.draw.layout.groups) if current.config.draw.engine is None else 0
        smaller = first_smaller(_without_group(current, i) for i in range(groups if groups > 1 else 0))
        if smaller is None and early:  # once before the request pass too: a program without it replays faster
            early = False
            smaller = without_connector()
        for drops in (request_drops, decided_answers, reset_drops):
            if smaller is not None:
                break
            smaller = first_smaller(drops(current))
        if smaller is None:
            smaller = first_smaller((_without_step(current, step.index) for step in reversed(current.steps[:-1])),
                                    shorter=True)
        if smaller is not None:
            current, changed = smaller, True
            continue
        changed = False
        # Once nothing else goes: the connector (tried again once requests
        # are gone, they may be what needed it).
        smaller = without_connector()
        if smaller is not None:
            current, changed = smaller, True
    return current
