"""Fair time slices: every target of a worker runs early, and each gets its
share of the budget.

A worker fuzzes its targets in turns (slices), always giving the next turn
to the target that has had the least time so far. A target's first slice is
a handful of examples (at most about a second), so within the first seconds
every target has run (and every target gets that first slice even when
start-up outlasts the budget); its later slices last ``slice_seconds``: an eighth of its share of the budget,
between 1 and 10 seconds (long enough that starting a Hypothesis run costs
little, short enough that a 60 s campaign takes several turns per target).
How many examples fill a slice follows the target's speed in its last slice.

Pure bookkeeping: the clock is passed in, so tests drive it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FIRST_SLICE_EXAMPLES", "FairSchedule", "Turn"]

FIRST_SLICE_EXAMPLES, FIRST_SLICE_S = 10, 0.5
MIN_SLICE_S, MAX_SLICE_S = 1.0, 10.0
MAX_SLICE_EXAMPLES = 100_000


@dataclass(frozen=True)
class Turn:
    target: str
    index: int  # this target's slice number on this worker, from 0
    examples: int  # how many examples to ask Hypothesis for
    seconds: float  # the time the slice should take: it ends when its examples are done, or at twice this


@dataclass
class FairSchedule:
    """The turns of one worker fuzzing ``targets`` for ``budget`` seconds."""

    targets: list[str]
    budget: float
    used: dict[str, float] = field(default_factory=dict)  # seconds each target ran
    examples: dict[str, int] = field(default_factory=dict)  # examples each target ran
    turns: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)  # targets that need no more turns
    history: list[tuple[Turn, float, int]] = field(default_factory=list)  # (turn, seconds, examples)
    _rates: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("FairSchedule: no targets")
        if self.budget <= 0:
            raise ValueError(f"FairSchedule: budget={self.budget} must be positive")
        for t in self.targets:
            self.used.setdefault(t, 0.0)
            self.examples.setdefault(t, 0)
            self.turns.setdefault(t, 0)

    @property
    def slice_seconds(self) -> float:
        share = self.budget / len(self.targets)
        return min(max(share / 8, MIN_SLICE_S), MAX_SLICE_S)

    def rate(self, target: str) -> float | None:
        """Examples per second in the target's last generating slice (None
        before its first). The last slice, not the average: a first slice
        pays for warm-up (the target's first vLLM configuration, Hypothesis's
        one-time set-up) and would keep the next slices small for long."""
        return self._rates.get(target)

    def next_turn(self, elapsed: float) -> Turn | None:
        """The next slice, or None when the budget is spent or every target is done."""
        remaining = self.budget - elapsed
        live = [t for t in self.targets if t not in self.done]
        # The last tenth of a slice is not worth a Hypothesis run (and slices
        # that end early would otherwise split it ever finer).
        if not live:
            return None
        if remaining < 0.1 * self.slice_seconds:
            # Spent; but every target still gets its first, short slice (a
            # start-up slower than the budget, on a loaded machine, must not
            # leave a target unrun and the campaign silent about it).
            unrun = [t for t in live if self.turns[t] == 0]
            if not unrun:
                return None
            return Turn(unrun[0], 0, FIRST_SLICE_EXAMPLES, FIRST_SLICE_S)
        target = min(live, key=lambda t: (self.used[t], self.targets.index(t)))
        index = self.turns[target]
        rate = self.rate(target)
        if rate is None:
            return Turn(target, index, FIRST_SLICE_EXAMPLES, min(FIRST_SLICE_S, remaining))
        seconds = min(self.slice_seconds, remaining)
        return Turn(target, index, max(1, min(round(rate * seconds), MAX_SLICE_EXAMPLES)), seconds)

    def record(self, turn: Turn, *, seconds: float, examples: int, generated: bool = True) -> None:
        """What the slice took; ``generated=False`` for a replay, whose speed
        says nothing about the next slice's."""
        self.history.append((turn, seconds, examples))
        self.used[turn.target] += seconds
        self.examples[turn.target] += examples
        self.turns[turn.target] = turn.index + 1
        if generated and seconds > 0 and examples > 0:
            self._rates[turn.target] = examples / seconds

    def finish(self, target: str) -> None:
        """``target`` needs no more turns (it found enough, or has nothing to replay)."""
        self.done.add(target)
