"""Planted bugs: deliberately wrong vLLM code, swapped in for the duration of
a self-test or a benchmark, to prove each invariant can fail.

Two families:

* truncation variants (:data:`PLANTED_TRUNCATE_BUGS`): a wrong
  ``KVCacheManager.truncate_computed_blocks``;
* scheduler edits (:data:`PLANTED_SCHEDULER_BUGS`): ``Scheduler.schedule``
  recompiled from its own source with one small edit, so the bug lives on
  the path the real one would; the connector-path edits
  (:data:`_CONNECTOR_EDITS`) do the same to ``Scheduler.schedule`` or to the
  scheduler method that calls the connector, each breaking one rule of the
  KV-connector protocol (:mod:`invariants.connector`); the ownership edits
  (:data:`PLANTED_OWNERSHIP_BUGS`) recompile one method of vLLM's block
  bookkeeping (single-type managers) the same way, each breaking one
  block-ownership rule (:mod:`invariants.ownership`); the manager edits
  (``_MANAGER_EDITS``) recompile a ``KVCacheManager`` method the same way
  (its prefix-cache gate for requests that skip reading the cache); the
  sibling edits (:data:`SIBLING_PLANTS`) break a known vLLM bug's claim in
  another group or state, to show a campaign sets aside only the real bug.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import linecache
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

from fuzz.adapter import _compat
from fuzz.adapter._env import VLLM_VERSION
from fuzz.model import ExternalReply, FixedPrompt, FixedRun, LayoutDraw, SchedulerDraw, SpecDraw, distinct_prompts

import vllm.v1.kv_cache_interface as _ki  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

_REAL_TRUNCATE = KVCacheManager.truncate_computed_blocks

__all__ = [
    "FIXED_RUNS",
    "PLANTED_OWNERSHIP_BUGS",
    "PLANTED_SCHEDULER_BUGS",
    "PLANTED_TRUNCATE_BUGS",
    "SIBLING_PLANTS",
    "SPECULATING",
    "planted_scheduler_bug",
    "planted_truncate_bug",
]


def _variant(
    *,
    clamp: str = "mamba",  # "mamba" (the fix), "none" (pre-fix), "all" (blanket min)
    check_alignment: bool = True,
    mutate_input: bool = False,
    touch_refcounts: bool = False,
    mamba_keeps_all: bool = False,
    shifted: bool = False,
    scratch_gets_null: bool = False,
    leaks_block: bool = False,
) -> Callable[[KVCacheManager, KVCacheBlocks, int], KVCacheBlocks]:
    def truncate(self: KVCacheManager, blocks: KVCacheBlocks, n: int) -> KVCacheBlocks:
        out: list[list[Any]] = []
        for group_blocks, mgr, group in zip(
            blocks.blocks,
            self.coordinator.single_type_managers,
            self.kv_cache_config.kv_cache_groups,
            strict=True,
        ):
            spec = group.kv_cache_spec
            if not _compat.prefix_cacheable(spec):
                out.append([self.block_pool.null_block] if scratch_gets_null else [])
                continue
            if check_alignment:
                assert n % mgr.block_size == 0
            keep = n // mgr.block_size
            is_mamba = isinstance(spec, _ki.MambaSpec)
            if clamp == "all" or (clamp == "mamba" and is_mamba):
                keep = min(keep, len(group_blocks))
            else:
                assert keep <= len(group_blocks)
            if is_mamba and mamba_keeps_all:
                keep = len(group_blocks)
            view = list(group_blocks[1 : keep + 1] if shifted else group_blocks[:keep])
            if shifted and len(view) < keep:
                view = list(group_blocks[:keep])[::-1]
            if mutate_input and isinstance(group_blocks, list):
                del group_blocks[keep:]
            if touch_refcounts:
                for b in view:
                    if not b.is_null:
                        b.ref_cnt += 1
            out.append(view)
        if leaks_block and self.block_pool.get_num_free_blocks() > 0:
            self.block_pool.get_new_blocks(1)
        return self.create_kv_cache_blocks(tuple(out))

    return truncate


def _drops_eagle_block_again(self: KVCacheManager, blocks: KVCacheBlocks, n: int) -> KVCacheBlocks:
    """vLLM's truncation, then the EAGLE last-block drop again on the draft
    groups (the lookup already took it). It differs from vLLM only when the
    manager was built with ``use_eagle``, so only scenarios that speculate
    can find it."""
    result = _REAL_TRUNCATE(self, blocks, n)
    drop = _compat.eagle_drop_group_ids(self.coordinator)
    out: list[list[Any]] = []
    for i, (group_blocks, group) in enumerate(zip(result.blocks, self.kv_cache_config.kv_cache_groups)):
        view = list(group_blocks)
        if i in drop and view and not isinstance(group.kv_cache_spec, _ki.MambaSpec):
            view.pop()
        out.append(view)
    return self.create_kv_cache_blocks(tuple(out))


PLANTED_TRUNCATE_BUGS: dict[str, tuple[str, Callable[..., Any]]] = {
    "pre_fix_assert_all": (
        "vLLM before PR 51468: every group asserts it covers the endpoint, so a "
        "short Mamba group crashes the call",
        _variant(clamp="none"),
    ),
    "blanket_min": (
        "min() on every group: a short attention group is silently truncated",
        _variant(clamp="all"),
    ),
    "mutates_input": (
        "slices correctly but also deletes the tail of the caller's lists",
        _variant(mutate_input=True),
    ),
    "touches_refcounts": (
        "slices correctly but increments the kept blocks' ref_cnt",
        _variant(touch_refcounts=True),
    ),
    "no_alignment_check": (
        "floors a misaligned endpoint instead of rejecting it",
        _variant(check_alignment=False),
    ),
    "mamba_keeps_all": (
        "Mamba groups keep every input block, even past the endpoint",
        _variant(mamba_keeps_all=True),
    ),
    "shifted_view": (
        "returns a view that is the right length but not a prefix of the input",
        _variant(shifted=True),
    ),
    "scratch_gets_null": (
        "non-prefix-cacheable groups come back holding the null block",
        _variant(scratch_gets_null=True),
    ),
    "leaks_block": (
        "slices correctly but takes a block from the free pool and never returns it",
        _variant(leaks_block=True),
    ),
    "eagle_drops_again": (
        "re-applies the EAGLE last-block drop to the truncated view (the lookup "
        "already took it): a drafter's attention group comes back one block short",
        _drops_eagle_block_again,
    ),
}


@contextlib.contextmanager
def planted_truncate_bug(name: str) -> Iterator[None]:
    """Swap ``KVCacheManager.truncate_computed_blocks`` for a planted variant."""
    if name not in PLANTED_TRUNCATE_BUGS:
        raise KeyError(f"unknown planted bug {name!r}; known: {sorted(PLANTED_TRUNCATE_BUGS)}")
    original = KVCacheManager.truncate_computed_blocks
    KVCacheManager.truncate_computed_blocks = PLANTED_TRUNCATE_BUGS[name][1]
    try:
        yield
    finally:
        KVCacheManager.truncate_computed_blocks = original


# name: (description, ((lines of Scheduler.schedule, their replacement), ...)).
# Lines are matched without their indentation (a release that re-indents
# schedule() keeps its edits); a replacement keeps each line's indentation.
_SCHEDULE_EDITS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "max_tokens_skip_unguarded": (
        "the async 'previous step reached max_tokens' skip loses its placeholder guard: "
        "a running request one token short of max_tokens is never scheduled again",
        (("request.num_output_placeholders > 0\n", "request.num_output_placeholders >= 0\n"),),
    ),
    "no_divergent_fallback": (
        "drops the divergent-hit fallback: a deeper full-attention hit is kept "
        "with no external tokens behind its Mamba state",
        (("if hit_diverged and num_external_computed_tokens == 0:", "if False and hit_diverged:"),),
    ),
    "fallback_discards_hit": (
        "the divergent-hit fallback drops the whole local hit instead of "
        "reconciling to the boundary every group agrees on",
        (
            (
                "request.shared_prefix_boundary,\n"
                ") = self.kv_cache_manager.get_computed_blocks(\n"
                "request, max_cache_hit_length\n"
                ")",
                "request.shared_prefix_boundary,\n"
                ") = (self.kv_cache_manager.empty_kv_cache_blocks, 0, 0)",
            ),
        ),
    ),
    "drafts_never_cut": (
        "a new assert on speculating runs: every running request's scheduled drafts "
        "are all of its drafts (the token budget or max_model_len may cut them)",
        (
            (
                "scheduled_spec_decode_tokens[request.request_id] = spec_token_ids",
                "assert len(spec_token_ids) == len(request.spec_token_ids)\n"
                "scheduled_spec_decode_tokens[request.request_id] = spec_token_ids",
            ),
        ),
    ),
    "skip_truncation": (
        "skips truncate_computed_blocks: the sub-block tail stays in the adopted "
        "blocks although the local count is cut to the aligned boundary",
        (("self.kv_cache_manager.truncate_computed_blocks(", "(lambda blocks, _n: blocks)("),),
    ),
    "truncation_one_block_short": (
        "truncates the adopted blocks one scheduler block below the aligned "
        "local boundary it reports",
        (
            (
                "new_computed_blocks, block_aligned_local",
                "new_computed_blocks, max(0, block_aligned_local - self.block_size)",
            ),
        ),
    ),
    "reports_external_twice": (
        "hands the model runner num_computed_tokens with the external tokens "
        "counted twice (the allocation itself is right)",
        (
            (
                "request.num_computed_tokens = num_computed_tokens\n"
                "self._set_kv_fetch_stage(request, None)",
                "request.num_computed_tokens = num_computed_tokens + num_external_computed_tokens\n"
                "self._set_kv_fetch_stage(request, None)",
            ),
        ),
    ),
}

# name: (description, Scheduler method, edits): planted violations of the
# KV-connector protocol, on the scheduler's side of it.
_CONNECTOR_EDITS: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "asks_connector_unaligned": (
        "asks the connector about the unaligned local hit (sub-block tail "
        "included) but keeps only the aligned part: the load starts past "
        "where the local part ends",
        "schedule",
        (("request, block_aligned_local", "request, num_new_local_computed_tokens"),),
    ),
    "tells_connector_total": (
        "update_state_after_alloc gets the request's whole computed count, "
        "not the external tokens the scheduler accounted",
        "schedule",
        (
            (
                "self.kv_cache_manager.get_blocks(request_id),\n"
                "num_external_computed_tokens,\n"
                ")",
                "self.kv_cache_manager.get_blocks(request_id),\n"
                "num_computed_tokens,\n"
                ")",
            ),
        ),
    ),
    "hands_connector_cached_blocks": (
        "update_state_after_alloc gets the adopted cached blocks instead of "
        "the request's blocks: none for the external range",
        "schedule",
        (("self.kv_cache_manager.get_blocks(request_id),", "new_computed_blocks,"),),
    ),
    "keeps_tail_and_loads": (
        "keeps the local sub-block tail and still takes the connector's "
        "(smaller) answer as external tokens",
        "schedule",
        (
            (
                "# local sub-block tail and load nothing external.\n"
                "num_external_computed_tokens = 0",
                "# local sub-block tail and load nothing external.\n"
                "num_external_computed_tokens = ext_tokens",
            ),
        ),
    ),
    "skips_meta_on_empty_step": (
        "skips build_connector_meta on a step that schedules no tokens (an "
        "async load admitted alone is never started)",
        "schedule",
        (
            (
                "if self.connector is not None:\n"
                "meta = self._build_kv_connector_meta(self.connector, scheduler_output)",
                "if self.connector is not None and num_scheduled_tokens:\n"
                "meta = self._build_kv_connector_meta(self.connector, scheduler_output)",
            ),
        ),
    ),
    "async_load_counted_scheduled": (
        "counts a request admitted for an async load in num_scheduled_tokens "
        "(0 tokens) without naming it in the scheduler output",
        "schedule",
        (
            (
                "self._set_kv_fetch_stage(request, KV_FETCH_IN_PROGRESS)",
                "self._set_kv_fetch_stage(request, KV_FETCH_IN_PROGRESS)\n"
                "num_scheduled_tokens[request_id] = 0",
            ),
        ),
    ),
    "no_sync_load_flag": (
        "admits a synchronous external load without setting has_sync_kv_loads",
        "schedule",
        (("has_sync_kv_loads = True", "has_sync_kv_loads = False"),),
    ),
    "async_load_computes_at_once": (
        "takes an async answer that leaves prompt tokens to compute as "
        "synchronous: the request computes in the step its load starts, "
        "before the load is reported finished",
        "schedule",
        (
            (
                "if request.skip_reading_prefix_cache:",
                "load_kv_async = load_kv_async and (ext_tokens or 0) + block_aligned_local >= request.num_tokens\n"
                "if request.skip_reading_prefix_cache:",
            ),
        ),
    ),
    "resumes_past_invalid_block": (
        "a synchronous load reported failed block by block (invalid_block_ids) "
        "resumes one block past its first invalid block under the recompute "
        "policy: the garbage block is taken as computed",
        "_update_requests_with_invalid_blocks",
        (("request.num_computed_tokens = idx * self.block_size", "request.num_computed_tokens = (idx + 1) * self.block_size"),),
    ),
    "evicts_invalid_blocks_on_recompute": (
        "evicts a failed synchronous load's blocks under the recompute policy "
        "instead of the fail policy: under 'fail' the garbage stays cached",
        "_handle_invalid_blocks",
        (
            (
                "if sync_blocks_to_evict and not self.recompute_kv_load_failures:",
                "if sync_blocks_to_evict and self.recompute_kv_load_failures:",
            ),
        ),
    ),
    "failed_async_load_kept": (
        "a failed async load (failed_recving) keeps its tokens as computed "
        "under the recompute policy; when the request leaves "
        "WAITING_FOR_REMOTE_KVS its failed blocks are cached",
        "_handle_failed_recving",
        (("request.num_computed_tokens = 0", "pass"),),
    ),
    "caches_async_load_early": (
        "allocate_slots caches the blocks of an async external load at once instead of "
        "when the load lands: the prefix cache names blocks still being loaded",
        "schedule",
        (("delay_cache_blocks=load_kv_async,", "delay_cache_blocks=False,"),),
    ),
    "skipping_request_loads_external": (
        "drops the skip_reading_prefix_cache override of the connector's answer: "
        "a request that must compute from token 0 loads the external hit",
        "schedule",
        (("ext_tokens, load_kv_async = 0, False", "pass"),),
    ),
    "delivers_stale_output": (
        "update_from_output appends a preempted request's stale output although "
        "the scheduler drops stale output (requires_kv_delivery)",
        "update_from_output",
        (("if output_is_stale and request.drop_stale_output:", "if output_is_stale and request.drop_stale_output and False:"),),
    ),
    "hands_off_one_block_short": (
        "_connector_finished hands request_finished_all_groups every group's "
        "block ids but the last: a producer sends the request's KV without its "
        "last block",
        "_connector_finished",
        (
            (
                "delay_free, kv_xfer_params = self.connector.request_finished_all_groups(\n"
                "request, block_ids\n"
                ")",
                "delay_free, kv_xfer_params = self.connector.request_finished_all_groups(\n"
                "request, tuple(ids[:-1] for ids in block_ids)\n"
                ")",
            ),
        ),
    ),
    "connector_finished_twice": (
        "_free_request tells the connector a request finished twice",
        "_free_request",
        (
            (
                "connector_delay_free_blocks, kv_xfer_params = self._connector_finished(request)",
                "connector_delay_free_blocks, kv_xfer_params = self._connector_finished(request) "
                "and self._connector_finished(request)",
            ),
        ),
    ),
}

# name: (description, (vLLM module, class, method), edits): planted bugs in
# vLLM's block bookkeeping (allocation, freeing, lookups), each breaking one
# block-ownership rule (invariants/ownership.py).
_OWNERSHIP_EDITS: dict[str, tuple[str, tuple[str, str, str], tuple[tuple[str, str], ...]]] = {
    "mamba_frees_resume_state": (
        "MambaManager.get_num_skipped_tokens counts the state at the resume point as "
        "skipped: remove_skipped_blocks frees the state block the next step starts from",
        ("vllm.v1.core.single_type_kv_cache_manager", "MambaManager", "get_num_skipped_tokens"),
        (("return num_computed_tokens - 1", "return num_computed_tokens"),),
    ),
    "mamba_adopts_same_step_state": (
        "MambaManager.get_num_blocks_to_allocate drops its same-step guard: a request "
        "adopts a Mamba state another request only writes in the same step",
        ("vllm.v1.core.single_type_kv_cache_manager", "MambaManager", "get_num_blocks_to_allocate"),
        (
            (
                "and new_computed_blocks[-1].block_hash in self.cached_blocks_this_step",
                "and new_computed_blocks[-1].block_hash in () and self.cached_blocks_this_step",
            ),
        ),
    ),
    "cow_block_not_reserved": (
        "get_num_blocks_to_allocate forgets the extra block a partial-hit copy-on-write "
        "takes: allocation takes one block more than admission counted",
        ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager", "get_num_blocks_to_allocate"),
        (("num_new_blocks += 1", "num_new_blocks += 0"),),
    ),
    "mamba_count_goes_negative": (
        "MambaManager.get_num_blocks_to_allocate answers -1 instead of 0: the sum the "
        "free-block check compares with the pool hides a block another group takes",
        ("vllm.v1.core.single_type_kv_cache_manager", "MambaManager", "get_num_blocks_to_allocate"),
        (
            (
                "return num_new_blocks + num_evictable_computed_blocks",
                "return (num_new_blocks + num_evictable_computed_blocks) or -1",
            ),
        ),
    ),
    "lookup_rounds_limit_up": (
        "FullAttentionManager.find_longest_cache_hit rounds the caller's limit up to a "
        "whole block: a prompt's last block can be a hit",
        ("vllm.v1.core.single_type_kv_cache_manager", "FullAttentionManager", "find_longest_cache_hit"),
        (
            (
                "for block_hash in itertools.islice(full_block_hashes, max_length // block_size):",
                "for block_hash in itertools.islice(full_block_hashes, -(-max_length // block_size)):",
            ),
        ),
    ),
}

PLANTED_OWNERSHIP_BUGS: dict[str, str] = {name: desc for name, (desc, _, _) in _OWNERSHIP_EDITS.items()}

# Siblings of known vLLM bugs (compiled as the ownership edits are): each
# breaks the claim a known bug breaks, at the same vLLM call, in another
# group or state, so a campaign must report it as new while it still sets
# the real bug aside (tests/findings/test_known_bug_siblings.py).
_SIBLING_EDITS: dict[str, tuple[str, tuple[str, str, str], tuple[tuple[str, str], ...]]] = {
    "landed_load_frees_first_block": (
        "Scheduler._update_waiting_for_remote_kv, when an async load lands, frees the first "
        "real block of the request's last group while the request keeps it in its table: the "
        "request's next step reads a block back in the free queue (a full-attention group "
        "too, and after any landed load, not only a whole-prompt one)",
        ("vllm.v1.core.sched.scheduler", "Scheduler", "_update_waiting_for_remote_kv"),
        (
            (
                "# This will cache the blocks iff caching is enabled.\n"
                "self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)",
                "self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)\n"
                "self.kv_cache_manager.block_pool.free_blocks([b for b in self.kv_cache_manager"
                ".get_blocks(request.request_id).blocks[-1] if not b.is_null][:1])",
            ),
        ),
    ),
    "rollback_frees_failed_block": (
        "Scheduler._update_requests_with_invalid_blocks, rolling a running request back to its "
        "first failed block under the recompute policy, frees that block while the request "
        "keeps it in its table: the recompute reads a block back in the free queue (a "
        "full-attention group too, with or without a step in flight)",
        ("vllm.v1.core.sched.scheduler", "Scheduler", "_update_requests_with_invalid_blocks"),
        (
            (
                "request.num_computed_tokens = idx * self.block_size",
                "request.num_computed_tokens = idx * self.block_size\n"
                "if evict_blocks and self.recompute_kv_load_failures: self.kv_cache_manager.block_pool"
                ".free_blocks([self.kv_cache_manager.block_pool.blocks[block_id]])",
            ),
        ),
    ),
    "reset_preempts_loading_requests": (
        "Scheduler.reset_prefix_cache(reset_running_requests=True) preempts the waiting "
        "requests that hold blocks (an async load in flight) as well as the running ones: "
        "_preempt_request asserts on the first, another raise than the deferred frees' one",
        ("vllm.v1.core.sched.scheduler", "Scheduler", "reset_prefix_cache"),
        (
            ("while self.running:", "while self.running or self.kv_holding_waiting:"),
            (
                "request = self.running.pop()",
                "request = self.running.pop() if self.running else self.kv_holding_waiting.pop_request()",
            ),
        ),
    ),
}
# The plants that exist only as siblings (a registry entry's ``sibling``,
# fuzz/known_bugs.py): triage cases, no invariant row's.
SIBLING_PLANTS: dict[str, str] = {name: desc for name, (desc, _, _) in _SIBLING_EDITS.items()}

# name: (description, Scheduler method, edits): planted bugs in speculative
# decoding's bookkeeping (compiled as the connector edits are).
_SPEC_DECODE_EDITS: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "rejected_drafts_stay_computed": (
        "update_from_output counts rejected draft positions as computed: "
        "num_computed_tokens is not rolled back by the rejections",
        "update_from_output",
        (("request.num_computed_tokens -= num_rejected", "request.num_computed_tokens -= 0"),),
    ),
    "records_first_sampled_token": (
        "_update_request_with_output appends the step's first sampled token once per "
        "token returned: with accepted drafts vLLM records a sequence other than the "
        "one the model runner computes the next positions from",
        "_update_request_with_output",
        (("request.append_output_token_ids(output_token_id)", "request.append_output_token_ids(new_token_ids[0])"),),
    ),
}

# name: (description, (vLLM module, class, method), edits): planted bugs in
# the KV-cache manager's prefix-cache gate (compiled as the ownership edits are).
_MANAGER_EDITS: dict[str, tuple[str, tuple[str, str, str], tuple[tuple[str, str], ...]]] = {
    "encoder_entry_stays_freeable": (
        "EncoderCacheManager.check_and_update_cache takes a cached, unreferenced output back "
        "for a request without taking it off the freeable list: a later item that needs room "
        "evicts it while the request still reads it",
        ("vllm.v1.core.encoder_cache_manager", "EncoderCacheManager", "check_and_update_cache"),
        (("num_encoder_embeds = self.freeable.pop(mm_hash)\nself.num_freeable_slots -= num_encoder_embeds",
          "num_encoder_embeds = self.freeable[mm_hash]\nself.num_freeable_slots -= 0"),),
    ),
    "skipping_request_reads_local_cache": (
        "KVCacheManager.prefix_cache_lookup_enabled ignores skip_reading_prefix_cache: "
        "a request that must compute from token 0 takes the local prefix-cache hit",
        ("vllm.v1.core.kv_cache_manager", "KVCacheManager", "prefix_cache_lookup_enabled"),
        (
            (
                "return self.enable_caching and not request.skip_reading_prefix_cache",
                "return self.enable_caching",
            ),
        ),
    ),
}

# The partial-hit copy-on-write decision (compiled as the ownership edits are).
_MANAGER_EDITS["partial_hit_shares_its_block"] = (
    "SingleTypeKVCacheManager.add_local_computed_blocks never records a partial "
    "(sub-block) hit for copy-on-write: the request keeps the cached block in its "
    "table and writes its own tokens into it, over KV the prefix cache still serves",
    ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager", "add_local_computed_blocks"),
    (
        (
            "if self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens):",
            "if False and self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens):",
        ),
    ),
)

# What the block pool announces (compiled as the ownership edits are): KV
# events a router replays (invariants/promises.py).
_MANAGER_EDITS["eviction_announces_nothing"] = (
    "BlockPool._maybe_evict_cached_block drops a reused block's keys from the "
    "prefix-cache index without publishing BlockRemoved: a KV-aware router keeps "
    "routing requests to a hit that is gone",
    ("vllm.v1.core.block_pool", "BlockPool", "_maybe_evict_cached_block"),
    (("self._emit_block_removed_events(evicted_hashes)", "pass"),),
)

_MANAGER_EDITS["reset_announces_nothing"] = (
    "BlockPool.reset_prefix_cache clears the prefix-cache index without publishing "
    "AllBlocksCleared: after a reset a KV-aware router keeps routing requests to hits "
    "that are gone",
    ("vllm.v1.core.block_pool", "BlockPool", "reset_prefix_cache"),
    (("self.kv_event_queue.append(AllBlocksCleared())", "pass"),),
)

# What the index names (invariants/contents.py): a key outliving its block's contents.
_MANAGER_EDITS["evicted_key_stays_indexed"] = (
    "BlockPool._remove_cached_block_hashes clears a reused block's own key but leaves "
    "every key in the prefix-cache index (reporting none removed): the old prefix's "
    "next lookup adopts the block the pool gave a new owner, who overwrites it",
    ("vllm.v1.core.block_pool", "BlockPool", "_remove_cached_block_hashes"),
    (("self.cached_block_hash_to_block.pop(block_hash, block.block_id)", "None"),),
)

# What the KV events chain (invariants/promises.py): a router's tree.
_MANAGER_EDITS["stored_event_names_itself_parent"] = (
    "BlockPool.cache_full_blocks names, as a BlockStored event's parent_block_hash, the "
    "first block the event announces instead of the last block cached before it: a "
    "router that hangs blocks under their parent cannot place any block cached after a "
    "request's first",
    ("vllm.v1.core.block_pool", "BlockPool", "cache_full_blocks"),
    (("block_hashes[num_cached_blocks - 1]", "block_hashes[num_cached_blocks]"),),
)

# What a KV event says of each block it announces (invariants/promises.py):
# what a router reads besides the key.
_MANAGER_EDITS["stored_event_tokens_shifted"] = (
    "BlockPool._build_block_stored_event slices the request's tokens one past the "
    "blocks it announces: every block's token_ids are off by one, and a router that "
    "matches prompts by tokens routes them to blocks that hold other tokens",
    ("vllm.v1.core.block_pool", "BlockPool", "_build_block_stored_event"),
    (("request.all_token_ids[start_token_idx:end_token_idx]", "request.all_token_ids[start_token_idx + 1:end_token_idx + 1]"),),
)

_MANAGER_EDITS["stored_event_drops_lora"] = (
    "BlockPool._build_block_stored_event leaves out the request's LoRA adapter "
    "(lora_name None): a router that keys blocks by adapter files a LoRA request's "
    "blocks under the base model's",
    ("vllm.v1.core.block_pool", "BlockPool", "_build_block_stored_event"),
    (("lora_name=request.lora_request.name if request.lora_request else None", "lora_name=None"),),
)

# What a step in flight reads (invariants/promises.py): vLLM before PR 47728.
_MANAGER_EDITS["window_frees_in_flight"] = (
    "KVCacheManager.allocate_slots frees a running request's skipped blocks on the "
    "optimistic num_computed_tokens (the in-flight step's tokens included): under "
    "async scheduling a sliding window or chunk the step still running reads goes back "
    "to the pool",
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager", "allocate_slots"),
    (("max(0, total_computed_tokens - request.num_in_flight_tokens)", "total_computed_tokens"),),
)

# What a Mamba state block holds (fuzz/adapter/_contents.py: one state per block).
_MANAGER_EDITS["mamba_tail_state_overwritten"] = (
    "MambaManager.allocate_new_blocks leaves a running request's cached partial-tail "
    "state under its key: the copy is still made, but the entry stays on the block the "
    "request's next chunk writes its running state into",
    ("vllm.v1.core.single_type_kv_cache_manager", "MambaManager", "allocate_new_blocks"),
    (("self.block_pool.move_block_hashes(source_block, cow_block)", "pass"),),
)

# What a reset promises (invariants/promises.py): the cache forgets.
_MANAGER_EDITS["reset_keeps_index"] = (
    "BlockPool.reset_prefix_cache reports success before it clears anything: the "
    "prefix-cache index, the blocks' hashes and the events stay as they were, so "
    "after a reset (a weight update in RLHF flows) a lookup still adopts KV cached "
    "before it",
    ("vllm.v1.core.block_pool", "BlockPool", "reset_prefix_cache"),
    (("self.cached_block_hash_to_block = BlockHashToBlockMap()", "return True"),),
)

# How long a hit the lookup serves (invariants/hits.py): a missed hit.
_MANAGER_EDITS["hit_stops_a_block_early"] = (
    "UnitaryKVCacheCoordinator.find_longest_cache_hit drops the last block of a "
    "full-attention hit: every hit of a one-group full-attention model is a block "
    "shorter than the index holds (a missed hit)",
    ("vllm.v1.core.kv_cache_coordinator", "UnitaryKVCacheCoordinator", "find_longest_cache_hit"),
    (("return hit_blocks, hit_length, 0",
      "return (tuple(b[:-1] for b in hit_blocks), hit_length - self.block_size, 0) if hit_length > 0 "
      "and type(self.kv_cache_spec).__name__ == 'FullAttentionSpec' else (hit_blocks, hit_length, 0)"),),
)

_MANAGER_EDITS["window_hit_needs_a_block_more"] = (
    "SlidingWindowManager.find_longest_cache_hit asks for one cached block more than the "
    "window reads (and than the group keeps cached for hits): a sliding-window group "
    "serves no hit whose block before the window is not cached (a missed hit)",
    ("vllm.v1.core.single_type_kv_cache_manager", "SlidingWindowManager", "find_longest_cache_hit"),
    (("sliding_window_contiguous_blocks = cls._contiguous_blocks_for_hit(",
      "sliding_window_contiguous_blocks = 1 + cls._contiguous_blocks_for_hit("),),
)

_MANAGER_EDITS["chunk_hit_stops_a_block_early"] = (
    "ChunkedLocalAttentionManager.find_longest_cache_hit stops its run of cached blocks "
    "one block before the lookup's limit: a chunked-local group serves a block less "
    "than the index holds inside the last chunk (a missed hit)",
    ("vllm.v1.core.single_type_kv_cache_manager", "ChunkedLocalAttentionManager", "find_longest_cache_hit"),
    (("for i in range(local_attention_start_block_idx, max_num_blocks):",
      "for i in range(local_attention_start_block_idx, max_num_blocks - 1):"),),
)

# An EAGLE-style drafter's hit (invariants/hits.py): the coordinator forgets
# which groups drop, so a hit keeps the block whose last position's KV the
# drafter wrote with the token after it.
_MANAGER_EDITS["eagle_drop_forgotten"] = (
    "KVCacheCoordinator leaves every group out of the EAGLE last-block drop: a speculating "
    "request's hit adopts a prefix with no cached entry past it, whose KV at the hit's last "
    "position the drafter wrote with a token the request may not have",
    ("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator", "__init__"),
    (("self.drop_eagle_group_ids = self.eagle_group_ids if use_eagle else set()",
      "self.drop_eagle_group_ids = set()"),),
)

# ... the hybrid coordinator drops again on every pass of its fixed point: a
# group it already verified at the current length loses another block each
# time a later group shrinks the hit (vLLM issue 32802's spiral).
_MANAGER_EDITS["eagle_drop_reapplied"] = (
    "HybridKVCacheCoordinator.find_longest_cache_hit passes the EAGLE drop to a group on "
    "every pass of its fixed point, its lookahead margin only on the first: a group "
    "already verified at the candidate length drops a block more on each later pass and "
    "the hit spirals down (a missed hit, the shape of vLLM issue 32802)",
    ("vllm.v1.core.kv_cache_coordinator", "HybridKVCacheCoordinator", "find_longest_cache_hit"),
    (("drop_eagle_block=drop_eagle_block,", "drop_eagle_block=use_eagle,"),),
)

# Which cached blocks survive pool pressure (invariants/hits.py): a request's
# free goes head first, so its prefix's first block is evicted before the
# blocks that only serve with it.
_MANAGER_EDITS["free_evicts_head_first"] = (
    "SingleTypeKVCacheManager.free frees a request's blocks in table order instead of "
    "reversed: its cached head block goes to the free queue first and is evicted "
    "first, taking every later block's hit with it (a missed hit)",
    ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager", "free"),
    (("self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))",
      "self.block_pool.free_blocks(self.pop_blocks_for_free(request_id))"),),
)

# What the prefix cache must still serve (invariants/cache.py): frees keep keys.
_MANAGER_EDITS["free_forgets_keys"] = (
    "BlockPool.free_blocks evicts every block it takes back from the prefix-cache index "
    "(its keys dropped, the block queued as one that never served a hit): a prompt sent "
    "again after the first finished hits nothing",
    ("vllm.v1.core.block_pool", "BlockPool", "free_blocks"),
    (("if block.block_hash is None or not self.enable_caching:",
      "if self._maybe_evict_cached_block(block) or block.block_hash is None or not self.enable_caching:"),),
)

# With prefix caching off (invariants/cache.py: caching-off-caches-nothing).
_MANAGER_EDITS["caches_with_caching_off"] = (
    "KVCacheCoordinator.cache_blocks files every group's full blocks whatever the manager's "
    "enable_caching: an engine started without prefix caching fills its prefix-cache index",
    ("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator", "cache_blocks"),
    (("if not manager.enable_caching:", "if False:"),),
)

# name: (description, (vLLM module, function), edits): planted bugs in a
# module-level function of vLLM's (the block hashing), compiled as the
# method edits are and swapped into the module for the duration.
_FUNCTION_EDITS: dict[str, tuple[str, tuple[str, str], tuple[tuple[str, str], ...]]] = {
    "hash_ignores_parent": (
        "hash_block_tokens leaves the parent block's hash out: a block's key names its own tokens "
        "only, so a block computed under other earlier tokens serves a request whose prefix differs",
        ("vllm.v1.core.kv_cache_utils", "hash_block_tokens"),
        (("if not parent_block_hash:\nparent_block_hash = NONE_HASH", "if True:\nparent_block_hash = BlockHash(b'')"),),
    ),
    "cache_salt_not_hashed": (
        "generate_block_hash_extra_keys leaves the request's cache_salt out of its first "
        "block's extra keys: requests of different tenants share prefix-cache entries",
        ("vllm.v1.core.kv_cache_utils", "generate_block_hash_extra_keys"),
        (("if (start_token_idx == 0 and request.cache_salt)", "if (False and request.cache_salt)"),),
    ),
    "embeds_not_hashed": (
        "_gen_prompt_embeds_extra_hash_keys gives no extra keys for a request's prompt "
        "embeddings: requests sending different embeddings of one length (vLLM records "
        "zeros as their tokens) share prefix-cache entries",
        ("vllm.v1.core.kv_cache_utils", "_gen_prompt_embeds_extra_hash_keys"),
        (("if request.prompt_embeds is None:", "if True:"),),
    ),
    "mm_not_hashed": (
        "_gen_mm_extra_hash_keys gives no extra keys for a request's multimodal items: "
        "prompts whose placeholders hold different images share prefix-cache entries",
        ("vllm.v1.core.kv_cache_utils", "_gen_mm_extra_hash_keys"),
        (("if not mm_features:", "if True:"),),
    ),
    "lora_not_hashed": (
        "_gen_lora_extra_hash_keys gives no extra keys for a request's LoRA adapter: requests "
        "under an adapter share prefix-cache entries with the base model's and other adapters'",
        ("vllm.v1.core.kv_cache_utils", "_gen_lora_extra_hash_keys"),
        (("if not lora_request:", "if True:"),),
    ),
}

# A drafter's lookahead slots (compiled as the connector edits are).
_SPEC_DECODE_EDITS["lookahead_not_allocated"] = (
    "schedule() allocates a running request's slots without the drafter's lookahead: "
    "EAGLE writes its draft positions' KV past the blocks the request owns",
    "schedule",
    (("num_lookahead_tokens=self.num_lookahead_tokens,", "num_lookahead_tokens=0,"),),
)

# A preemption's reset (compiled as the connector edits are): the state a
# preempted request resumes from (invariants/promises.py).
_SPEC_DECODE_EDITS["preempt_keeps_computed_tokens"] = (
    "_preempt_request frees the request's blocks but leaves its num_computed_tokens: "
    "admitted again, it resumes past tokens whose KV it no longer holds",
    "_preempt_request",
    (("request.num_computed_tokens = 0", "pass"),),
)
_SPEC_DECODE_EDITS["preempt_keeps_drafts"] = (
    "_preempt_request leaves a speculating request's spec_token_ids: admitted again, "
    "it is scheduled drafts proposed from a state it no longer holds",
    "_preempt_request",
    (("request.spec_token_ids = []", "pass"),),
)

# Every request's fate (invariants/fate.py): a request the waiting loop
# drops from its queue, and one it skips for ever.
_SCHEDULE_EDITS["lost_when_pool_full"] = (
    "the waiting loop pops a request whose allocation fails before it stops, and never puts "
    "it back: the request stays in Scheduler.requests but in no queue, and is never scheduled",
    (("if new_blocks is None:\n# The request cannot be scheduled.",
      "if new_blocks is None:\nrequest_queue.pop_request()"),),
)
_SCHEDULE_EDITS["deferred_requests_take_slots"] = (
    "the waiting loop counts the deferred waiting requests (skipped by an earlier scan) as "
    "holding sequence slots, as it counts paused streaming sessions: once max_num_seqs of "
    "them wait, no request is admitted again",
    (("num_running = len(self.running) + self.num_waiting_for_streaming_input",
      "num_running = len(self.running) + self.num_waiting_for_streaming_input + len(self.deferred_waiting)"),),
)

PLANTED_SCHEDULER_BUGS: dict[str, str] = {
    **{name: desc for name, (desc, _) in _SCHEDULE_EDITS.items()},
    **{name: desc for name, (desc, _, _) in _FUNCTION_EDITS.items()},
    **{name: desc for name, (desc, _, _) in _CONNECTOR_EDITS.items()},
    **{name: desc for name, (desc, _, _) in _SPEC_DECODE_EDITS.items()},
    **PLANTED_OWNERSHIP_BUGS,
    **{name: desc for name, (desc, _, _) in _MANAGER_EDITS.items()},
    **{name: desc for name, (desc, _, _) in _SIBLING_EDITS.items()},
    "pre_fix_assert_all": (
        "truncate_computed_blocks as before vLLM PR 51468: every group, Mamba "
        "included, asserts it covers the endpoint"
    ),
    "truncate_touches_refcounts": (
        "truncate_computed_blocks bumps the kept blocks' ref_cnt, so they never "
        "return to the pool"
    ),
}

_TRUNCATE_BUG_FOR = {
    "pre_fix_assert_all": "pre_fix_assert_all",
    "truncate_touches_refcounts": "touches_refcounts",
}


def _edit(source: str, old: str, new: str, name: str, method: str = "schedule") -> str:
    """Replace the run of lines ``old`` (compared without indentation) by
    ``new``; new line k takes the indentation of old line k (or of the last
    old line). A one-line ``old`` may be part of a line: only that part is
    replaced."""
    lines = source.split("\n")
    old_lines, new_lines = old.rstrip("\n").split("\n"), new.rstrip("\n").split("\n")
    stripped = [ln.strip() for ln in lines]
    want = [ln.strip() for ln in old_lines]
    # A one-line anchor may be part of a line; a longer one is whole lines.
    if len(want) == 1:
        hits = [i for i, ln in enumerate(stripped) if want[0] in ln]
    else:
        hits = [i for i in range(len(lines) - len(want) + 1) if stripped[i : i + len(want)] == want]
    if len(hits) != 1 or (len(want) == 1 and sum(ln.count(want[0]) for ln in stripped) != 1):
        raise RuntimeError(
            f"planted bug {name!r}: its anchor {old!r} occurs {len(hits)} times in "
            f"Scheduler.{method} of vLLM {VLLM_VERSION} (expected once); update the planted edits"
        )
    (at,) = hits
    if len(want) == 1 and len(new_lines) == 1:
        lines[at] = lines[at].replace(want[0], new_lines[0].strip(), 1)
        return "\n".join(lines)
    window = lines[at : at + len(want)]
    indents = [ln[: len(ln) - len(ln.lstrip())] for ln in window]
    replaced = [indents[min(k, len(indents) - 1)] + n.strip() for k, n in enumerate(new_lines)]
    return "\n".join(lines[:at] + replaced + lines[at + len(want) :])


def _planted_edits(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The Scheduler method a planted edit changes, and its edits."""
    if name in _CONNECTOR_EDITS or name in _SPEC_DECODE_EDITS:
        _, method, edits = {**_CONNECTOR_EDITS, **_SPEC_DECODE_EDITS}[name]
        return method, edits
    return "schedule", _SCHEDULE_EDITS[name][1]


@functools.cache
def _patched_schedule(name: str) -> Callable[..., Any]:
    method, edits = _planted_edits(name)
    return _compile_edited(Scheduler, method, edits, name)


@functools.cache
def _patched_method(name: str) -> tuple[type, str, Any]:
    """The planted ownership (or manager) edit ``name``: its vLLM class, method name and
    the edited method (a function, or a classmethod)."""
    _, (module_name, class_name, method), edits = {**_OWNERSHIP_EDITS, **_MANAGER_EDITS, **_SIBLING_EDITS}[name]
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls, method, _compile_edited(cls, method, edits, name)


def _compile_edited(cls: type, method: str, edits: tuple[tuple[str, str], ...], name: str) -> Any:
    """``cls.method`` with ``edits`` applied, compiled so that its frames
    read as vLLM's own: the class's source file (outcomes and crash states
    treat it as vLLM code), the qualified name ``Class.method``, and the line
    numbers of the original method. The edited source is registered with
    linecache under a name of its own beside the file, so a traceback, and
    the raising statement a known-bug signature names, show the planted line,
    not whatever line of the real file has that number."""
    original = vars(cls)[method]
    func = original.__func__ if isinstance(original, classmethod) else original
    lines, first = inspect.getsourcelines(func)
    source = textwrap.dedent("".join(lines))
    if isinstance(original, classmethod) and not source.lstrip().startswith("@classmethod"):
        source = "@classmethod\n" + source
        first -= 1
    for old, new in edits:
        source = _edit(source, old, new, name, method)
    # Compiled inside a class body of the class's name: the qualified name is
    # vLLM's, and a zero-argument super() has its __class__ cell (pointed at
    # the real class below). The blank lines put the method at its own line.
    shim = "\n" * max(first - 2, 0) + f"class {cls.__name__}:\n" + textwrap.indent(source, "    ")
    filename = f"{inspect.getsourcefile(func)} [planted {name}]"
    linecache.cache[filename] = (len(shim), None, shim.splitlines(keepends=True), filename)
    namespace = dict(vars(importlib.import_module(cls.__module__)))
    exec(compile(shim, filename, "exec"), namespace)  # noqa: S102
    edited = vars(namespace[cls.__name__])[method]
    namespace[cls.__name__] = cls  # the method's globals: the real class, not the shim
    inner = edited.__func__ if isinstance(edited, classmethod) else edited
    for var, cell in zip(inner.__code__.co_freevars, inner.__closure__ or ()):
        if var == "__class__":
            cell.cell_contents = cls
    return edited


@functools.cache
def _patched_function(name: str) -> tuple[Any, str, Any]:
    """The planted function edit ``name``: its vLLM module, function name
    and the edited function, compiled at the original's line numbers with
    its source registered (as :func:`_compile_edited` does for methods)."""
    _, (module_name, function), edits = _FUNCTION_EDITS[name]
    module = importlib.import_module(module_name)
    original = getattr(module, function)
    lines, first = inspect.getsourcelines(original)
    source = textwrap.dedent("".join(lines))
    for old, new in edits:
        source = _edit(source, old, new, name, function)
    shim = "\n" * max(first - 1, 0) + source
    filename = f"{inspect.getsourcefile(original)} [planted {name}]"
    linecache.cache[filename] = (len(shim), None, shim.splitlines(keepends=True), filename)
    namespace = dict(vars(module))
    exec(compile(shim, filename, "exec"), namespace)  # noqa: S102
    return module, function, namespace[function]


@contextlib.contextmanager
def planted_scheduler_bug(name: str) -> Iterator[None]:
    """Run the enclosed code against a deliberately broken scheduler path."""
    if name not in PLANTED_SCHEDULER_BUGS:
        raise KeyError(f"unknown planted bug {name!r}; known: {sorted(PLANTED_SCHEDULER_BUGS)}")
    if name in _TRUNCATE_BUG_FOR:
        with planted_truncate_bug(_TRUNCATE_BUG_FOR[name]):
            yield
        return
    if name in _FUNCTION_EDITS:
        module, function, edited = _patched_function(name)
        original = getattr(module, function)
        setattr(module, function, edited)
        try:
            yield
        finally:
            setattr(module, function, original)
        return
    if name in _OWNERSHIP_EDITS or name in _MANAGER_EDITS or name in _SIBLING_EDITS:
        cls, method, edited = _patched_method(name)
        original = vars(cls)[method]
        setattr(cls, method, edited)
        try:
            yield
        finally:
            setattr(cls, method, original)
        return
    method, _ = _planted_edits(name)
    original = vars(Scheduler)[method]
    setattr(Scheduler, method, _patched_schedule(name))
    try:
        yield
    finally:
        setattr(Scheduler, method, original)


# ---------------------------------------------------------------------------
# The runs that show a plant caught where the search rarely goes
# ---------------------------------------------------------------------------
# A plant the single-shot search does not meet is shown on a fixed run: the
# self-tests (tests/invariants/test_scheduler_planted.py) play it planted
# and unplanted with the check of the table row that names the plant, and
# the repro tests write its shrunk log as a file. A new such plant is one
# entry of FIXED_RUNS, beside its edit above.


def _full_attention(num_blocks: int, *more: SpecDraw, **draw: Any) -> SchedulerDraw:
    """4-token full attention (and ``more`` groups of 4-token blocks), 4-token
    hashes, ``num_blocks`` blocks; two requests at a time, 32 tokens a step,
    unless ``draw`` says otherwise."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), *more), hash_block_size=4, num_blocks=num_blocks)
    return SchedulerDraw(layout, **{"max_num_batched_tokens": 32, "max_num_seqs": 2, **draw})


def _repeated(count: int, length: int = 13, max_tokens: int = 2, **keys: Any) -> tuple[FixedPrompt, ...]:
    """One ``length``-token prompt sent ``count`` times."""
    return (FixedPrompt(tuple(range(length)), max_tokens, **keys),) * count


# Three requests decoding 12 tokens each on 9 blocks: each needs 3 blocks
# to start and a fourth at token 13, which only a preemption frees.
_PREEMPTING = FixedRun(_full_attention(9, max_num_batched_tokens=16, max_num_seqs=3), distinct_prompts(3, 10, 12),
                       label="preemption")
# Four 13-token prompts with no common prefix, one after another: each
# caches 3 blocks, and from the third on the new prompt's blocks are taken
# from cached ones. A finished request's free returns its blocks tail first
# (the keyless partial tail to the front of the free queue, its 3 cached
# blocks to the end, last one first), so the third prompt evicts the first
# one's last two cached blocks and keeps its first.
_ONE_AFTER_ANOTHER = FixedRun(_full_attention(9), distinct_prompts(4, 13, 2), one_after_another=True)
# One 13-token prompt sent three times, async scheduling on a producer (a
# consumer defers the frees a reset needs: the known bug
# reset-running-fails-on-deferred-frees). The second hits 3 blocks; while it
# decodes the cache is reset with reset_running_requests (it is preempted,
# its output in flight dropped); resumed, it hits nothing; the third, sent
# after it finished, hits the second's recomputed blocks, nothing from
# before the reset.
_RESET = FixedRun(_full_attention(17, async_scheduling=True, kv_role="kv_producer"), _repeated(3, max_tokens=4),
                  one_after_another=True, reset_during=1, hits=(0, 12, 0, 12))
# One 13-token prompt sent twice, one after the other: the second lookup
# has a prediction and hits its 3 cached blocks (12 tokens, the limit).
_REPEATED = FixedRun(_full_attention(17), _repeated(2), one_after_another=True, hits=(0, 12))


def _beside(spec: SpecDraw) -> FixedRun:
    """:data:`_REPEATED` with full attention beside ``spec``."""
    return FixedRun(_full_attention(33, spec), _repeated(2), one_after_another=True, hits=(0, 12))


def _speculating(async_scheduling: bool) -> FixedRun:
    """Full attention + Mamba with 3 speculative state blocks, k = 3 drafts
    (ngram sync, EAGLE async: the drafter writes 3 positions ahead of every
    step it drafts from), accepted 1, 0, 3, 2, ... in turn; two 10-token
    requests decoding 8 tokens each, added together."""
    layout = LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4, (("num_speculative_blocks", 3),))),
                        hash_block_size=4, num_blocks=41)
    draw = SchedulerDraw(layout, max_num_batched_tokens=16, max_num_seqs=2, model_runner="v1",
                         async_scheduling=async_scheduling, speculative_method="eagle" if async_scheduling else "ngram",
                         num_speculative_tokens=3, draft_acceptance=(1, 0, 3, 2))
    return FixedRun(draw, (FixedPrompt(tuple(range(10)), 8), FixedPrompt(tuple(range(50, 60)), 8)))


SPECULATING = {False: _speculating(False), True: _speculating(True)}

# Planted bug -> the fixed run that shows it caught.
FIXED_RUNS: dict[str, FixedRun] = {
    # Three 10-token requests decoding 12 each on a producer's 8-block pool
    # under async scheduling: vLLM defers no frees for a producer, so it
    # preempts requests whose step is still running.
    "delivers_stale_output": FixedRun(
        _full_attention(9, max_num_batched_tokens=16, max_num_seqs=3, async_scheduling=True, kv_role="kv_producer"),
        distinct_prompts(3, 10, 12), label="stale output of a request preempted during its step"),
    # Two requests decoding 3 tokens each.
    "max_tokens_skip_unguarded": FixedRun(_full_attention(12, max_num_batched_tokens=16), distinct_prompts(2, 10, 3)),
    # What the cache announces (invariants/promises.py).
    "eviction_announces_nothing": dataclasses.replace(
        _ONE_AFTER_ANOTHER, config=dataclasses.replace(_ONE_AFTER_ANOTHER.config, kv_events=True),
        events=(("BlockRemoved", 2),)),
    # A 13-token prompt decoding 6 tokens: a block its decode fills is cached
    # (and announced) after the prompt's three.
    "stored_event_names_itself_parent": FixedRun(
        _full_attention(9, kv_events=True), distinct_prompts(1, 13, 6), events=(("BlockStored", 2),)),
    "reset_announces_nothing": dataclasses.replace(
        _RESET, config=dataclasses.replace(_RESET.config, kv_events=True), events=(("AllBlocksCleared", 1),)),
    # A 13-token prompt decoding 6 tokens: four blocks announced, each with
    # tokens (the fourth filled by the decode).
    "stored_event_tokens_shifted": FixedRun(
        _full_attention(9, kv_events=True), distinct_prompts(1, 13, 6), events=(("BlockStored", 2),)),
    # One 13-token prompt under adapter b: its 3 blocks announced with the adapter.
    "stored_event_drops_lora": FixedRun(
        _full_attention(17, max_loras=1, kv_events=True), _repeated(1, lora="adapter-b"), events=(("BlockStored", 1),)),
    # One prompt sent by tenant a, tenant b, an unsalted client and tenant a
    # again: only the last may hit, and does.
    "cache_salt_not_hashed": FixedRun(
        _full_attention(17), tuple(p for salt in ("tenant-a", "tenant-b", None, "tenant-a")
                                   for p in _repeated(1, cache_salt=salt)),
        one_after_another=True, hits=(0, 0, 0, 12)),
    # LoRA on: the base model, then adapter b twice: only the last may hit.
    "lora_not_hashed": FixedRun(
        _full_attention(17, max_loras=1), tuple(p for lora in (None, "adapter-b", "adapter-b")
                                                for p in _repeated(1, lora=lora)),
        one_after_another=True, hits=(0, 0, 12)),
    # Prompt embeddings a, b, a (vLLM records zeros as the tokens of all
    # three): only the last may hit.
    "embeds_not_hashed": FixedRun(
        _full_attention(17), tuple(p for tag in ("embeds-a", "embeds-b", "embeds-a") for p in _repeated(1, embeds=tag)),
        one_after_another=True, hits=(0, 0, 12)),
    # An image at positions 2 to 7: image a, image b, image a, no image: only
    # the third may hit (the encoder budget comes with the requests).
    "mm_not_hashed": FixedRun(
        _full_attention(17), tuple(p for image in ("image-a", "image-b", "image-a", None)
                                   for p in _repeated(1, mm=((image, 2, 6),) if image else ())),
        one_after_another=True, hits=(0, 0, 12, 0)),
    "reset_keeps_index": _RESET,
    "lookahead_not_allocated": SPECULATING[True],
    # Async scheduling, an 8-token sliding window beside full attention: one
    # 10-token prompt decoding 12. Each decode step still in flight reads its
    # window while the next is scheduled; every block boundary the window
    # crosses frees one.
    "window_frees_in_flight": FixedRun(
        _full_attention(33, SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 8),)), async_scheduling=True),
        distinct_prompts(1, 10, 12)),
    "preempt_keeps_computed_tokens": _PREEMPTING,
    # ... with ngram speculation (2 drafts, one accepted a step): a request
    # is preempted with the drafts proposed after its last step.
    "preempt_keeps_drafts": dataclasses.replace(_PREEMPTING, config=dataclasses.replace(
        _PREEMPTING.config, speculative_method="ngram", num_speculative_tokens=2, draft_acceptance=(1,))),
    # How long a hit each lookup serves, which cached blocks survive (invariants/hits.py).
    "hit_stops_a_block_early": _REPEATED,
    # The first request's free drops its 3 full blocks' keys: the resend hits 0, not 12.
    "free_forgets_keys": _REPEATED,
    # Prefix caching off: the resend hits nothing, and the index must stay empty.
    "caches_with_caching_off": dataclasses.replace(
        _REPEATED, config=dataclasses.replace(_REPEATED.config, prefix_caching=False), hits=(0, 0)),
    # A 5-token window needs the last block before a hit, and the group keeps
    # only that one cached; an 8-token chunk needs the blocks of the hit's last chunk.
    "window_hit_needs_a_block_more": _beside(SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 5),))),
    "chunk_hit_stops_a_block_early": _beside(SpecDraw("ChunkedLocalAttentionSpec", 4, (("attention_chunk_size", 8),))),
    # An async EAGLE drafter (k = 2): a 13-token prompt, then a 17-token one
    # sharing its first 9 tokens; the second lookup reaches the 2 shared
    # blocks and the drop leaves 1, as the index allows (no entry past the
    # second proves the token after it).
    "eagle_drop_forgotten": FixedRun(
        _full_attention(33, model_runner="v1", async_scheduling=True, speculative_method="eagle",
                        num_speculative_tokens=2, draft_acceptance=(1,)),
        (FixedPrompt(tuple(range(13)), 2), FixedPrompt((*range(9), *[99] * 8), 2)), one_after_another=True,
        hits=(0, 4)),
    # Full attention, Mamba and an 8-token window under EAGLE (k = 1), 4
    # tokens a step: a 12-token prompt, then an 11-token one sharing its
    # first 8. The hybrid coordinator's fixed point takes more than one pass
    # on three specs; the second lookup hits 4 (8 would need the entry at 12
    # as its proof).
    "eagle_drop_reapplied": FixedRun(
        _full_attention(65, SpecDraw("MambaSpec", 4), SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 8),)),
                        max_num_batched_tokens=4, max_num_seqs=1, speculative_method="eagle",
                        num_speculative_tokens=1, draft_acceptance=(1,)),
        (FixedPrompt(tuple(range(12)), 1), FixedPrompt((*range(8), 900, 901, 902), 1)), one_after_another=True,
        hits=(0, 4)),
    "free_evicts_head_first": dataclasses.replace(_ONE_AFTER_ANOTHER, label="cached block evicted"),
    # What a Mamba state block holds, what the index names (invariants/contents.py).
    # Full attention and Mamba (align mode), two requests for one 13-token
    # prompt added together: the first computes it in one step, and vLLM
    # holds the second back (a Mamba state cached in the step that writes it
    # is not adopted in that step) until it can hit 12 and start there.
    "mamba_adopts_same_step_state": FixedRun(_full_attention(40, SpecDraw("MambaSpec", 4)), _repeated(2),
                                             hits=(0, 12)),
    # ... one-token hashes (sub-block hits): a 6-token prompt sent twice. The
    # first stops its prefill at its partial-tail boundary (5), where vLLM
    # caches the state under the 5-token key, then moves that entry to a copy
    # before the next chunk writes on; the second hits those 5 tokens.
    "mamba_tail_state_overwritten": FixedRun(
        SchedulerDraw(LayoutDraw((SpecDraw("FullAttentionSpec", 4), SpecDraw("MambaSpec", 4)), hash_block_size=1,
                                 num_blocks=40), max_num_batched_tokens=32, max_num_seqs=1),
        _repeated(2, length=6, max_tokens=3), one_after_another=True, hits=(0, 5)),
    "evicted_key_stays_indexed": _ONE_AFTER_ANOTHER,
    # The connector hand-off (invariants/handoff.py): two requests decoding 3
    # tokens each on a producer, which holds each finished request's blocks
    # until its send is reported done.
    "hands_off_one_block_short": FixedRun(_full_attention(17, kv_role="kv_producer"), distinct_prompts(2, 10, 3)),
    # Three 13-token prompts at once, 8 tokens a step, an encoder cache of 8
    # embeddings: the first computes image a (positions 6-11) and finishes,
    # the second reads the cached output through steps 3 and 4, the third's
    # image b (2-7) needs room in step 4. Unmodified, the second's reference
    # keeps image a, and the third stops before its image; planted, image a
    # is evicted and freed in the step the second still reads it.
    "encoder_entry_stays_freeable": FixedRun(
        _full_attention(33, max_num_batched_tokens=8, max_num_seqs=3),
        (FixedPrompt(tuple(range(13)), 1, mm=(("image-a", 6, 6),)),
         FixedPrompt((50, *range(1, 13)), 1, mm=(("image-a", 6, 6),)),
         FixedPrompt(tuple(range(100, 113)), 1, mm=(("image-b", 2, 6),)))),
    # A lone 4-token sliding window (a hit needs only the block before it):
    # two 13-token prompts that differ in their first block only. The second
    # must miss; with a key blind to its parent it adopts the first one's
    # third block and reads its window there: positions 9-11, the same tokens
    # at the same positions, computed under another first block.
    "hash_ignores_parent": FixedRun(
        SchedulerDraw(LayoutDraw((SpecDraw("SlidingWindowSpec", 4, (("sliding_window", 4),)),), hash_block_size=4,
                                 num_blocks=17), max_num_batched_tokens=32, max_num_seqs=2),
        (FixedPrompt((1, 2, 3, 4, *range(10, 18), 5), 2), FixedPrompt((7, 7, 7, 7, *range(10, 18), 6), 2)),
        one_after_another=True, hits=(0, 0)),
}

# Every request's fate (invariants/fate.py). The preempting run: its third
# request's first allocation fails (9 blocks hold two of them). Two
# sequences, two 13-token prompts whose connector cannot answer the first
# time it is asked: the waiting loop skips (defers) both, and admits both at
# the next step.
FIXED_RUNS["lost_when_pool_full"] = _PREEMPTING
FIXED_RUNS["deferred_requests_take_slots"] = FixedRun(_full_attention(17), tuple(
    dataclasses.replace(p, reply=ExternalReply("undecided", undecided=1)) for p in distinct_prompts(2, 13, 2)))
