"""Reach of the single-shot scheduler target, measured.

Runs ``fuzz_scheduler_single_shot`` itself (the same derandomized examples
CI runs under the active profile; 150 under ci) and counts, per example,
the branch labels it reached (``fuzz.targets.scheduler.REACH``, one count
per label per example). Asserts the share of examples that reached the
external-hit truncation and the divergent-hit fallback; prints every
label's share (``-s`` to see them).
"""

from __future__ import annotations

from fuzz.targets import scheduler as runner
from fuzz.targets import target_scheduler

MIN_TRUNCATION = 0.30
MIN_FALLBACK = 0.10


def test_single_shot_reach() -> None:
    before = runner.REACH.copy()
    target_scheduler.fuzz_scheduler_single_shot()
    reach = runner.REACH - before
    n = reach["examples"]
    assert n > 0
    shares = {label: count / n for label, count in reach.items() if label != "examples"}
    print(f"\nsingle-shot reach over {n} examples:")
    for label, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {share:6.1%}  {label}")
    truncation = shares.get(runner.TRUNCATION, 0.0)
    fallback = shares.get(runner.FALLBACK, 0.0)
    assert truncation >= MIN_TRUNCATION, (
        f"the external-hit truncation branch was reached by {truncation:.1%} of {n} "
        f"single-shot examples (need {MIN_TRUNCATION:.0%}); the strategies in "
        "strategies/scheduler.py no longer steer replays onto sub-block hits"
    )
    assert fallback >= MIN_FALLBACK, (
        f"the divergent-hit fallback was reached by {fallback:.1%} of {n} single-shot "
        f"examples (need {MIN_FALLBACK:.0%})"
    )
