"""What a fuzz campaign reached, counted per process.

Targets call :func:`reach` instead of ``hypothesis.event`` (it does both), and
record the layouts and hit gaps they drew; the campaign runner snapshots the
counters into its progress files and the report aggregates them.
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter

import hypothesis

__all__ = [
    "COUNTERS", "LABEL_PAIRS", "begin_example", "end_example", "example_labels", "note", "observe_gap",
    "observe_layout", "reach", "reject", "set_aside", "snapshot", "target",
]

COUNTERS: dict[str, Counter[str]] = {
    "branches": Counter(),  # reach() labels
    "spec_kinds": Counter(),  # spec class drawn, once per group
    "layouts": Counter(),  # sorted kinds of a layout
    "hit_gap": Counter(),  # max - min per-group hit, in scheduler blocks
    "rejections": Counter(),  # layouts vLLM refused, by reason
    "known_bugs": Counter(),  # known vLLM bugs met and set aside, by id (steps showing each)
}


# Every pair of labels some one example reached together: what the campaign's
# schedule counts as new behaviour beside the labels themselves
# (fuzz.campaign.novelty). Kept out of the progress files: it grows with the
# square of the labels.
LABEL_PAIRS: set[tuple[str, str]] = set()
_EXAMPLE: set[str] = set()  # the labels of the example running now


def reach(label: str) -> None:
    """Label a branch this example reached (Hypothesis statistics + campaign report)."""
    if hypothesis.currently_in_test_context():
        hypothesis.event(label)
    COUNTERS["branches"][label] += 1
    _EXAMPLE.add(label)


def example_labels(labels: set[str] | frozenset[str]) -> None:
    """Labels the running example reached that its runner counts itself
    (the scheduler tier's step labels, handed over each step), for this
    example's pairs."""
    _EXAMPLE.update(labels)


def begin_example() -> None:
    """An example starts: its labels are collected from here."""
    _EXAMPLE.clear()


def end_example() -> None:
    """The example is over: every pair of its labels joins :data:`LABEL_PAIRS`."""
    LABEL_PAIRS.update(itertools.combinations(sorted(_EXAMPLE), 2))
    _EXAMPLE.clear()


def note(text: str) -> None:
    """``hypothesis.note`` inside a test; nothing outside (pinned replays)."""
    if hypothesis.currently_in_test_context():
        hypothesis.note(text)


def target(value: float, label: str) -> None:
    """``hypothesis.target`` inside a test; nothing outside."""
    if hypothesis.currently_in_test_context():
        hypothesis.target(value, label=label)


def reject(reason: str) -> None:
    reach(f"layout rejected by vLLM: {reason}")
    COUNTERS["rejections"][reason] += 1


def observe_layout(kinds: list[str]) -> None:
    for k in kinds:
        COUNTERS["spec_kinds"][k] += 1
    COUNTERS["layouts"][" + ".join(sorted(kinds))] += 1


def observe_gap(gap_tokens: int, scheduler_block_size: int) -> None:
    COUNTERS["hit_gap"][str(gap_tokens // max(scheduler_block_size, 1))] += 1


def set_aside(bug_id: str) -> None:
    """A step showed known vLLM bug ``bug_id`` and the runner set it aside:
    counted, so a campaign's summary says which known bugs it met."""
    COUNTERS["known_bugs"][bug_id] += 1


def snapshot() -> dict[str, dict[str, int]]:
    out = {name: dict(c) for name, c in COUNTERS.items()}
    # The scheduler tier keeps its own reach counter (its reach test reads it).
    scheduler = sys.modules.get("fuzz.runners.scheduler")
    for label, n in getattr(scheduler, "REACH", {}).items():
        out["branches"][f"scheduler: {label}"] = n
    # The state machine counts per run ("runs" = total).
    machine = sys.modules.get("fuzz.targets.target_scheduler")
    for label, n in getattr(machine, "MACHINE_REACH", {}).items():
        out["branches"][f"scheduler machine: {label}"] = n
    return out
