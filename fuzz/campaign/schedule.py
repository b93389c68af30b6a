"""Time slices that follow discovery: every target runs early and keeps a
floor; the rest of the budget goes where new behaviour is still being found.

A worker fuzzes its targets in turns (slices). A target's first slice is a
handful of examples (at most about a second), so within the first seconds
every target has run (and every target gets that first slice even when
start-up outlasts the budget). After that, each turn goes to:

1. a target below its **floor** (``FLOOR`` of an even share of the time
   elapsed so far), the one furthest below first: a saturated target keeps
   running, at a trickle;
2. otherwise the target with the best **expected return**: new behaviour per
   second over its recent slices (each slice's novelty and seconds decay by
   ``DECAY`` per later slice of that target, plus a small prior, so a target
   that stops finding things falls back within a few slices and one that
   has not run for a while is not judged on old luck).

"New behaviour" is whatever the caller counts per slice (the campaign and
the bugbench: branch labels, known-bug states, vLLM's refusals, hit gaps and
pairs of labels one example reached together, never seen before in this
process; :func:`fuzz.campaign.novelty.features`). vLLM's own branches are
left out: tracing them costs the campaign what it measures
(``--coverage``, docs/coverage.md). HypoFuzz and AFL-family schedulers
spend time the same way: by each target's recent rate of discovery, with a
floor for all.

Later slices last ``slice_seconds``: an eighth of an even share of the
budget, between 1 and 10 seconds. A slice asks Hypothesis for as many
examples as the target's average speed fills (over its slices after the
first: the first pays warm-up); the worker ends a slice at twice its
seconds whatever the count, after a whole example.

Pure bookkeeping: the clock is passed in, so tests drive it by hand. Each
turn says why it was given (``Turn.why``); the report prints the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DECAY", "FIRST_SLICE_EXAMPLES", "FLOOR", "DiscoverySchedule", "Turn"]

FIRST_SLICE_EXAMPLES, FIRST_SLICE_S = 10, 0.5
MIN_SLICE_S, MAX_SLICE_S = 1.0, 10.0
MAX_SLICE_EXAMPLES = 100_000
# Every target gets at least this fraction of an even share of the time so far.
FLOOR = 0.5
# A slice's weight in a target's recent rate halves with each later slice of it.
DECAY = 0.5
# The prior of every rate: one new behaviour in this many seconds, so an
# unlucky slice does not sink a target for good, and ties go by speed.
PRIOR_NOVELTY, PRIOR_SECONDS = 0.5, 2.0

FIRST, FLOOR_WHY, BEST, SPENT = "first slice", "floor", "best discovery rate", "first slice (budget spent)"


@dataclass(frozen=True)
class Turn:
    target: str
    index: int  # this target's slice number on this worker, from 0
    examples: int  # how many examples to ask Hypothesis for
    seconds: float  # the time the slice should take: it ends when its examples are done, or at twice this
    why: str = FIRST  # FIRST, FLOOR_WHY, BEST (with the rate), or SPENT


@dataclass
class DiscoverySchedule:
    """The turns of one worker fuzzing ``targets`` for ``budget`` seconds."""

    targets: list[str]
    budget: float
    used: dict[str, float] = field(default_factory=dict)  # seconds each target ran
    examples: dict[str, int] = field(default_factory=dict)  # examples each target ran
    novelty: dict[str, int] = field(default_factory=dict)  # new behaviours each target found
    turns: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)  # targets that need no more turns
    history: list[tuple[Turn, float, int, int]] = field(default_factory=list)  # (turn, seconds, examples, novelty)
    _recent: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)  # decayed (novelty, seconds)
    _first: dict[str, tuple[float, int]] = field(default_factory=dict, repr=False)  # (seconds, examples) of slice 0
    _later: dict[str, tuple[float, int]] = field(default_factory=dict, repr=False)  # the same, summed after it

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("DiscoverySchedule: no targets")
        if self.budget <= 0:
            raise ValueError(f"DiscoverySchedule: budget={self.budget} must be positive")
        for t in self.targets:
            self.used.setdefault(t, 0.0)
            self.examples.setdefault(t, 0)
            self.novelty.setdefault(t, 0)
            self.turns.setdefault(t, 0)

    @property
    def slice_seconds(self) -> float:
        share = self.budget / len(self.targets)
        return min(max(share / 8, MIN_SLICE_S), MAX_SLICE_S)

    def rate(self, target: str) -> float | None:
        """Examples per second over the target's generating slices after its
        first (the first pays warm-up: its first vLLM configuration,
        Hypothesis's set-up); the first slice's own rate until then; None
        before any. An average, not the last slice: a state machine's
        examples range from one step to hundreds, and one long example
        would otherwise shrink the next slice to a single example."""
        seconds, examples = self._later.get(target) or self._first.get(target) or (0.0, 0)
        return examples / seconds if seconds > 0 and examples > 0 else None

    def discovery_rate(self, target: str) -> float:
        """New behaviours per second over the target's recent slices (decayed), with the prior."""
        found, seconds = self._recent.get(target, (0.0, 0.0))
        return (found + PRIOR_NOVELTY) / (seconds + PRIOR_SECONDS)

    def share(self, target: str) -> float:
        """The target's part of all the time used so far (0 before any)."""
        total = sum(self.used.values())
        return self.used[target] / total if total > 0 else 0.0

    def _pick(self, live: list[str]) -> tuple[str, str]:
        elapsed = sum(self.used.values())
        floor = FLOOR * elapsed / len(self.targets)
        below = [t for t in live if self.used[t] < floor]
        if below:
            return min(below, key=lambda t: (self.used[t] - floor, self.targets.index(t))), FLOOR_WHY
        best = max(live, key=lambda t: (self.discovery_rate(t), -self.targets.index(t)))
        return best, f"{BEST} {self.discovery_rate(best):.2f}/s"

    def next_turn(self, elapsed: float) -> Turn | None:
        """The next slice, or None when the budget is spent or every target is done."""
        remaining = self.budget - elapsed
        live = [t for t in self.targets if t not in self.done]
        if not live:
            return None
        unrun = [t for t in live if self.turns[t] == 0]
        # The last tenth of a slice is not worth a Hypothesis run (and slices
        # that end early would otherwise split it ever finer).
        if remaining < 0.1 * self.slice_seconds:
            # Spent; but every target still gets its first, short slice (a
            # start-up slower than the budget, on a loaded machine, must not
            # leave a target unrun and the campaign silent about it).
            if not unrun:
                return None
            return Turn(unrun[0], 0, FIRST_SLICE_EXAMPLES, FIRST_SLICE_S, SPENT)
        if unrun:
            return Turn(unrun[0], 0, FIRST_SLICE_EXAMPLES, min(FIRST_SLICE_S, remaining), FIRST)
        target, why = self._pick(live)
        index = self.turns[target]
        seconds = min(self.slice_seconds, remaining)
        rate = self.rate(target)
        examples = FIRST_SLICE_EXAMPLES if rate is None else round(rate * seconds)
        return Turn(target, index, max(1, min(examples, MAX_SLICE_EXAMPLES)), seconds, why)

    def record(self, turn: Turn, *, seconds: float, examples: int, novelty: int = 0,
               generated: bool = True) -> None:
        """What the slice took and how many new behaviours it found;
        ``generated=False`` for a replay, whose speed and finds say nothing
        about the next slice's."""
        self.history.append((turn, seconds, examples, novelty))
        self.used[turn.target] += seconds
        self.examples[turn.target] += examples
        self.novelty[turn.target] += novelty
        self.turns[turn.target] = turn.index + 1
        if not generated:
            return
        found, secs = self._recent.get(turn.target, (0.0, 0.0))
        self._recent[turn.target] = (DECAY * found + novelty, DECAY * secs + seconds)
        if seconds > 0 and examples > 0:
            if turn.index == 0:
                self._first[turn.target] = (seconds, examples)
            else:
                s, n = self._later.get(turn.target, (0.0, 0))
                self._later[turn.target] = (s + seconds, n + examples)

    def finish(self, target: str) -> None:
        """``target`` needs no more turns (it found enough, or has nothing to replay)."""
        self.done.add(target)
