"""Known vLLM bug, fixed in 0.33.0: a request with
``SamplingParams(skip_reading_prefix_cache=True)`` still takes the KV
connector's external hit.

Found by: ``skip-reads-no-cache`` on vLLM 0.28.0, in the 2026-12-01 defaults
bugbench run (two ``second-full-attention-untrimmed`` trials met it 16 times).

Analysis: the flag (set for ``prompt_logprobs`` and pooling token tasks) means
"compute every prompt token". ``KVCacheManager`` honours it for the local
prefix cache on every release here, but the 0.28.0 scheduler adopts the
connector's ``get_num_new_matched_tokens`` answer unconditionally, so the
request loads external KV for the rows whose logits it needs. 0.33.0 replaces
the answer with ``(0, False)`` (scheduler.py:1143): upstream PR 57269
(merged 2026-09-17), which reports shorter ``prompt_logprobs`` lists and a
decode-side ``OverflowError`` in P/D with NIXL, LMCache and Mooncake. Which
release between 0.29.0 and 0.32.x first has the fix is not checked (not
installed here).

Reach: a real engine (any connector that answers from a store, a
``prompt_logprobs`` request).

The test is a strict xfail on the releases the registry says have the bug
and a plain test on the others, so it checks the fix as well as the bug:
``python -m pytest`` with ``.cache/vllm-envs/0.28.0`` first on
``PYTHONPATH`` runs the xfail side.
"""

from __future__ import annotations

import pytest

from fuzz import adapter
from fuzz.known_bugs import KNOWN_BUGS, known_bug
from fuzz.model import ExternalReply, InvariantViolation, LayoutDraw, SpecDraw
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.scheduler import check_skipping_request_reads_no_cache
from tests.known_bugs._pin import known_vllm_bug
from tests.support.harnesses import harness_of

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

BUG = known_bug("skip-reading-prefix-cache-takes-connector-hit")
AFFECTED = BUG.affects(adapter.VLLM_VERSION)
PROMPT = list(range(0, 140, 7))  # 20 tokens


def _skipping_admission():  # type: ignore[no-untyped-def]
    """One full-attention group of block 4, nothing cached locally; the
    store holds all 20 tokens of a request that asks to skip the prefix
    cache."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=20)
    harness = harness_of(layout, batch=32, seqs=2)
    rid = harness.add_request(PROMPT, max_tokens=1, reply=ExternalReply("store", store_len=20),
                              skip_reading_prefix_cache=True)
    step = harness.step()
    (adm,) = [a for a in step.admissions if a.request_id == rid]
    return adm


@known_vllm_bug(f"vLLM {adapter.VLLM_VERSION}: a skipping request takes the connector's hit", affected=AFFECTED)
def test_a_skipping_request_takes_no_external_hit() -> None:
    check_skipping_request_reads_no_cache(_skipping_admission())


@pytest.mark.skipif(not AFFECTED, reason=f"vLLM {adapter.VLLM_VERSION} has the fix")
def test_the_failure_is_the_registered_known_bug() -> None:
    with pytest.raises(InvariantViolation) as caught:
        check_skipping_request_reads_no_cache(_skipping_admission())
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == BUG.id
