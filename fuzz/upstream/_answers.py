"""The KV connector's answers in an upstream-form repro.

vLLM's ``MockKVConnector`` answers every request alike: ``matched_tokens``
(and ``is_async``) once it has said 'not yet' ``num_defers_before_matching``
times to the request (counted from the request's first question, with the
config of that moment). A test may give it another config between steps
(``scheduler.connector.config = MockKVConfig(...)``, as vLLM's own
``test_prefix_replay.py`` does), so a run whose answers change from step to
step is stated one config a step. Where one step's answers differ between
requests, the run is stated as an external store: ``matched_tokens`` is
then how much of each prompt the store holds, and the file's connector
answers the part of it past where the request computes from, the prompt's
last token left to compute (what the suite's ``store`` reply answers).
"""

from __future__ import annotations

import dataclasses

from fuzz.model import OpLog

__all__ = ["Answers", "connector_answers"]


@dataclasses.dataclass(frozen=True)
class Answers:
    """The connector's config from each step on where it changes, the
    first step's the one the file starts with: step -> (matched_tokens,
    is_async, num_defers_before_matching). ``store``: ``matched_tokens``
    is a store's length (else the answer itself)."""

    store: bool
    configs: dict[int, tuple[int, bool, int]]


def connector_answers(log: OpLog) -> Answers | None:
    """The configs that answer as ``log``'s connector did (None: none does:
    answers that no one store explains, a store's async loads, or 'not yet'
    counts that differ between the requests one step asks first)."""
    lengths = {r.request_id: len(r.token_ids) for r in log.requests}
    asked: set[str] = set()
    steps = []  # per step: its decided answers, the 'not yet' count of the requests it asks first
    for step in log.steps:
        decided = [(a.request_id, a.num_computed_tokens, a.answer, a.load_async)
                   for a in step.answers if a.answer is not None]
        first = {_defers(log, a.request_id) for a in step.answers if a.request_id not in asked}
        asked.update(a.request_id for a in step.answers)
        if len(first) > 1 or len({a[3] for a in decided}) > 1:
            return None
        steps.append((step.index, decided, first))
    store = any(len({a[2] for a in decided}) > 1 for _, decided, _ in steps)
    values = {}  # step -> (matched_tokens, is_async), where it answers
    for index, decided, _ in steps:
        if decided:
            values[index] = _stored(decided, lengths) if store else (decided[0][2], decided[0][3])
            if values[index] is None or store and decided[0][3]:
                return None
    current = (*next(iter(values.values()), (0, False)), next((min(f) for _, _, f in steps if f), 0))
    start = next((i for i, d, f in steps if d or f), None)  # the first step that asks
    configs = {}
    for index, _, first in steps:
        config = (*values.get(index, current[:2]), min(first) if first else current[2])
        if index == start or config != current:
            configs[index] = current = config
    return Answers(store, configs)


def _defers(log: OpLog, rid: str) -> int:
    """How many times the run's connector said 'not yet' to ``rid`` first."""
    answers = log.answers_for(rid)
    return next((i for i, a in enumerate(answers) if a.answer is not None), len(answers))


def _stored(decided: list[tuple[str, int, int, bool]], lengths: dict[str, int]) -> tuple[int, bool] | None:
    """The one store length every answer of a step is the share of (a store
    answers what it holds past where the request computes from, up to its
    prompt's last token), and whether the loads are async; None: none is."""
    low, high = 0, None
    for rid, computed, answer, _ in decided:
        top = lengths[rid] - 1
        if answer == 0:  # the store holds no more than the request computed
            high = computed if high is None else min(high, computed)
        elif computed + answer == top:  # it holds the whole prompt, or more
            low = max(low, top)
        else:
            low, high = max(low, computed + answer), computed + answer if high is None else min(high, computed + answer)
    if high is not None and low > high:
        return None
    return low, decided[0][3]
