"""Property targets for ``Scheduler.schedule()``'s external-hit branch.

A real vLLM ``Scheduler`` (built through :mod:`fuzz.adapter`) with the
scripted KV connector. Blocks leave the cache only through real paths (LRU
pressure on a small pool, request churn, preemption) unless a target says it
uses the evict shortcut.

* ``fuzz_scheduler_single_shot``: fill, replay, check every step (the core
  full attention + Mamba layout; its reach is asserted in
  tests/strategies/test_scheduler_reach.py).
* ``fuzz_scheduler_single_shot_any_layout``: the same with other groups
  beside full attention + Mamba, and over any 1-4 group layout.
* ``fuzz_scheduler_engine_reachable``: the same single-shot scenarios over
  KV-cache configs vLLM's own engine planning builds from real model
  configurations (:mod:`strategies.engine_models`); findings here are
  labelled engine-reachable, the layout-drawn targets' scheduler-API.
* ``fuzz_scheduler_evict_shortcut``: also evicts hand-picked blocks per group
  before the replay. A search aid only: a failure here must be re-derived
  through a real path before it is reported as a vLLM bug, so it runs only
  when ``FUZZ_SHORTCUT=1``.
* ``TestSchedulerMachine``: a rule-based state machine over one scheduler
  (requests sharing prefixes, steps, aborts, failed loads, prefix-cache
  resets), every invariant checked after every step and the pool whenever
  idle. Rare states are built, not waited for: failing-load runs, a finished
  turn extended past its sub-block tail (``next_turn``), requests decoding
  with drafts outgrowing the pool (``press_with_drafts``), an image sent
  again while another needs the encoder cache (``share_image``, in
  ``_machine_images.py``). docs/targets.md has the rules.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import pytest
from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from fuzz.adapter import missing_capabilities
from fuzz.registry import SCHEDULER_TIER
from fuzz.targets._machine_images import ImageRules
from fuzz.model import ExternalReply, SchedulerDraw, SingleShotScenario
from fuzz.runners.scheduler import ALL_CHECKS, Stepper, build_harness, carrying_oplog, checks_for, run_single_shot
from invariants.scheduler import check_no_leaked_blocks
from strategies.engine_models import engine_single_shot_scenarios
from strategies.machine import (
    adapter_of, drafting_pressures, failing_load_configs, generation_lengths, image_lengths, images, machine_configs,
    namespaces, prefix_image, pressure_lengths,
)
from strategies.scheduler import external_replies, prefix_cache_skips, scheduler_draws, scheduler_layouts
from strategies.single_shot import PREEMPTED_THEN_RESUMED, single_shot_scenarios

SHORTCUT = os.environ.get("FUZZ_SHORTCUT") == "1"

# What the scheduler tier needs from vLLM (fuzz.registry declares it per target).
UNSUPPORTED = "; ".join(missing_capabilities(SCHEDULER_TIER)) or None
pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


# Zero-argument factories and the check, for fuzz.registry (python -m fuzz).
# The truncation branch (tail) first; the twins and load flavours build the
# states of the open 0.33.0 bugs (same-step copy-on-write chain, Mamba
# external-block undercount) by construction (docs/bugbench.md).
SINGLE_SHOT_FLAVOURS = {"tail": 3, "inside": 1, "twins": 1, "load": 1}
ANY_LAYOUT_FLAVOURS = {"tail": 1, "inside": 1, "free": 1, "twins": 1, "load": 1}


def single_shot_strategy():  # type: ignore[no-untyped-def]
    return single_shot_scenarios(shortcut=False, allow_over=False, flavours=SINGLE_SHOT_FLAVOURS)


def any_layout_strategy():  # type: ignore[no-untyped-def]
    return single_shot_scenarios(
        configs=scheduler_draws(layouts=scheduler_layouts(weights=(0, 1, 1, 0, 0, 0))),
        shortcut=False,
        flavours=ANY_LAYOUT_FLAVOURS,
    )


def engine_reachable_strategy():  # type: ignore[no-untyped-def]
    return engine_single_shot_scenarios()


def check_single_shot(scenario: SingleShotScenario) -> None:
    """Run the scenario; raises InvariantViolation on a violated invariant."""
    run_single_shot(scenario)


@example(scenario=PREEMPTED_THEN_RESUMED)
@given(scenario=single_shot_strategy())
def fuzz_scheduler_single_shot(scenario: SingleShotScenario) -> None:
    """The core hybrid layout (full attention + Mamba), real paths only,
    honest connector answers (over-reports end a scenario early; the
    any-layout target draws them)."""
    run_single_shot(scenario)


@given(scenario=any_layout_strategy())
def fuzz_scheduler_single_shot_any_layout(scenario: SingleShotScenario) -> None:
    """Full attention + Mamba + other groups (sliding window, chunked local,
    MLA, scratch, ...), and any 1-4 group layout of every drawable spec
    kind; real paths only, over-reports included."""
    run_single_shot(scenario)


@pytest.mark.skipif(
    bool(missing_capabilities(("engine-planning",))), reason="; ".join(missing_capabilities(("engine-planning",)))
)
@given(scenario=engine_reachable_strategy())
def fuzz_scheduler_engine_reachable(scenario: SingleShotScenario) -> None:
    """Configurations a real engine builds: a model config.json and cache
    flags, planned into the scheduler's KV-cache config by vLLM's own code;
    real paths only, over-reports included."""
    note(f"reach: {scenario.config.reach[0]} ({scenario.config.reach[1]})")
    run_single_shot(scenario)


@pytest.mark.skipif(not SHORTCUT, reason="search aid; set FUZZ_SHORTCUT=1 (failures need a real-path repro)")
@given(scenario=single_shot_scenarios(shortcut=True))
def fuzz_scheduler_evict_shortcut(scenario: SingleShotScenario) -> None:
    """As the single-shot target, plus hand-picked evictions before the replay."""
    if scenario.uses_shortcut:
        note("reached through the evict shortcut: re-derive through a real path before reporting")
    run_single_shot(scenario)


# One state-machine run in five is a failing-load run (SchedulerMachine.build):
# the block-level load failures live on one-group layouts only, rare in the
# general mix (the failed-load known bugs needed 15-56 s there, docs/bugbench.md).
# Drawn inside the range (Hypothesis favours its ends); shrinks to a general run.
FAILING_LOAD_RUNS = st.integers(0, 4).map(lambda k: k == 2)

# The labels of a run whose next_turn aborted its first turn in flight and
# pressed the pool, and of one whose pressure evicted some, not all, of that
# turn's cached blocks.
PRESSED = "turn aborted in flight, pool pressed"
PARTLY_EVICTED = "pool pressure evicted part of a turn"
# The labels of a run whose press_with_drafts rule added its requests, and of
# one where vLLM preempted a request holding drafts (any rule's step).
DRAFTS_PRESSED = "decoding requests with drafts pressed the pool"
DRAFTS_PREEMPTED = "request holding drafts preempted"
# The labels of a run that reset the prefix cache (a reset that succeeded),
# and of one whose reset preempted the running requests first.
CACHE_RESET = "prefix cache reset"
RUNNING_RESET = "prefix cache reset with running requests preempted"
# The label of a run where a request carrying an image adopted cached KV
# past its first image's placeholder start (the hit the images' keys guard).
IMAGE_HIT = "hit past an image's placeholder start"
# The label of a run of an engine started with prefix caching off.
NO_PREFIX_CACHING = "prefix caching off"

# Per state-machine run: how many runs reached each branch label ("runs" = total).
MACHINE_REACH: Counter[str] = Counter()

# The checks every machine step runs (and whether the idle leak check runs).
_machine_checks: tuple[Callable[..., None], ...] = ALL_CHECKS


@contextlib.contextmanager
def checks_for_machine(checks: tuple[Callable[..., None], ...]) -> Iterator[None]:
    """Run the state machine with only ``checks``: one claim at a time, so a
    planted bug that breaks several cannot hide behind another (self-tests)."""
    global _machine_checks
    saved, _machine_checks = _machine_checks, tuple(checks)
    try:
        yield
    finally:
        _machine_checks = saved


class SchedulerMachine(ImageRules, RuleBasedStateMachine):
    """Requests sharing prefixes come and go on one real scheduler.

    Prefixes live in a Bundle, so later requests really hit what earlier ones
    cached; chunked prefill makes requests re-enter ``schedule()`` across
    steps; a small pool makes LRU eviction and preemption happen.
    """

    prefixes = Bundle("prefixes")

    draws_images = True  # requests carry images (a one-rule measurement may not)

    def __init__(self) -> None:
        super().__init__()
        self.stepper: Stepper | None = None  # None: vLLM refused the config
        self.salt = 0
        self.labels: set[str] = set()  # branch labels reached in this run
        self.first_image: dict[str, int] = {}  # request id -> its first image's placeholder offset
        self.drafts_preempted = 0  # preemptions of a request holding drafts

    # -- set-up ---------------------------------------------------------------
    @initialize(target=prefixes, failing_load=FAILING_LOAD_RUNS, data=st.data())
    def build(self, failing_load: bool, data: st.DataObject) -> tuple[int, ...]:
        """The scheduler, a first prefix, and a first request on it: every
        run starts with something to schedule (rules are chosen at random
        and swarm testing switches some off for a whole run, so left to
        themselves most runs added no request at all). A failing-load run
        (:meth:`add_failing_load`) starts on one KV-cache group with a first
        request whose synchronous load is armed to fail. A run speculating
        where vLLM may preempt a decoding request (one general configuration
        in eight) then presses the pool with requests decoding with drafts
        (:meth:`press_with_drafts`): the rule alone is drawn too rarely."""
        config = data.draw(self.config_draws(failing_load), label="config")
        note(f"config: {config!r}")
        harness = build_harness(config)
        self.stepper = None if harness is None else Stepper(harness, checks_for(config, _machine_checks))
        if not config.prefix_caching:
            self.labels.add(NO_PREFIX_CACHING)
        self.block, self.unit = config.layout.scheduler_block_size, config.layout.hash_block_size
        self.image_len = data.draw(image_lengths(self.block, config.max_num_batched_tokens), label="image tokens")
        # A failing load spans at least two blocks before the token left to
        # compute (a one-block load has only the load's start to resume at).
        prefix = self.new_prefix(
            data.draw(st.integers(3, 6) if failing_load else st.integers(1, 5), label="first prefix blocks"),
            data.draw(st.integers(0, 7), label="first prefix extra"),
            data.draw(st.integers(0, 99), label="first prefix seed"),
        )
        if self.stepper is not None:
            if failing_load:
                self.add_failing_load(prefix, config, data)
            else:
                self.add_request(prefix, data)
            if not failing_load and self._live() and self._preemptible_with_drafts():
                self.press_with_drafts(data)
        return prefix

    def config_draws(self, failing_load: bool) -> st.SearchStrategy[SchedulerDraw]:
        return failing_load_configs() if failing_load else machine_configs()

    def add_failing_load(self, prefix: tuple[int, ...], config: SchedulerDraw, data: st.DataObject) -> None:
        """The first request of a failing-load run: the store holds its
        prompt (mostly all of it), loaded synchronously, and the connector
        reports that load failed block by block (``fail_next_sync_loads``).
        Under "fail" three runs in four also abort the request while the
        model runs that step (the engine applies it right before
        ``update_from_output``); under "recompute" one in four does, so the
        request mostly lives to recompute the failed blocks."""
        assert self.harness is not None
        prefix = self._fit(prefix)
        n = len(prefix)
        whole = data.draw(st.sampled_from((True, False, True, True)), label="store holds the whole prompt")
        store_len = n if whole else data.draw(st.integers(min(n, 2 * self.block + 1), n), label="store holds")
        reply = ExternalReply("store", store_len=store_len)
        max_tokens = data.draw(st.integers(1, 4), label="max_tokens")
        rid = self.harness.add_request(prefix, max_tokens=max_tokens, reply=reply)
        note(f"add_request({rid}, shared[:{n}], max_tokens={max_tokens}, ext={reply!r})")
        note("fail_next_sync_loads()")
        self.harness.fail_next_sync_loads()
        aborts = (True, False, True, True) if config.kv_load_failure_policy == "fail" else (False, True, False, False)
        if data.draw(st.sampled_from(aborts), label="abort during the load's step"):
            note(f"abort({rid}, during_step=True) while {self.harness.status_of(rid)}")
            self.harness.abort(rid, during_step=True)

    @property
    def harness(self):  # type: ignore[no-untyped-def]
        return None if self.stepper is None else self.stepper.harness

    def _fit(self, tokens: Sequence[int]) -> tuple[int, ...]:
        """``tokens`` trimmed to leave room for an output token within the
        run's max_model_len (the engine refuses a longer prompt; a client
        trims its conversation to the context)."""
        assert self.harness is not None
        room = self.harness.max_model_len - 1
        if len(tokens) > room:
            note(f"prompt of {len(tokens)} tokens trimmed to {room} (max_model_len={room + 1})")
        return tuple(tokens[:room])

    def _live(self) -> bool:
        # Not after a violation: teardown would step on and could raise a
        # later, different violation in place of the first one.
        return self.stepper is not None and not self.stepper.harness.broken and not self.stepper.failed

    # -- prefixes -------------------------------------------------------------
    @precondition(lambda self: self._live())
    @rule(target=prefixes, blocks=st.integers(1, 5), extra=st.integers(0, 7), seed=st.integers(0, 99))
    def new_prefix(self, blocks: int, extra: int, seed: int) -> tuple[int, ...]:
        length = blocks * self.block + extra % self.block
        return tuple((seed * 131 + 7 * i) % 1_000 for i in range(length))

    @precondition(lambda self: self._live())
    @rule(target=prefixes, base=prefixes, blocks=st.integers(0, 2), extra=st.integers(1, 7), seed=st.integers(0, 99))
    def extend_prefix(self, base: tuple[int, ...], blocks: int, extra: int, seed: int) -> tuple[int, ...]:
        more = blocks * self.block + extra % self.block + 1
        return base + tuple(1_000 + (seed * 17 + i) % 900 for i in range(more))

    # -- requests -------------------------------------------------------------
    @precondition(lambda self: self._live())
    @rule(prefix=prefixes, data=st.data())
    def add_request(self, prefix: tuple[int, ...], data: st.DataObject) -> None:
        assert self.harness is not None
        # One request in eight resends the prefix whole (a client sending a prompt again).
        whole = data.draw(st.integers(0, 7), label="resend the prefix whole") == 0
        shares = st.integers(max(1, len(prefix) // 2), len(prefix))
        cut = len(prefix) if whole else data.draw(shares, label="shared tokens")
        own = 0 if whole else data.draw(st.integers(0, 2 * self.block), label="own tokens")
        self.salt += 1
        tokens = self._fit(list(prefix[:cut]) + [3_000 + 64 * (self.salt % 60) + j for j in range(own)])
        # Half the requests mostly miss the external store (their local hits stay), half mostly
        # hit it (a sub-block local tail then meets a longer external hit: the truncation branch).
        misses = data.draw(st.booleans(), label="store mostly misses")
        # A producer (P/D prefill) never loads: its connector finds nothing (NIXL's, LMCache's).
        reply = ExternalReply() if self.harness.draw.kv_role == "kv_producer" else data.draw(
            external_replies(len(tokens), allow_over=False, often_zero=misses, saved=True), label="reply"
        )
        max_tokens = data.draw(generation_lengths(self.block), label="max_tokens")
        # One request in eight skips the prefix cache its predecessors filled.
        skip = data.draw(prefix_cache_skips(), label="skip_reading_prefix_cache")
        salt, lora, embeds = data.draw(namespaces(), label="cache_salt, lora, prompt embeddings")
        lora = adapter_of(lora, max_tokens)
        image = prefix_image(prefix, self.block)
        anchored = image if image is not None and image + self.image_len <= cut else None
        mm = () if embeds or not self.draws_images else data.draw(
            images(len(tokens), self.block, anchored, length=self.image_len), label="images")
        rid = self.harness.add_request(tokens, max_tokens=max_tokens, reply=reply, skip_reading_prefix_cache=skip,
                                       cache_salt=salt, lora=lora, embeds=embeds, mm=mm)
        if mm:
            self.first_image[rid] = mm[0][1]
        note(
            f"add_request({rid}, shared[:{cut}] + {own} own, max_tokens={max_tokens}, ext={reply!r}"
            + (", skip_reading_prefix_cache=True" if skip else "")
            + (f", cache_salt={salt!r}" if salt else "")
            + (f", lora={lora!r}" if lora else "")
            + (f", embeds={embeds!r}" if embeds else "")
            + (f", mm={mm!r}" if mm else "")
            + ")"
        )

    @precondition(lambda self: self._live())
    @rule(prefix=prefixes, data=st.data())
    def next_turn(self, prefix: tuple[int, ...], data: st.DataObject) -> None:
        """Two turns of a conversation: a turn on ``prefix`` that ends inside
        a block, past a hash unit (vLLM registers a sub-block tail entry
        there), computed locally and run to completion with everything
        else; then the next turn, 1 to a block's worth of tokens longer,
        finding the store holding all of it (mostly loaded synchronously;
        a producer's store holds nothing).
        Its local hit then ends at the sub-block tail and the external hit
        goes past it: the truncation branch, by construction, on layouts
        with a hash unit finer than the block (Mamba hybrids)."""
        assert self.harness is not None
        block, unit = self.block, self.unit
        whole = max(1, min(len(prefix) // block, data.draw(st.integers(1, 5), label="turn blocks")))
        rem = data.draw(st.integers(unit + 1, block - 1), label="turn remainder") if unit + 1 < block else 0
        self.salt += 1
        length = whole * block + rem
        own = [3_000 + 64 * (self.salt % 60) + j for j in range(max(0, length - len(prefix)))]
        first = list(self._fit(list(prefix[:length]) + own))
        turn = self.harness.add_request(first, max_tokens=data.draw(st.integers(1, 3), label="turn max_tokens"))
        note(f"add_request({turn}, shared[:{min(length, len(prefix))}] + {len(own)} own) then run_until_idle()")
        # Under async scheduling half the turns are aborted by their client
        # while the step computing their last prompt tokens runs, then a
        # request on tokens nobody shares presses the idle pool into evicting
        # part of the turn (drawn inside the range; shrinks to a finished
        # turn).
        pressed = self.harness.draw.async_scheduling and (
            data.draw(st.integers(0, 3), label="turn aborted in flight, then pool pressure") in (1, 2)
        )
        if pressed:
            self.labels.add(PRESSED)
            event(PRESSED)
            self._abort_when_computed(turn, len(first))
        self.run_until_idle()
        if pressed and self._live():
            self._press_pool(first, data)
        if not self._live():
            return
        more = data.draw(st.integers(1, block), label="next turn extra")
        tokens = self._fit(first + [4_000 + 64 * (self.salt % 60) + j for j in range(more)])
        load_async = data.draw(st.integers(0, 7), label="next turn async load") in (2, 5)
        # A producer (a P/D prefill instance) never loads: its next turn
        # finds its own cache only.
        producer = self.harness.draw.kv_role == "kv_producer"
        reply = ExternalReply() if producer else ExternalReply("store", store_len=len(tokens), load_async=load_async)
        max_tokens = data.draw(st.integers(1, 4), label="next turn max_tokens")
        rid = self.harness.add_request(tokens, max_tokens=max_tokens, reply=reply)
        note(f"add_request({rid}, {turn}'s tokens + {more}, max_tokens={max_tokens}, ext={reply!r})")

    def _abort_when_computed(self, rid: str, num_tokens: int) -> None:
        """Step until ``rid``'s whole prompt is scheduled, then abort it
        while that step is in flight. vLLM defers the frees of an in-flight
        step and returns them last group first, tail block first: pressure
        then evicts the turn's later groups before its first."""
        assert self.harness is not None
        for _ in range(64):
            computed = self.harness.num_computed_tokens(rid)
            if not self._live() or computed is None or computed >= num_tokens:
                break
            self.step(1)
        if self._live() and self.harness.status_of(rid) is not None:
            note(f"abort({rid}, during_step=True) once its prompt is scheduled")
            self.harness.abort(rid, during_step=True)

    def _press_pool(self, tokens: list[int], data: st.DataObject) -> None:
        """A request on tokens nobody shares, sized to evict 1 to all of the
        cached blocks of ``tokens`` (those in front of them in the pool's
        eviction order go first), run to idle."""
        assert self.harness is not None
        free = self.harness.pool_observation().num_free
        before = sum(map(len, self.harness.per_group_cached_block_ids(tokens)))
        # Some of them may still be held (a request the run left waiting, a
        # producer's unsent blocks): count only what the pool could evict.
        cached = min(free, before)
        if not cached:
            return
        ahead = free - cached
        n = data.draw(pressure_lengths(self.harness.draw.layout, ahead, cached), label="pressure tokens")
        self.salt += 1
        rid = self.harness.add_request(self._fit([6_000 + 64 * (self.salt % 60) + j for j in range(n)]), max_tokens=1)
        note(f"add_request({rid}, {n} own tokens: pool pressure) then run_until_idle()")
        self.run_until_idle()
        if not self._live():
            return
        if 0 < sum(map(len, self.harness.per_group_cached_block_ids(tokens))) < before:
            self.labels.add(PARTLY_EVICTED)
            event(PARTLY_EVICTED)

    def _preemptible_with_drafts(self) -> bool:
        """Speculating, with room for two requests, and vLLM may preempt a
        decoding one: synchronous scheduling (async scheduling defers the
        frees of a request whose step is in flight, as a decoding request's
        always is; a producer's defers none)."""
        draw = None if self.harness is None else self.harness.draw
        return draw is not None and draw.speculative_method is not None and draw.max_num_seqs >= 2 and (
            not draw.async_scheduling or draw.kv_role == "kv_producer")

    @precondition(lambda self: self._live() and DRAFTS_PRESSED not in self.labels and self._preemptible_with_drafts())
    @rule(data=st.data())
    def press_with_drafts(self, data: st.DataObject) -> None:
        """Once idle, 2-4 requests on tokens nobody shares, prefilled in one
        step, decode with drafts until their tables outgrow the pool
        (:func:`strategies.machine.drafting_pressures` sizes them from its
        free blocks): stepped until vLLM preempts one holding drafts, then
        the others aborted (the preempted one resumes). Once a run: it
        costs a pool's worth of decode steps."""
        assert self.harness is not None
        self.run_until_idle()
        if not self._live() or not self.harness.is_idle():
            return
        free = self.harness.pool_observation().num_free
        n, prompt, max_tokens = data.draw(drafting_pressures(
            self.harness.draw.layout, free, self.harness.draw, self.harness.max_model_len), label="drafting pressure")
        self.labels.add(DRAFTS_PRESSED)
        event(DRAFTS_PRESSED)
        rids = []
        for _ in range(n):
            self.salt += 1
            tokens = self._fit([7_000 + 64 * (self.salt % 60) + j for j in range(prompt)])
            rids.append(self.harness.add_request(tokens, max_tokens=max_tokens))
        note(f"add_request({', '.join(rids)}: {prompt} own tokens each, max_tokens={max_tokens}) "
             f"on {free} free blocks, then step until one holding drafts is preempted")
        before = self.drafts_preempted
        for _ in range(2 * max_tokens + 8):
            if (not self._live() or self.drafts_preempted > before or self.harness.stalled
                    or self.harness.going_nowhere or not set(rids) & set(self.harness.live_request_ids)):
                break
            self.step(1)
        for rid in rids if self._live() else ():
            if self.harness.status_of(rid) == "RUNNING":
                note(f"abort({rid})")
                self.harness.abort(rid)

    @rule(times=st.integers(1, 4))
    def step(self, times: int) -> None:
        """One to four engine steps (always enabled; a no-op once stopped)."""
        for _ in range(times):
            if not self._live():
                return
            assert self.stepper is not None
            harness = self.stepper.harness
            drafting = {r.request_id for r in harness.scheduler.running if r.spec_token_ids} if (
                harness.draw.speculative_method) else set()
            try:
                obs = self.stepper.step()
            finally:
                labels = set(self.stepper.last_labels)
                self.labels |= labels
                for label in sorted(labels):
                    event(label)
            if any(adm.admitted for adm in obs.admissions):
                self.labels.add("admission")
                event("admission")
            if any(adm.admitted and (adm.alloc_local_tokens or 0) > self.first_image.get(adm.request_id, 1 << 30)
                   for adm in obs.admissions):
                self.labels.add(IMAGE_HIT)
                event(IMAGE_HIT)
            if drafting and any(p.request_id in drafting for p in obs.preemptions):
                self.drafts_preempted += 1
                self.labels.add(DRAFTS_PREEMPTED)
                event(DRAFTS_PREEMPTED)

    @precondition(lambda self: self._live() and bool(self.harness and self.harness.live_request_ids))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        assert self.harness is not None
        rid = data.draw(st.sampled_from(sorted(self.harness.live_request_ids)), label="abort")
        # A client's abort lands between engine steps, or while the model runs
        # the next one (then right before its update_from_output).
        during = data.draw(st.booleans(), label="abort during the next step")
        note(f"abort({rid}{', during_step=True' if during else ''}) while {self.harness.status_of(rid)}")
        self.harness.abort(rid, during_step=during)

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def reset_prefix_cache(self, data: st.DataObject) -> None:
        """The engine core's ``reset_prefix_cache`` utility call, right
        before the next ``schedule()``. ``reset_running_requests`` (vLLM
        preempts every running request first) is drawn only with no KV
        transfer in flight: vLLM documents that it cannot reset then."""
        assert self.harness is not None
        transfers = self.harness.loads_in_flight() or self.harness.script.sends_in_flight
        running = data.draw(st.just(False) if transfers else st.booleans(), label="reset running requests")
        note(f"reset_prefix_cache(reset_running_requests={running})")
        before = len(self.harness.resets)
        self.harness.reset_prefix_cache(reset_running=running)
        self.step(1)
        if len(self.harness.resets) > before and self.harness.resets[-1][1]:
            self.labels.add(RUNNING_RESET if running else CACHE_RESET)

    @precondition(lambda self: self._live() and bool(self.harness and self.harness.loads_in_flight()))
    @rule(data=st.data())
    def fail_async_load(self, data: st.DataObject) -> None:
        """The connector reports an async load failed (``failed_recving``)."""
        assert self.harness is not None
        rid = data.draw(st.sampled_from(self.harness.loads_in_flight()), label="failed load")
        note(f"fail_async_load({rid})")
        self.harness.fail_async_load(rid)

    @precondition(lambda self: self._live())
    @rule()
    def fail_next_async_loads(self) -> None:
        """The async loads that land at the next step with any are reported
        failed (``failed_recving``): recompute resets and frees them, "fail" ends
        their requests."""
        assert self.harness is not None
        note("fail_next_async_loads()")
        self.harness.fail_next_async_loads()

    @precondition(lambda self: self._live() and bool(self.harness and self.harness.can_report_invalid_blocks))
    @rule()
    def fail_next_sync_loads(self) -> None:
        """The connector reports the synchronous loads of the next step with
        any as failed, block by block (``invalid_block_ids``); with policy "fail" vLLM evicts
        the invalid blocks and their dependents (a real eviction path)."""
        assert self.harness is not None
        note("fail_next_sync_loads()")
        self.harness.fail_next_sync_loads()

    @precondition(lambda self: self._live())
    @rule()
    def run_until_idle(self) -> None:
        """Let every request finish (chunked prefill re-enters schedule())."""
        assert self.harness is not None
        for _ in range(200):
            # idle: no request, no output pending; stalled: steps with
            # nothing to do (waiting requests the pool cannot hold; stranded
            # ones fail their check first); going nowhere: a preemption loop.
            # With no request left, an output still pending is fed all the
            # same: it is what returns an aborted request's deferred frees.
            stuck = self.harness.stalled or self.harness.going_nowhere
            if not self._live() or self.harness.is_idle() or (stuck and self.harness.live_request_ids):
                break
            self.step(1)

    # -- invariants -----------------------------------------------------------
    @invariant()
    def no_leaked_blocks_when_idle(self) -> None:
        if self._live() and self.harness is not None and self.harness.is_idle():
            if check_no_leaked_blocks in _machine_checks:
                with carrying_oplog(self.harness):
                    check_no_leaked_blocks(self.harness.pool_observation())

    def teardown(self) -> None:
        """Serve what is still queued (checking every step; a run whose
        stepping rules swarm testing switched off is scheduled here), abort
        whatever cannot finish, and check the pool once idle."""
        MACHINE_REACH["runs"] += 1
        if self._live() and self.harness is not None:
            self.run_until_idle()
            if self._live() and self.harness.live_request_ids:
                for rid in self.harness.live_request_ids:
                    self.harness.abort(rid)
                self.run_until_idle()
            MACHINE_REACH.update(self.labels)
            if self._live() and check_no_leaked_blocks in _machine_checks:
                with carrying_oplog(self.harness):
                    check_no_leaked_blocks(self.harness.pool_observation())


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(
    settings(), stateful_step_count=int(os.environ.get("FUZZ_MACHINE_STEPS", "30"))
)
