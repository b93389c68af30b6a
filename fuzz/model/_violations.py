"""What a failed check raises, with the structured facts a known-bug match needs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Fact", "HarnessError", "Instance", "InvariantViolation", "MissedHit"]


@dataclass(frozen=True)
class Instance:
    """One occurrence of a broken claim: the state, the group and the
    requests and blocks it involves. A known bug is matched per instance
    (style rule 20): a violation is set aside only when every one of its
    instances is some known bug's."""

    state: str = ""
    group_kind: str | None = None
    group: int | None = None
    requests: tuple[str, ...] = ()
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Fact:
    """A concrete disagreement on vLLM's own state, which an upstream-form
    repro asserts: right after the failing call, ``subject`` (a name from
    the upstream writer's vocabulary of vLLM-state expressions, with its
    ``args``) is ``observed`` where the harness's own model expects
    ``expected``, compared by ``relation`` (``==``, ``!=``, ``>=``, ``in``:
    one of ``expected``; ``len``: ``len(subject) == expected``). ``step`` is the
    step it is stated at (None: the failing one), ``after`` the call it
    follows there: ``"update"`` (the step's ``update_from_output``),
    ``"schedule"`` (its ``schedule()``, before the output is fed back) or
    ``"before"`` (the step before its ``schedule()``: the test stops there)."""

    subject: str
    args: tuple = ()
    observed: object = None
    expected: object = None
    relation: str = "=="
    step: int | None = None
    after: str = "update"


class InvariantViolation(AssertionError):
    """An invariant failed.

    ``invariant`` names the check (deduplication, known-bug matching);
    ``where`` is the vLLM call whose result broke it (e.g.
    ``"Scheduler.schedule"``); ``group_kind`` the spec class name of the
    group it concerns, when one group is to blame; ``exception`` and
    ``frames`` the exception vLLM raised, if one is behind the violation,
    and its innermost vLLM frames; ``statement`` the vLLM statement that
    raised it; ``state`` the check's name for the failing condition. The message carries the numbers for a
    person; matching never reads it.
    """

    def __init__(
        self,
        invariant: str,
        message: str,
        where: str = "",
        group_kind: str | None = None,
        exception: str | None = None,
        frames: tuple[str, ...] = (),
        statement: str = "",
        state: str = "",
        instances: tuple[Instance, ...] = (),
        facts: tuple[Fact, ...] = (),
    ) -> None:
        super().__init__(f"[{invariant}] {message}")
        self.invariant = invariant
        self.where = where
        self.group_kind = group_kind
        self.exception = exception
        self.frames = frames
        # The vLLM statement that raised ``exception`` (whitespace collapsed).
        self.statement = statement
        # The check's name for the failing condition, from the check's own
        # small vocabulary (e.g. what a stranded request waits for).
        self.state = state
        # Every occurrence the check found (one, from ``state`` and
        # ``group_kind``, when the check names none).
        self.instances = instances or (Instance(state=state, group_kind=group_kind),)
        # What an upstream-form repro asserts on vLLM's state (may be empty).
        self.facts = facts
        # The failing run's operation log (fuzz.model.OpLog), set by the
        # runner that raised it: the repro is written from it.
        self.oplog: object | None = None
        # The shrunk log the repro was written from, set by its
        # writer: the campaign's sidecar keeps it for ``python -m fuzz replay``.
        self.repro_oplog: object | None = None
        # A truncation run's (TruncationScenario, TruncationObservation), set
        # where its checks ran: the truncation repro is written from it.
        self.truncation_run: tuple[object, object] | None = None
        # Set where known bugs were sorted out of it (fuzz.known_bugs.sort_out):
        # what is left is no known bug's, and nothing matches it again.
        self.sorted_out = False


class MissedHit(InvariantViolation):
    """A lookup served a shorter prefix-cache hit than the index held for it,
    or the pool evicted a cached block its documented free order would have
    kept: a performance bug (tokens recomputed that were, or could have
    stayed, cached), never a corruption. Its own outcome (:data:`fuzz.outcomes.Outcome.MISSED_HIT`),
    counted, reported and exited on apart from violations.

    A subclass rather than a separate type, on purpose: everything that
    carries a failing run works on it unchanged (Hypothesis shrinks it as an
    ``AssertionError``, the runner attaches its operation log, the campaign
    deduplicates it by invariant, call and state, and writes its repro and
    sidecar), and only the places that tell outcomes apart
    (:func:`fuzz.outcomes.classify`, the sidecar's ``outcome``) look at the
    type. A check that catches ``InvariantViolation`` to collect findings
    (``step_violations``) collects it too, which is what a run wants."""


class HarnessError(RuntimeError):
    """The suite's own code does not fit the installed vLLM (an API it
    relies on is missing or changed). Never a vLLM bug: exit 2, no repro."""
