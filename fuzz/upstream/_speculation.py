"""Speculative decoding in an upstream-form repro: the drafter the run's
scheduler was built with, stated with vLLM's test helpers, and the drafts
the engine hands over after a synchronous step.

* ngram: ``create_scheduler``'s own ``num_speculative_tokens`` (its
  drafter needs no model);
* EAGLE: a ``SpeculativeConfig`` on a draft model of the tests tree's
  cache (the scheduler reads only its config), on legacy block hashes,
  as under any KV connector: the scheduler then drops a hit's last block
  (``use_eagle_block_drop``) and reserves k lookahead slots a step. The
  suite's scheduler always has a connector; one that never acted in the run
  (matched nothing, loaded nothing, reported nothing) is left out of the
  file, which states the legacy hashes it brought instead (its deferred
  frees under async scheduling are left out with it: the run in vLLM's
  tree shows whether the file still fails as the run did).
"""

from __future__ import annotations

from typing import Any

from fuzz.model import FedOutput, OpLog

__all__ = ["connector_stands_in", "draft_lines", "speculation_args", "unstated"]


def connector_stands_in(log: OpLog) -> bool:
    """Whether the run's connector is only the legacy block hashes of an
    EAGLE run (it never acted): the file states those and no connector."""
    draw = log.config.draw
    if not draw.connector or draw.speculative_method != "eagle" or draw.kv_role != "kv_both":
        return False
    if any(add.reply is not None for add in log.requests):
        return False
    if any(a.answer != 0 or a.load_async for step in log.steps for a in step.answers):
        return False
    fed = [step.fed for step in log.steps if step.fed is not None]
    return not any(o.finished_recving or o.failed_recving or o.invalid_block_ids or o.finished_sending for o in fed)


def unstated(log: OpLog) -> str | None:
    """What of the run's drafter a file cannot state (None: all of it):
    another method, a connector beside it (the file's helpers build
    connectors without drafters), an EAGLE run without one (vLLM then
    hashes a token past each block, which the run's requests were not)."""
    draw = log.config.draw
    if draw.speculative_method is None:
        return None
    if draw.speculative_method not in ("ngram", "eagle"):
        return f"{draw.speculative_method} speculation"
    if draw.connector and not connector_stands_in(log):
        return f"{draw.speculative_method} speculation with a connector"
    if draw.speculative_method == "eagle" and not draw.connector:
        return "EAGLE speculation on lookahead block hashes"
    return None


def speculation_args(f: Any, log: OpLog) -> list[str]:
    """``create_scheduler``'s arguments for the run's drafter (the lines
    an EAGLE config needs go into the test first); none where it has none."""
    draw = log.config.draw
    k = draw.num_speculative_tokens
    if draw.speculative_method == "ngram":
        return [f"num_speculative_tokens={k}"]
    if draw.speculative_method != "eagle":
        return []
    f.need("vllm.config", "ModelConfig", "ParallelConfig", "SpeculativeConfig")
    f.body += [
        f"    # An EAGLE drafter (k = {k}) on legacy block hashes (as under any KV connector):",
        "    # the scheduler drops a hit's last block and reserves k lookahead slots a step.",
        "    speculative_config = SpeculativeConfig(",
        f'        method="eagle", model="hmellor/tiny-random-LlamaForCausalLM", num_speculative_tokens={k},',
        f'        target_model_config=ModelConfig(model="facebook/opt-125m", max_model_len={log.config.max_model_len}),',
        "        target_parallel_config=ParallelConfig(), disable_lookahead_block_hashes=True,",
        "    )",
    ]
    return ["speculative_config=speculative_config"]


def draft_lines(f: Any, fed: FedOutput) -> list[str]:
    """``update_draft_token_ids`` with the drafter's proposals handed over
    right after ``fed`` (``EngineCore.post_step``); none where none were."""
    if not fed.drafts:
        return []
    f.need("vllm.v1.outputs", "DraftTokenIds")
    ids = ", ".join(f'"{r}"' for r, _ in fed.drafts)
    return [f"    scheduler.update_draft_token_ids(DraftTokenIds([{ids}], {[list(d) for _, d in fed.drafts]!r}))"]
