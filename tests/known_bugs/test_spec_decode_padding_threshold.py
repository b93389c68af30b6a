"""Known vLLM bug: a waiting request padded to a uniform spec-decode step is
cut by ``long_prefill_token_threshold`` and ``schedule()`` asserts.

Found by: ``no-exception`` in the scheduler state machine once it speculated
(ngram, k=1, ``long_prefill_token_threshold=1``), 2026-12-01.

Analysis (vLLM 0.33.0, ``vllm/v1/core/sched/scheduler.py``):

- In the waiting loop, a request with one token left to compute
  (``num_new_tokens == 1``: a prefix-cache or connector hit of all but the
  last token, or a resumed request) and something already computed or
  running is padded "to uniform spec decoding size":
  ``num_new_tokens = 1 + num_spec_tokens``, ``pad_spec_decode = True``
  (lines 1311-1330).
- Right after, ``if 0 < long_prefill_token_threshold < num_new_tokens:
  num_new_tokens = long_prefill_token_threshold`` (line 1332) cuts it back
  whenever the threshold is below ``1 + num_spec_tokens`` and more than one
  request is eligible (the threshold applies only then, line 759).
- The Mamba split that can also shorten it drops the padding (lines
  1359-1370); the threshold cut does not, so ``assert num_new_tokens == 1 +
  self.num_spec_tokens`` (line 1579) fails and the engine core dies.

Reach: a real engine. ``--long-prefill-token-threshold`` <= k with
``--speculative-config`` (vLLM validates neither against the other), prefix
caching on, two requests eligible, one of them admitted with all but its
last token cached. No connector needed. Pinned with ngram: an EAGLE drafter
drops the trailing cached block, so its local hits leave a block to compute
(the control below runs it too); a connector hit or a resumed request would
bring it to the same padding (not pinned here). Release 0.33.0 checked; older releases not checked here.

Upstream: vllm-project/vllm PR 54028 (open, 2026-08-27) reports the same cut
on a GPU engine (ngram, k=3, threshold 2: two identical greedy requests
diverge) and proposes skipping the padding when the threshold cannot hold it.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the ``spec-decode-padding-cut-by-long-prefill-threshold`` entry of
fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.scheduler import check_no_exception_escapes
from tests.known_bugs._pin import known_vllm_bug, shown_as
from tests.known_bugs.runs import padded_second_admission

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_threshold_above_the_padding_is_fine(method: str) -> None:
    """The control: a threshold of 1 + k leaves the padded step whole."""
    check_no_exception_escapes(padded_second_admission(method, threshold=3))


@known_vllm_bug("vLLM bug spec-decode-padding-cut-by-long-prefill-threshold (fuzz/known_bugs.py)")
def test_padded_spec_decode_admission_survives_the_threshold() -> None:
    step = padded_second_admission("ngram", threshold=2)
    with shown_as("spec-decode-padding-cut-by-long-prefill-threshold", step.describe):
        check_no_exception_escapes(step)
