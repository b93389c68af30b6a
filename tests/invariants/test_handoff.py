"""The connector hand-off (invariants/handoff.py) and the scripted store's
keys, on fixed runs.

``hands_off_one_block_short`` is shown caught by its claim on its fixed run
(``FIXED_RUNS``, tests/invariants/test_scheduler_planted.py); here, that
every other claim misses it, that a sliding window's dropped blocks are
handed as the null block and accepted, and that the connector's own store
serves saved KV only to the namespace that computed it.
"""

from __future__ import annotations

import pytest

from fuzz.model import saved_prefix
from fuzz.adapter import FIXED_RUNS, SchedulerHarness, planted_scheduler_bug
from fuzz.adapter._connector import ConnectorScript
from fuzz.runners.scheduler import run_fixed
from fuzz.targets.target_scheduler import UNSUPPORTED
from fuzz.model import ExternalReply, LayoutDraw, SchedulerDraw, SpecDraw, distinct_prompts
from invariants.handoff import HANDS_UNHELD_KV, check_hand_off_names_computed_blocks
from invariants.scheduler import ADMISSION_CHECKS, STEP_CHECKS, step_violations

pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")

OTHERS = tuple(c for c in STEP_CHECKS + ADMISSION_CHECKS if c is not check_hand_off_names_computed_blocks)


def test_a_hand_off_one_block_short_is_missed_by_every_other_claim() -> None:
    """Planted, each finished request's last block is left out of what
    request_finished names: the producer would send 8 of its 12 computed
    tokens. No other claim reads the hand-off, so every one stays silent."""
    with planted_scheduler_bug("hands_off_one_block_short"):
        stepper = run_fixed(FIXED_RUNS["hands_off_one_block_short"], OTHERS)
    assert not stepper.harness.live_request_ids


def test_a_window_hands_its_dropped_blocks_as_null() -> None:
    """An 8-token sliding window beside full attention (4-token blocks) on
    a producer: a 10-token prompt decoding 12 tokens finishes at 21 computed
    tokens; its window group no longer needs blocks 0-2 (positions below
    21 - 8 + 1 = 14 but 12, 13 share block 3), which vLLM frees before the
    hand-off and names as the null block. The full-attention group is handed
    all 6 blocks. The claim accepts the nulls and judges the rest."""
    config = SchedulerDraw(
        LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 8),))),
                   hash_block_size=4, num_blocks=33),
        max_num_batched_tokens=32, max_num_seqs=2, kv_role="kv_producer")
    harness = SchedulerHarness(config)
    harness.add_request(tuple(range(10)), max_tokens=12)
    steps = harness.drain(context="window hand-off")
    (hand_off,) = [f.hand_off for s in steps for f in s.connector_finishes]
    assert hand_off is not None and hand_off.num_computed_tokens == 21, hand_off
    null = harness.null_block_id
    full, window = hand_off.handed
    assert len(full) == 6 and null not in full, hand_off.describe()
    assert window[:3] == (null,) * 3 and null not in window[3:], hand_off.describe()
    found = [str(v) for s in steps for v in step_violations(s, (check_hand_off_names_computed_blocks,))]
    assert not found, "\n\n".join(found)


TOKENS = tuple(range(100, 130))
ONE_GROUP = SchedulerDraw(LayoutDraw((SpecDraw("FullAttentionSpec", 4),), hash_block_size=4, num_blocks=32),
                          max_num_batched_tokens=32)


def test_the_store_serves_saved_kv_to_its_own_namespace_only() -> None:
    """Tenant a's 14-token request finishes (12 tokens saved, in whole
    blocks of 4); its blocks leave the local cache. The same 20-token prompt
    sent by tenant b and by an unsalted client is answered 0, where a store
    keyed by bare tokens would serve both 12 (tenant a's KV); tenant a's own
    resend is answered 12."""
    harness = SchedulerHarness(ONE_GROUP)
    harness.add_request(TOKENS[:14], max_tokens=1, cache_salt="tenant-a")
    harness.drain(context="save")
    assert harness.script.saved == [("tenant-a", TOKENS[:12])]
    # A store keyed by the tokens alone would serve any client those 12.
    assert saved_prefix([tokens for _, tokens in harness.script.saved], TOKENS[:20], 4) == 12
    harness.evict_shortcut({b.block_id for b in harness.pool.blocks if b.block_hash is not None})
    asked = {
        harness.add_request(TOKENS[:20], max_tokens=1, reply=ExternalReply("saved"), cache_salt=salt): salt
        for salt in ("tenant-b", None, "tenant-a")
    }
    harness.drain(context="reload")
    answers = {asked[q.request_id]: q.reply for q in harness.script.queries if q.request_id in asked}
    assert answers == {"tenant-b": 0, None: 0, "tenant-a": 12}, answers


def test_the_store_keys_an_image_from_its_placeholder_on() -> None:
    """An image whose placeholder starts at token 6 names every block from
    the one it starts in: KV saved with it serves a request without it (or
    with another image there) only the first block, and a request with the
    same image all four."""
    store = ConnectorScript(save_unit=4)
    store.save(TOKENS[:16], "mm:image-a@6")
    assert store.saved_prefix(TOKENS[:16], "") == 4
    assert store.saved_prefix(TOKENS[:16], "mm:image-b@6") == 4
    assert store.saved_prefix(TOKENS[:16], "mm:image-a@6") == 16
    assert store.saved_prefix(TOKENS[:16], "tenant-a+mm:image-a@6") == 0


def test_a_mamba_request_rolled_back_by_a_failed_load_hands_no_state_and_is_the_known_bug() -> None:
    """Pinned from a campaign on unmodified vLLM: a lone Mamba group
    (1-token blocks), a 3-token prompt whose 2-token sync load is reported
    failed (recompute). vLLM rolls the request back to 1, where no state
    exists (the load's start, 0, is the only valid point), and when it is
    aborted it hands the connector [null, 1, 2]: index 0, where the state at
    1 belongs, is the null block. The claim blames the rollback, and the
    failure is the known bug mamba-failed-load-rollback."""
    from fuzz.known_bugs import failure_of, match
    from fuzz.adapter import VLLM_VERSION

    config = SchedulerDraw(LayoutDraw((SpecDraw("MambaSpec", 1),), hash_block_size=1, num_blocks=32),
                           max_num_batched_tokens=32, kv_load_failure_policy="recompute")
    harness = SchedulerHarness(config)
    rid = harness.add_request((5, 6, 7), max_tokens=4, reply=ExternalReply("store", store_len=2))
    harness.fail_next_sync_loads()
    steps = [harness.step()]
    assert harness.num_computed_tokens(rid) == 1
    harness.abort(rid)
    steps.append(harness.step())  # the abort's finish call is observed with the next step
    (violation,) = [v for s in steps for v in step_violations(s, (check_hand_off_names_computed_blocks,))]
    assert (violation.state, violation.where) == (HANDS_UNHELD_KV, "Scheduler._update_requests_with_invalid_blocks")
    bug = match(failure_of(violation), VLLM_VERSION)
    assert bug is not None and bug.id == "mamba-failed-load-rollback", violation


def test_a_request_preempted_and_admitted_again_in_one_step_keeps_its_new_blocks() -> None:
    """schedule() preempts in its running loop before its waiting loop admits:
    a request both preempted and allocated again by one output holds the new
    allocation (met by a 600 s campaign on unmodified vLLM: an async load
    admitted right after a preemption, then failed, handed blocks the record
    had dropped)."""
    from fuzz.adapter._contents import BlockContents
    from fuzz.adapter._handoff import HandOffWatch
    from fuzz.model import ConnectorAlloc, GroupInfo

    class Cached:
        req_ids: tuple[str, ...] = ()

    class Output:
        preempted_req_ids = {"r1"}
        scheduled_new_reqs = ()
        scheduled_cached_reqs = Cached()
        finished_req_ids = ()

    group = GroupInfo(index=0, spec_class="FullAttentionSpec", inner_classes=(), block_size=4, prefix_cacheable=True)
    watch = HandOffWatch(BlockContents([4], [True], null_block_id=0), {}, (group,), (("full", 0),), (True,))
    alloc = ConnectorAlloc(request_id="r1", num_tokens=12, block_ids=((6, 4, 7),), num_external_tokens=12,
                           alloc_local_tokens=0, alloc_external_tokens=12, asked_with=0, reply=12, reply_async=True)
    watch.take(Output(), (alloc,))
    assert watch.recorded("r1") == ((6, 4, 7),)
