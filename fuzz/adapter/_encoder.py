"""The worker's encoder cache, kept from the scheduler's outputs alone.

A model runner learns each request's multimodal items from the
``scheduled_new_reqs`` that first hand it over (``mm_features``: the
identifier and the placeholder of each), frees the outputs each
``SchedulerOutput`` lists in ``free_encoder_mm_hashes`` before the step
runs, runs the encoder for ``scheduled_encoder_inputs`` and keeps each
output under its identifier, and then, for every position of a placeholder
the step computes, reads that item's output from its cache
(``vllm/v1/worker``'s encoder-cache handling, and the scheduler's own
account in ``Scheduler._try_schedule_encoder_inputs``). This record never
reads vLLM's ``EncoderCacheManager``: what the manager says is cached is
exactly what is judged.
"""

from __future__ import annotations

from typing import Any

from fuzz.adapter._reports import computed_before
from fuzz.model._encoder import MissingEncoderOutput

__all__ = ["EncoderWatch"]


class EncoderWatch:
    """What the worker's encoder cache holds, step by step (see the module)."""

    def __init__(self) -> None:
        # Request id -> its items (identifier, offset, length), as handed over.
        self.items: dict[str, tuple[tuple[str, int, int], ...]] = {}
        # Identifier -> the step whose output had the worker compute it.
        self.held: dict[str, int] = {}
        # Identifier -> the step whose output freed it.
        self.freed: dict[str, int] = {}

    def holds_past(self, request_id: str, computed: int) -> bool:
        """Whether the cache holds the output of an item of ``request_id``
        placed wholly past ``computed`` while it lacks that of the first item
        not yet wholly computed (what the request needs next)."""
        pending = [(o, i) for i, o, n in self.items.get(request_id, ()) if o + n > computed]
        if not pending:
            return False
        pending.sort()
        return pending[0][1] not in self.held and any(i in self.held for o, i in pending[1:] if o >= computed)

    def needs_uncached(self, request_id: str, computed: int) -> bool:
        """Whether the first item of ``request_id`` not yet wholly computed
        past ``computed`` has no output in the cache (the request cannot go
        on before the encoder runs it, and that needs room)."""
        pending = sorted((o, i) for i, o, n in self.items.get(request_id, ()) if o + n > computed)
        return bool(pending) and pending[0][1] not in self.held

    def step(self, out: Any, step: int) -> tuple[MissingEncoderOutput, ...]:
        """The worker runs ``out`` (scheduled at ``step``): each item output
        a scheduled request's positions need that the cache lacks."""
        for new in out.scheduled_new_reqs:
            features = getattr(new, "mm_features", None) or ()
            self.items[new.req_id] = tuple(
                (f.identifier, f.mm_position.offset, f.mm_position.length) for f in features)
        for identifier in getattr(out, "free_encoder_mm_hashes", None) or ():
            if self.held.pop(identifier, None) is not None:
                self.freed[identifier] = step
        for rid, inputs in (getattr(out, "scheduled_encoder_inputs", None) or {}).items():
            items = self.items.get(rid, ())
            for index in inputs:
                if index < len(items):
                    self.held[items[index][0]] = step
                    self.freed.pop(items[index][0], None)
        missing = []
        starts = computed_before(out)
        for rid, count in out.num_scheduled_tokens.items():
            start = starts.get(rid)
            if start is None:
                continue
            end = start + count
            for index, (identifier, offset, length) in enumerate(self.items.get(rid, ())):
                if offset < end and start < offset + length and identifier not in self.held:
                    missing.append(MissingEncoderOutput(rid, index, identifier, (offset, length), (start, end),
                                                        self.freed.get(identifier)))
        for rid in getattr(out, "finished_req_ids", None) or ():
            self.items.pop(rid, None)
        return tuple(missing)
