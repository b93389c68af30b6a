"""What the encoder cache promises: every multimodal output a step reads is there.

The record is the worker's own (``fuzz/adapter/_encoder.py``): the items
each request was handed over with, the outputs each step's
``scheduled_encoder_inputs`` computed and its ``free_encoder_mm_hashes``
freed, never vLLM's ``EncoderCacheManager``.
"""

from __future__ import annotations

from fuzz.model import Fact, Instance, InvariantViolation, StepObservation
from fuzz.model._encoder import MissingEncoderOutput

__all__ = ["ENCODER_OUTPUT_MISSING", "check_encoder_outputs_held"]

ENCODER_OUTPUT_MISSING = "an encoder output read after it was freed or never computed"
_WHERE = "Scheduler._try_schedule_encoder_inputs"


def check_encoder_outputs_held(step: StepObservation) -> None:
    """Every position of a multimodal placeholder a step computes reads its
    item's encoder output from the worker's cache: the step computes that
    output (``scheduled_encoder_inputs``), or an earlier step did and no
    output since told the worker to free it. The scheduler schedules an
    encoder run only for items its cache manager does not hold, and frees
    an output (``free_encoder_mm_hashes``) only once no request references
    it; an output freed while a request still reads it is read as whatever
    the worker's cache holds there."""
    if not step.missing_encoder_outputs:
        return
    raise InvariantViolation(
        "encoder-outputs-held",
        "\n".join(m.describe() for m in step.missing_encoder_outputs)
        + f"\n{step.describe()}"
        + (f"\n  scenario: {step.context}" if step.context else ""),
        where=_WHERE,
        state=ENCODER_OUTPUT_MISSING,
        # One instance per output read: its request (the encoder cache is no KV-cache group).
        instances=tuple(Instance(ENCODER_OUTPUT_MISSING, requests=(m.request_id,))
                        for m in step.missing_encoder_outputs),
        facts=tuple(_fact(m) for m in step.missing_encoder_outputs),
    )


def _fact(missing: MissingEncoderOutput) -> Fact:
    """The scheduler's call on the item: not freed at the step the worker
    was told to free it, or an encoder run scheduled where none held it."""
    if missing.freed_at is not None:
        return Fact("encoder-freed", (missing.identifier, missing.request_id, missing.placeholder), True, False,
                    step=missing.freed_at, after="schedule")
    return Fact("encoder-scheduled", (missing.request_id, missing.item), False, True, after="schedule")
