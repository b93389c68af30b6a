"""What a model runner hands back to the scheduler, one definition for the
harness (:mod:`fuzz.adapter`) and the repro files alike."""

from __future__ import annotations

from vllm.v1.outputs import ModelRunnerOutput


def model_runner_output(req_ids, sampled, connector_output):
    """What a model runner returns for the batch ``req_ids``: each request's
    sampled tokens (none for a partial prefill chunk) and the connector's
    worker reports (None when it has none)."""
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
        kv_connector_output=connector_output,
    )
