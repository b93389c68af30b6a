"""Known vLLM bug: with a connector that takes divergent local hybrid hits,
a second full-attention-type group whose cached blocks were evicted is left
short of the local hit, and ``truncate_computed_blocks`` asserts inside
``schedule()``.

Found by: ``no-exception`` in the scheduler state machine (the 10-minute
default coverage campaign, seed 1, 2026-12-01), shrunk to three requests.

Analysis (vLLM 0.33.0):

- ``Scheduler._get_local_prefix_cache_hit`` calls
  ``KVCacheManager.get_computed_blocks_for_connector`` when the connector
  ``supports_divergent_local_hybrid_hits`` (NIXL, MoRI-IO). On a hybrid
  (Mamba) layout it looks every group up on its own
  (``find_longest_cache_hit_per_group``) and reports the hit of
  ``coordinator.full_attention_group_id``, the *first* full-attention-type
  group, as the local prefix; any group with a shorter hit only sets
  ``hit_diverged``. Its docstring's premise is that the lagging group is the
  Mamba one, whose state the connector transfers whatever the local prefix.
- A second full-attention-type group (another ``FullAttentionSpec`` block
  size, MLA, a hidden-state cache: ``isinstance(spec, FullAttentionSpec)``)
  can lag too: the pool evicts each group's blocks on its own. Here group 2
  (``FullAttentionSpec``, block 16) holds no block of the prompt while group
  0 (block 4) holds 13, so the local hit is 52 tokens with group 2 empty.
- With an external answer (15 tokens from 48), ``hit_diverged`` does not fall
  back (the fallback runs only when there are no external tokens), and the
  sub-block tail branch truncates the lookup to the block-aligned 48:
  ``truncate_computed_blocks`` needs 3 blocks of group 2, finds 0, and
  ``assert num_blocks <= len(group_blocks)`` fails. The engine core dies.
  The tokens ``[0, 48)`` of group 2 are neither local nor part of the load
  (which starts at 48); a block-aligned local hit skips this truncation, and
  what the scheduler then makes of group 2 was not checked here.

Reach: scheduler-API. The layout (two full-attention-type groups beside a
Mamba group, in separate lookup entries) is drawn directly; no engine path
this suite models builds it (a hybrid target with a drafter or hidden-state
cache of another page size might; not shown). The connector capability is
NIXL's. The control: the same run with a connector without the capability
(``get_computed_blocks`` reconciles every group) does not fail.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the ``second-attention-group-lags-divergent-connector-hit`` entry of
fuzz/known_bugs.py.
"""

from __future__ import annotations

import pytest

from fuzz.known_bugs import KNOWN_BUGS
from fuzz.model import InvariantViolation
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.scheduler import check_no_exception_escapes
from tests.known_bugs._pin import known_vllm_bug
from tests.known_bugs.runs import readmitted_after_a_failed_load

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


@known_vllm_bug("vLLM 0.33.0: a lagging second full-attention group reaches truncate_computed_blocks short of the hit")
def test_a_lagging_second_attention_group_is_readmitted_without_a_crash() -> None:
    check_no_exception_escapes(readmitted_after_a_failed_load(divergent_hits=True))


def test_control_a_connector_without_divergent_hits_reconciles_every_group() -> None:
    step = readmitted_after_a_failed_load(divergent_hits=False)
    check_no_exception_escapes(step)


def test_the_crash_is_the_registered_known_bug() -> None:
    step = readmitted_after_a_failed_load(divergent_hits=True)
    with pytest.raises(InvariantViolation) as caught:
        check_no_exception_escapes(step)
    assert caught.value.frames[0].endswith(":KVCacheManager.truncate_computed_blocks"), caught.value.frames
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "second-attention-group-lags-divergent-connector-hit"
