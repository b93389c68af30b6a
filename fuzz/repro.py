"""Standalone repros a vLLM contributor can paste into vLLM's test suite.

A repro is a pytest file in vLLM's ``tests/v1/core`` idiom that imports vLLM
only (never this project), rebuilds the shrunk scenario with vLLM's own
constructors, and asserts the expected behaviour of the failing call. It fails
on the vLLM that produced it and passes once the bug is fixed.
"""

from __future__ import annotations

import textwrap

from fuzz import adapter
from fuzz.model import SpecDraw, TruncationObservation
from invariants._common import group_behaviour
from invariants.classification import Behaviour
from invariants.truncation import loud_failure_expected
from strategies.scenarios import TruncationScenario

__all__ = ["repro_header", "truncation_repro", "truncation_repro_from_last_run"]


def repro_header(*, title: str, vllm_version: str, target: str, seed: object, invariant: str, violation: str, scenario: str) -> str:
    first = violation.strip().splitlines()[0] if violation.strip() else ""
    return (
        '"""' + title + "\n\n"
        "Found and shrunk by the kvtrunc-fuzz property suite.\n\n"
        f"vLLM version: {vllm_version}\n"
        f"target: {target}\n"
        f"seed: {seed}\n"
        f"invariant: {invariant}\n"
        f"violation: {first}\n\n"
        "Scenario (as drawn):\n"
        + textwrap.indent(textwrap.fill(scenario, 88), "    ")
        + '\n"""\n'
    )


def _value_code(value: object) -> str:
    """Python source for a constructor argument the adapter chose."""
    if isinstance(value, SpecDraw):
        return _spec_code(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_value_code(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        items = [_value_code(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return repr(value)  # ints, strings, and torch dtypes (repr: torch.float32)


def _spec_code(draw: SpecDraw) -> str:
    """The spec's constructor call, with exactly the arguments the adapter
    builds it with (one source: :func:`fuzz.adapter.spec_constructor`)."""
    cls, kwargs = adapter.spec_constructor(draw)
    return f"{cls.__name__}(" + ", ".join(f"{k}={_value_code(v)}" for k, v in kwargs.items()) + ")"


def _kinds(draws: tuple[SpecDraw, ...]) -> set[str]:
    out: set[str] = set()
    for d in draws:
        out.add(d.kind)
        out |= _kinds(d.inner)
    return out


def _expected_lengths(obs: TruncationObservation) -> list[int]:
    lengths = []
    for g in obs.groups:
        need = obs.endpoint // g.info.block_size
        behaviour = group_behaviour(g.info)
        if behaviour is Behaviour.MUST_COVER:
            lengths.append(need)
        elif behaviour is Behaviour.MAY_BE_SHORT:
            lengths.append(min(need, len(g.input_before)))
        else:
            lengths.append(0)
    return lengths


_BODY = '''

def _make_request(request_id, token_ids):
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=get_request_block_hasher(HASH_BLOCK_SIZE, sha256),
    )


def _make_manager():
    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([f"layer.{{i}}"], spec) for i, spec in enumerate(SPECS)
        ],
    )
    # What the engine core hands the scheduler.
    config = generate_scheduler_kv_cache_config([config])
{eagle_setup}    return KVCacheManager(
        config,
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZE,
        enable_caching=True,{eagle_kwargs}
    )


def _prefill_and_free(manager, request, chunk):
    """Cache a prompt the way the scheduler does: allocate chunk by chunk, free."""
    blocks, num_hit, _ = manager.get_computed_blocks(request)
    computed, first = num_hit, True
    while computed < request.num_tokens:
        num_new = min(chunk or request.num_tokens, request.num_tokens - computed)
        new = manager.allocate_slots(
            request, num_new, num_hit if first else 0, blocks if first else None
        )
        if new is None:  # pool exhausted: LRU pressure
            break
        first = False
        computed += num_new
        request.num_computed_tokens = computed
        manager.new_step_starts()
    manager.free(request)
    manager.new_step_starts()


def _per_group_hit(manager, request):
    limit = request.num_tokens - 1
{per_group_lookup}
    return manager.create_kv_cache_blocks(tuple(blocks))


def test_truncate_computed_blocks_repro():
    init_none_hash(sha256)
    manager = _make_manager()
    for i, tokens in enumerate(PROMPTS):
        _prefill_and_free(manager, _make_request(f"prompt-{{i}}", tokens), PREFILL_CHUNK)

    # Diverge the per-group hits: drop each group's cached tail from EVICT_FROM on.
    replay = _make_request("replay", REPLAY)
    victims = set()
    for group, cut in enumerate(EVICT_FROM):
        cached = [b.block_id for b in _per_group_hit(manager, replay).blocks[group] if not b.is_null]
        if cut is not None and cached:
            victims.update(cached[cut % (len(cached) + 1):])
    manager.evict_blocks(victims)

    blocks = {lookup}
    before = [[(id(b), b.block_id, b.ref_cnt, b.block_hash) for b in g] for g in blocks.blocks]
    free_before = manager.block_pool.get_num_free_blocks()
{call}
    # The input view is untouched: same blocks, refcounts and hashes; no pool change.
    after = [[(id(b), b.block_id, b.ref_cnt, b.block_hash) for b in g] for g in blocks.blocks]
    assert after == before
    assert manager.block_pool.get_num_free_blocks() == free_before
'''

# One group: vLLM's unitary coordinator, whose joint hit is the group's hit;
# several: the hybrid coordinator's per-group lookup.
_PER_GROUP = {
    False: "    blocks = manager.coordinator.find_longest_cache_hit(request.block_hashes, limit)[0]",
    True: "    blocks, _ = manager.coordinator.find_longest_cache_hit_per_group(request.block_hashes, limit)",
}

# The engine's planning flags the groups holding draft layers.
_EAGLE_SETUP = """    for i, group in enumerate(config.kv_cache_groups):
        group.is_eagle_group = i in DRAFT_GROUPS
"""


def _eagle_kwargs(scenario: TruncationScenario) -> str:
    """The manager's extra keyword arguments for the scenario's drafter, as
    the adapter passes them (one source: :func:`fuzz.adapter.eagle_manager_kwargs`)."""
    if scenario.eagle is None:
        return ""
    kwargs = adapter.eagle_manager_kwargs(True)
    return "".join(
        f"\n        {k}=USE_EAGLE," if k == "use_eagle" else f"\n        {k}={v!r},"
        for k, v in kwargs.items()
    )


_LOOKUPS = {
    "joint": "manager.get_computed_blocks(replay)[0]",
    "per_group": "_per_group_hit(manager, replay)",
    "connector": "manager.get_computed_blocks_for_connector(replay)[0]",
}


def truncation_repro(
    scenario: TruncationScenario,
    obs: TruncationObservation,
    *,
    target: str,
    seed: object,
    invariant: str,
    violation: str,
) -> str:
    """The source of a standalone pytest file reproducing ``obs``."""
    kinds = sorted(_kinds(scenario.layout.groups) | {"KVCacheConfig", "KVCacheGroupSpec"})
    header = repro_header(
        title=f"Repro: truncate_computed_blocks violates '{invariant}'.",
        vllm_version=obs.vllm_version,
        target=target,
        seed=seed,
        invariant=invariant,
        violation=violation,
        scenario=repr(scenario),
    )
    lines = [
        header,
        "import pytest",
        "import torch",
        "",
        "from vllm.sampling_params import SamplingParams",
        "from vllm.utils.hashing import sha256",
        "from vllm.v1.core.kv_cache_manager import KVCacheManager",
        "from vllm.v1.core.kv_cache_utils import (",
        "    generate_scheduler_kv_cache_config,",
        "    get_request_block_hasher,",
        "    init_none_hash,",
        ")",
        "from vllm.v1.kv_cache_interface import (",
        *[f"    {k}," for k in kinds],
        ")",
        "from vllm.v1.request import Request",
        "",
        f"SPECS = [",
        *[f"    {_spec_code(g)}," for g in scenario.layout.groups],
        "]",
        f"HASH_BLOCK_SIZE = {scenario.layout.hash_block_size}",
        f"SCHEDULER_BLOCK_SIZE = {scenario.layout.scheduler_block_size}  # LCM of the group block sizes",
        f"NUM_BLOCKS = {scenario.layout.num_blocks}",
        f"MAX_MODEL_LEN = {scenario.layout.max_model_len}",
        f"PREFILL_CHUNK = {scenario.prefill_chunk}",
        f"PROMPTS = [",
        *[f"    {scenario.prompt_tokens(i)}," for i in range(len(scenario.prompts))],
        "]",
        f"REPLAY = {scenario.replay_tokens()}",
        f"EVICT_FROM = {list(scenario.evict_from)}",
        f"ENDPOINT = {obs.endpoint}",
    ]
    if loud_failure_expected(obs):
        call = (
            "    # A must-cover (attention-like) group is short, or the endpoint is\n"
            "    # misaligned: the call must fail loudly.\n"
            "    with pytest.raises(AssertionError):\n"
            "        manager.truncate_computed_blocks(blocks, ENDPOINT)\n"
        )
    else:
        expected = _expected_lengths(obs)
        notes = []
        for g, n in zip(obs.groups, expected):
            name = g.info.spec_class.rsplit(".", 1)[-1]
            notes.append(
                f"    #   group {g.info.index} {name}: block {g.info.block_size}, "
                f"{len(g.input_before)} in, expect {n}"
            )
        call = (
            "    # Attention-like groups return ENDPOINT // block_size blocks, Mamba\n"
            "    # groups min(that, what they hold), scratch groups none:\n"
            + "\n".join(notes)
            + "\n    result = manager.truncate_computed_blocks(blocks, ENDPOINT)\n"
            f"    assert [len(g) for g in result.blocks] == {expected}\n"
            "    for got, given in zip(result.blocks, blocks.blocks):\n"
            "        assert all(a is b for a, b in zip(got, given))  # a prefix view\n"
        )
    if scenario.eagle is not None:
        lines += [
            "# An EAGLE-style drafter (EAGLE, EAGLE3, MTP): the scheduler builds the",
            "# manager with use_eagle=True, so lookups drop the last matched block of",
            "# the draft groups (is_eagle_group; none flagged: vLLM flags every group).",
            "USE_EAGLE = True",
            f"DRAFT_GROUPS = {list(scenario.eagle.draft_groups)}",
        ]
    body = _BODY.replace("{{", "{").replace("}}", "}")
    body = body.replace("{eagle_setup}", _EAGLE_SETUP if scenario.eagle is not None else "")
    body = body.replace("{eagle_kwargs}", _eagle_kwargs(scenario))
    body = body.replace("{lookup}", _LOOKUPS[scenario.lookup_mode]).replace("{call}", call)
    body = body.replace("{per_group_lookup}", _PER_GROUP[len(scenario.layout.groups) > 1])
    return "\n".join(lines) + "\n" + body


def truncation_repro_from_last_run(
    *, target: str, seed: object, invariant: str, violation: str, failure: BaseException | None = None
) -> str | None:
    """The repro of the last truncation scenario run in this process (the
    minimal example, since Hypothesis replays it last), if it got as far as
    the truncation call. (``failure``: the registry's writers all take it;
    a truncation run's record is still the runner's LAST_RUN.)"""
    from fuzz.runners.truncation import LAST_RUN

    if "observation" not in LAST_RUN:
        return None
    return truncation_repro(
        LAST_RUN["scenario"],  # type: ignore[arg-type]
        LAST_RUN["observation"],  # type: ignore[arg-type]
        target=target,
        seed=seed,
        invariant=invariant,
        violation=violation,
    )
