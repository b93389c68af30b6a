"""What a step's encoder outputs must be: the record of one that was not there.

Standard library only."""

from __future__ import annotations

import dataclasses

__all__ = ["MissingEncoderOutput"]


@dataclasses.dataclass(frozen=True)
class MissingEncoderOutput:
    """A multimodal item whose placeholder a step computes positions of,
    while the worker's encoder cache does not hold its output: it was not
    computed in that step, and the output computed earlier was freed (or
    never computed)."""

    request_id: str
    item: int  # its index among the request's multimodal items
    identifier: str  # the item's identifier (its mm hash)
    placeholder: tuple[int, int]  # (offset, length)
    computes: tuple[int, int]  # the positions [start, end) the step computes for the request
    freed_at: int | None  # the step whose output told the worker to free it (None: never computed)

    def describe(self) -> str:
        offset, length = self.placeholder
        start, end = self.computes
        why = ("it was never computed" if self.freed_at is None
               else f"the output was freed by step {self.freed_at}'s free_encoder_mm_hashes")
        return (
            f"request {self.request_id} computes positions [{start}, {end}), inside the placeholder "
            f"[{offset}, {offset + length}) of its item {self.item} ({self.identifier!r}), but the step schedules "
            f"no encoder run for it and the worker's encoder cache does not hold it: {why}"
        )
