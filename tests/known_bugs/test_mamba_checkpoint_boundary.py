"""Known vLLM bug ``mamba-checkpoint-chunk-skips-boundary-state`` (0.33.0).

Align mode keeps one Mamba state per block: the state after exactly the
block's last token. ``Scheduler._mamba_block_aligned_split`` therefore stops
a prefill chunk that starts mid-block at the next block boundary, but not
when the group exports prefill checkpoints (Mamba2): it assumes the worker
materialises the boundary's state inside the chunk. The worker exports one
checkpoint per chunk, at the prefill's last hash boundary
(``compute_mamba_prefill_checkpoints``), so after a sub-block hit the block
the request resumed in keeps the state at the resume point, and once the
request computes past it ``MambaManager`` caches it as the state at the
block's end. A later request sharing that prefix resumes from a state some
tokens short: silent corruption of its recurrent state.

Reach: a real engine (the engine-reachable target found it on a NemotronH
plan: full attention and Mamba2 of 48-token blocks, a 4-token hash unit).
Upstream: described first in a review comment on vLLM PR 54076
(2026-09-03), with a fix planned in the follow-up PR 53479; both open.

Control: the same requests on a Mamba group without prefill checkpoints
(its chunks stop at the block boundary) keep every cached state where its
key says.

Strict xfail: this turns red the day vLLM fixes it; then set ``fixed_in`` on
the registry entry in fuzz/known_bugs.py.
"""

from __future__ import annotations


import pytest

from fuzz.known_bugs import KNOWN_BUGS
from fuzz.model import InvariantViolation
from fuzz.targets.target_scheduler import UNSUPPORTED
from invariants.contents import check_reads_written
from tests.known_bugs._pin import known_vllm_bug
from tests.known_bugs.runs import checkpointed_prompts

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")


@known_vllm_bug("vLLM: a Mamba2 chunk resuming mid-block runs past the block's end, and the block is cached "
                "as the state at that end (PR 54076's review, PR 53479)")
def test_a_cached_mamba_block_holds_the_state_at_its_end() -> None:
    checkpointed_prompts(checkpoints=True)


def test_without_checkpoints_every_cached_state_is_where_its_key_says() -> None:
    assert checkpointed_prompts(checkpoints=False).is_idle()


def test_the_misplaced_state_is_the_registered_known_bug() -> None:
    with pytest.raises(InvariantViolation) as caught:
        checkpointed_prompts(checkpoints=True)
    assert caught.value.invariant == "index-written", str(caught.value)
    assert "the first 96 tokens names block" in str(caught.value) and "(92, " in str(caught.value), str(caught.value)
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "mamba-checkpoint-chunk-skips-boundary-state"


def test_the_state_read_back_is_the_registered_known_bug() -> None:
    """Checked by reads-written alone: the third request resumes at 96 from
    the block holding the state at 92."""
    with pytest.raises(InvariantViolation) as caught:
        checkpointed_prompts(checkpoints=True, checks=(check_reads_written,))
    assert "computing from position 96" in str(caught.value), str(caught.value)
    (bug,) = [b for b in KNOWN_BUGS if b.shows_in_every(caught.value)]
    assert bug.id == "mamba-checkpoint-chunk-skips-boundary-state"
