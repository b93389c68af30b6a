"""The connector hand-off: the blocks ``request_finished`` names.

When a request finishes, vLLM tells the KV connector which blocks hold its
KV; a producer (a P/D prefill instance) then sends those blocks' contents
to its decode instance, and an offloading connector saves them. A wrong
block id sends or saves another request's KV, or stale KV, under this
request's name, and nothing on the scheduler's side notices.

The contract, vLLM 0.33.0's ``Scheduler._connector_finished``
(``vllm/v1/core/sched/scheduler.py``): it first frees the blocks a
request's window or chunk no longer needs, on the processed-token basis
(``remove_skipped_blocks`` with ``num_computed_tokens - num_in_flight_tokens``:
they become the null block in its table), then hands
``KVCacheManager.get_block_ids_for_computed_tokens(request_id,
num_computed_tokens)``: per group, an attention group's first
``cdiv(num_computed_tokens, block_size)`` blocks, any other group (Mamba)
its whole table; an HMA connector gets every group
(``request_finished_all_groups``), any other the one group there is.

The expected value is the harness's own record (:class:`fuzz.model.HandOff`,
kept by ``fuzz/adapter/_handoff.py``): the table the runner was handed for
the request, and what the contents model says each block holds.
"""

from __future__ import annotations

from collections.abc import Iterator

from fuzz.model import Fact, HandOff, Instance, InvariantViolation, StepObservation, cdiv, group_kind, group_name
from invariants.ownership import read_indices

__all__ = ["HANDS_OTHER_BLOCKS", "HANDS_UNHELD_KV", "check_hand_off_names_computed_blocks"]

# The check's names for what it found (InvariantViolation.state).
HANDS_OTHER_BLOCKS = "handed blocks differ from the request's table"
HANDS_UNHELD_KV = "a handed block does not hold the request's KV"

WHERE = "Scheduler._connector_finished"
# Where to blame KV a request rolled back by a failed synchronous load does
# not hold: the rollback, which may resume it where no state exists.
ROLLED_BACK = "Scheduler._update_requests_with_invalid_blocks"


def check_hand_off_names_computed_blocks(step: StepObservation) -> None:
    """What ``request_finished`` hands the connector is exactly the blocks
    that hold the request's computed KV, in every group whose contents the
    suite models (attention of any span; Mamba in align mode without
    speculative state blocks).

    Per group, against the table the harness last saw the request hold
    (the runner's, or an async load's allocation) and ``N =
    num_computed_tokens``, ``P`` the tokens processed (``N`` less those of a
    step still in flight): an attention group is handed exactly the first
    ``cdiv(N, block_size)`` blocks of that table, a Mamba group the whole
    table; each entry is the table's block, or the null block where the
    group no longer needs it (outside what a step computing ``[P, N)``
    reads: below a window or chunk, R-SWA's gap, an older Mamba state).
    Each handed block holds the request's KV (that position, computed from
    its token) at every position it covers below ``P``; a Mamba group's
    block at ``P`` holds the state there.

    It cannot see what the connector does with the ids, nor blocks of
    groups the contents model does not follow (scratch groups, Mamba with
    speculative state blocks or outside align mode); positions an async
    load is still bringing, or a failed load left, are not judged, nor the
    contents handed for a request that finished with an error."""
    for violation in _hand_off_violations(step):
        raise violation


def _hand_off_violations(step: StepObservation) -> Iterator[InvariantViolation]:
    """One violation per finished request and group whose hand-off is wrong."""
    for finish in step.connector_finishes:
        h = finish.hand_off
        if h is None:
            continue
        for g, group in enumerate(h.groups):
            if g >= len(h.handed) or not h.judged[g]:
                continue
            found = _other_blocks(h, g)
            state = HANDS_OTHER_BLOCKS
            if not found:
                found = [_unheld_text(h.rules[g][0] == "state", block, p, held)
                         for gg, block, p, held in h.unheld if gg == g]
                state = HANDS_UNHELD_KV
            where = ROLLED_BACK if h.rolled_back and state == HANDS_UNHELD_KV else WHERE
            if found:
                text = (
                    f"{group_name(group)}: request_finished hands the connector blocks {list(h.handed[g])} for "
                    f"request {h.request_id}: " + "; ".join(found) + f"\n  {h.describe()}"
                )
                if step.context:
                    text += f"\n  scenario: {step.context}"
                facts = (Fact("handed-blocks", (h.request_id, g), list(h.handed[g]), _expected_ids(h, g)),) \
                    if state == HANDS_OTHER_BLOCKS else ()
                instance = Instance(state, group_kind(group), g, (h.request_id,), _wrong_blocks(h, g, state))
                yield InvariantViolation("hand-off-names-computed-blocks", f"step {step.step}: {text}", where=where,
                                         group_kind=group_kind(group), state=state, instances=(instance,),
                                         facts=facts)


def _wrong_blocks(h: HandOff, g: int, state: str) -> tuple[int, ...]:
    """The blocks of group ``g``'s hand-off at fault: those handed where the
    table holds another (or past it) and the table's blocks not handed; or
    those not holding the request's KV."""
    if state == HANDS_UNHELD_KV:
        return tuple(dict.fromkeys(block for gg, block, _, _ in h.unheld if gg == g))
    expected, handed = _expected_ids(h, g), h.handed[g]
    wrong = [mine for i, mine in enumerate(handed) if i >= len(expected) or mine != expected[i]]
    return tuple(dict.fromkeys(wrong + list(expected[len(handed):])))


def _unheld_text(state: bool, block: int, p: int, held: tuple[int, int, int | None] | None) -> str:
    if state:
        return f"block {block} holds " + ("no state" if held is None else f"the state at {held[0]} (step {held[1]})") + (
            f" where the request's state at {p} belongs")
    return f"block {block} at position {p} holds " + (
        "nothing" if held is None else f"the KV of position {held[0]} (step {held[1]}, token {held[2]})")


def _needed(h: HandOff, g: int, table: tuple[int, ...]) -> set[int]:
    """The indices of group ``g``'s table a step computing ``[P, N)`` reads."""
    size, n, p = h.groups[g].block_size, h.num_computed_tokens, h.num_processed_tokens
    return {i for i in read_indices(h.rules[g], size, p, n, h.num_prompt_tokens, len(table)) if i >= 0} if n else set()


def _expected_ids(h: HandOff, g: int) -> list[int]:
    """The ids group ``g`` must be handed: its recorded table (cut to the
    computed tokens where the group is clipped), with the null block where
    it was handed one the group no longer needs."""
    table = h.recorded[g] if g < len(h.recorded) else ()
    expected = table[: cdiv(h.num_computed_tokens, h.groups[g].block_size)] if h.clipped[g] else table
    needed = _needed(h, g, table)
    handed = h.handed[g]
    allowed = {i for i, mine in enumerate(handed) if mine == h.null_block_id and i not in needed}
    return [h.null_block_id if i in allowed else block for i, block in enumerate(expected)]


def _other_blocks(h: HandOff, g: int) -> list[str]:
    """How group ``g``'s handed ids differ from the blocks the request's
    table holds (the null block allowed where the group no longer needs
    the block)."""
    size = h.groups[g].block_size
    n = h.num_computed_tokens
    table = h.recorded[g] if g < len(h.recorded) else ()
    expected = table[: cdiv(n, size)] if h.clipped[g] else table
    handed = h.handed[g]
    needed = _needed(h, g, table)
    found = []
    if len(handed) != len(expected):
        found.append(
            f"{len(handed)} blocks, where the request's table "
            + (f"holds {len(expected)} covering its {n} computed tokens" if h.clipped[g]
               else f"holds {len(expected)} (the whole table)")
        )
    wrong = [
        (i, mine, theirs) for i, (mine, theirs) in enumerate(zip(handed, expected))
        if mine != theirs and not (mine == h.null_block_id and i not in needed)
    ]
    if wrong:
        found.append(", ".join(
            f"index {i}: block {mine}, where the table holds {theirs}"
            + (" (a block the group still needs)" if mine == h.null_block_id else "")
            for i, mine, theirs in wrong
        ))
    return found
