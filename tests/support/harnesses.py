"""The one way a test builds a scheduler harness by hand."""

from __future__ import annotations

from typing import Any

from fuzz.adapter import SchedulerHarness
from fuzz.model import LayoutDraw, SchedulerDraw

__all__ = ["harness_of"]


def harness_of(layout: LayoutDraw, *, batch: int | None = None, seqs: int | None = None, **draw: Any) -> SchedulerHarness:
    """A :class:`~fuzz.adapter.SchedulerHarness` on ``layout``: ``batch``
    tokens a step (``max_num_batched_tokens``), at most ``seqs`` requests a
    step (``max_num_seqs``), and any other :class:`~fuzz.model.SchedulerDraw`
    field as a keyword; what is not given keeps SchedulerDraw's default."""
    if batch is not None:
        draw["max_num_batched_tokens"] = batch
    if seqs is not None:
        draw["max_num_seqs"] = seqs
    return SchedulerHarness(SchedulerDraw(layout, **draw))
