"""Cold reference server: ``python -m engine._cold MODEL_DIR``.

Runs vLLM on the same tiny model with prefix caching off and no connector, in
its own process (vLLM keeps the KV connector in a process-wide global, so a
second engine in the harness's process would inherit the first one's
connector). Reads JSON lines ``{"prompts": [[ids...], ...], "max_tokens": n}``
on stdin; answers one line per request batch, prefixed with ``@@COLD@@ `` so
vLLM's own logging on stdout is skipped by the client.
"""

from __future__ import annotations

import json
import os
import sys

MARK = "@@COLD@@ "
TOP_K = 2


def main(model_dir: str) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    from engine.harness import cold_llm_kwargs

    llm = LLM(**cold_llm_kwargs(model_dir))
    print(MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        sp = SamplingParams(
            max_tokens=req["max_tokens"], temperature=0.0, logprobs=TOP_K, ignore_eos=True, detokenize=False
        )
        outs = llm.generate([{"prompt_token_ids": p} for p in req["prompts"]], sp, use_tqdm=False)
        answer = []
        for o in outs:
            c = o.outputs[0]
            answer.append(
                {
                    "token_ids": list(c.token_ids),
                    "top": [{str(t): lp.logprob for t, lp in step.items()} for step in c.logprobs],
                }
            )
        print(MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
