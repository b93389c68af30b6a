"""What ``update_from_output`` does with a model runner's output: a stale
output of a preempted request is dropped where the scheduler says it drops
them, and rejected drafts leave ``num_computed_tokens``. Both are step
checks of :mod:`invariants.scheduler`'s list."""

from __future__ import annotations

from fuzz.model import Fact, InvariantViolation, StaleOutput, StepObservation

__all__ = ["check_rejected_drafts_rolled_back", "check_stale_output_dropped"]


def check_stale_output_dropped(step: StepObservation) -> None:
    """A request preempted while a step that scheduled it was still running
    (async scheduling) gets none of that step's sampled tokens when the
    scheduler drops stale output: its ``num_tokens`` is unchanged by that
    ``update_from_output``. vLLM drops it when its connector hands KV off
    (``_preempt_request(..., drop_stale_output=self.requires_kv_delivery)``;
    ``KVConnectorBase_V1.requires_kv_delivery`` is the producer role, so
    ``kv_producer`` and ``kv_both``): the preemption freed the blocks that
    output's KV was in, and the resumed request samples those positions
    again, so a delivered token would be appended twice."""
    for stale in step.stale_outputs:
        if stale.drops and stale.num_tokens_after != stale.num_tokens_before:
            raise InvariantViolation(
                "stale-output-dropped",
                f"request {stale.request_id} was preempted at step {stale.preempted_at}, after step "
                f"{stale.fed_step} scheduled it; update_from_output of step {stale.fed_step}'s output "
                f"(sampled {list(stale.sampled)}) took its num_tokens from {stale.num_tokens_before} to "
                f"{stale.num_tokens_after}, though the scheduler drops stale output "
                f"(requires_kv_delivery)\n{step.describe()}"
                + (f"\n  scenario: {step.context}" if step.context else ""),
                where="Scheduler.update_from_output",
                facts=(Fact("num-tokens", (stale.request_id, _dropped_why(stale)), stale.num_tokens_after,
                            stale.num_tokens_before),),
            )


def _dropped_why(stale: StaleOutput) -> str:
    return (f"schedule() preempted it at step {stale.preempted_at}, after step {stale.fed_step} sampled "
            f"{list(stale.sampled)} for it: the scheduler drops that stale output (requires_kv_delivery)")


def check_rejected_drafts_rolled_back(step: StepObservation) -> None:
    """Speculative decoding: a running request whose k scheduled drafts the
    fed output verified with a accepted counts the k - a rejected positions
    as computed no longer: ``update_from_output`` takes its
    ``num_computed_tokens`` down by exactly k - a. (Those positions hold the
    rejected drafts' KV; counted, the next step would start past tokens that
    were never computed, and the blocks kept would not match.) Requests
    whose load failed in the step, or that are no longer RUNNING (finished),
    or whose share of the output is stale (preempted while it was in
    flight, a prefix-cache reset's preemption included, which the same
    ``schedule()`` may admit again: a stale rejection vLLM leaves alone),
    make no claim."""
    failed = {f.request_id for f in step.failed_loads}
    stale = {s.request_id for s in step.stale_outputs}
    for v in step.draft_verifications:
        if v.status_after != "RUNNING" or v.request_id in failed or v.request_id in stale:
            continue
        if v.computed_before - v.computed_after != v.num_rejected:
            raise InvariantViolation(
                "rejected-drafts-rolled-back",
                f"step {step.step}: update_from_output() verified {v.num_drafts} drafts of request "
                f"{v.request_id} and accepted {v.num_accepted}, so {v.num_rejected} positions must leave "
                f"num_computed_tokens; it went {v.computed_before} -> {v.computed_after} "
                f"(down by {v.computed_before - v.computed_after})\n{step.describe()}"
                + (f"\n  scenario: {step.context}" if step.context else ""),
                where="Scheduler.update_from_output",
                # The drop the runner's verdict asks for: its rejections, counted by the model runner.
                facts=(Fact("rolled-back", (v.request_id, v.num_drafts, v.num_accepted),
                            v.computed_before - v.computed_after, v.num_rejected),),
            )
