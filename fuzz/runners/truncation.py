"""Running a truncation scenario on a real ``KVCacheManager`` (no Hypothesis
decorators here; the targets wrap this)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fuzz import adapter
from fuzz.telemetry import note, observe_gap, observe_layout, reach, reject, target
from fuzz.model import Behaviour, InvariantViolation, TruncationObservation, TruncationScenario, group_behaviour
from fuzz.outcomes import ConfigRejected, vllm_calls

__all__ = ["carrying_run", "run_truncation_scenario"]


def run_truncation_scenario(scenario: TruncationScenario) -> TruncationObservation | None:
    """Populate, evict, look up and truncate. None when vLLM refused the
    layout (at construction, or at first use with a documented refusal); an
    exception vLLM raises on the way in a runtime path is a ``no-exception``
    violation, one the suite's code raises a :class:`HarnessError`."""
    note(f"scenario: {scenario!r}")
    try:
        with vllm_calls(adapter.VLLM_VERSION, repr(scenario)):
            return _run(scenario)
    except ConfigRejected as exc:
        reject(exc.reason.split(";")[0][:80])
        return None


def _run(scenario: TruncationScenario) -> TruncationObservation:
    harness = adapter.ManagerHarness(scenario.layout, scenario.eagle)
    observe_layout([g.kind for g in scenario.layout.groups])
    for i in range(len(scenario.prompts)):
        if not harness.prefill(scenario.prompt_tokens(i), scenario.prefill_chunk):
            reach("prefill ran out of blocks (LRU pressure)")
    replay = scenario.replay_tokens()
    cached = harness.per_group_cached_block_ids(replay)
    victims: set[int] = set()
    for group, cut in enumerate(scenario.evict_from):
        if cut is not None and cached[group]:
            victims.update(cached[group][cut % (len(cached[group]) + 1):])
    if victims:
        harness.evict(victims)
    found = harness.lookup(replay, scenario.lookup_mode)
    hits = found.hits
    cover = [h for h, g in zip(hits, harness.groups) if group_behaviour(g) is Behaviour.MUST_COVER]
    anchors = {
        "cover_hit": min(cover, default=0),
        "min_hit": min(hits, default=0),
        "max_hit": max(hits, default=0),
        "zero": 0,
    }
    endpoint = scenario.endpoint.resolve(anchors, harness.scheduler_block_size)
    reach(f"lookup={found.mode}")
    if harness.eagle_drop_group_ids:
        reach("EAGLE block dropped" if found.eagle_dropped else "EAGLE lookup, nothing dropped")
    reach("hits diverge" if len(set(hits)) > 1 else "hits agree")
    reach("endpoint misaligned" if endpoint % harness.scheduler_block_size else "endpoint aligned")
    if any(h % harness.scheduler_block_size for h in hits):
        reach("partial (sub-block) hit")
    gap = max(hits, default=0) - min(hits, default=0)
    target(float(gap), label="per-group hit gap")
    observe_gap(gap, harness.scheduler_block_size)
    obs = harness.observe_truncate(found, endpoint, context=repr(scenario))
    reach("truncate raised" if obs.error else "truncate returned")
    for g in obs.groups:
        if group_behaviour(g.info) is Behaviour.MAY_BE_SHORT:
            if len(g.input_before) < endpoint // g.info.block_size:
                reach("whole-state group shorter than the endpoint")
    note(obs.describe())
    return obs


@contextlib.contextmanager
def carrying_run(scenario: TruncationScenario, obs: TruncationObservation) -> Iterator[None]:
    """A violation raised inside carries the run it was found on (``scenario``
    and ``obs``: the truncation repro writer's input), unless it carries one
    already. Hypothesis raises the minimal example's, so the repro is
    written from the run that failed, whatever ran after it."""
    try:
        yield
    except InvariantViolation as exc:
        if exc.truncation_run is None:
            exc.truncation_run = (scenario, obs)
        raise
