"""The engine-reachable strategy against vLLM's own planning.

* For named real model configurations, the planner
  (``fuzz.adapter.plan_engine``, no model built) gives the same scheduler
  KV-cache config as vLLM's planning run over the model's real layers built
  on the meta device (tests/strategies/_engine_reference.py, in its own process).
* What the strategy draws is what the planner plans, and the scheduler the
  harness builds holds that same config.
* ``strategies.scheduler.engine_layout`` (the hand-written model the
  scheduler-API targets still use) agrees with the real path on every group
  block size; where it departs (the hash unit) is pinned here.
* Planted: a planner that got one fact wrong (the Mamba block size, the
  sliding-window block) is caught by the comparison.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

from fuzz.adapter import missing_capabilities
from fuzz.adapter import _engine_plan
from fuzz.adapter._engine_plan import InvalidLayout, plan_engine, planned_layout
from fuzz.model import ENGINE_REACHABLE, SCHEDULER_API, SchedulerDraw
from fuzz.registry import TARGETS, default_targets
from strategies.engine_models import _REFUSED, engine_scheduler_draws, named_engine_models
from strategies.scheduler import engine_layout

pytestmark = pytest.mark.skipif(
    bool(missing_capabilities(("engine-planning",))), reason="; ".join(missing_capabilities(("engine-planning",)))
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "strategies"))
from _engine_reference import MAX_MODEL_LEN, NUM_BLOCKS, summary  # noqa: E402
from tests.support.harnesses import harness_of

# The named configurations whose real layers build on the meta device here
# (Qwen3-Next's GDN layer asks the platform for a device; GPT-OSS's sink
# attention needs the FlashAttention extension): NemotronH with and without
# a prefix-match unit, Jamba, Gemma-3.
BUILT = (
    "nemotron-h (pattern M-M-M*-M, prefix caching)",
    "nemotron-h --prefix-match-unit 8",
    "jamba (1 attention in 8)",
    "gemma-3 (5 sliding : 1 full)",
)


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, object]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "strategies" / "_engine_reference.py"), *BUILT],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("REFERENCE ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("REFERENCE "):])


def _planned(name: str) -> dict[str, object]:
    plan = plan_engine(named_engine_models()[name], num_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN)
    return summary(plan.kv_config, plan.scheduler_block_size, plan.hash_block_size)


@pytest.mark.parametrize("name", BUILT)
def test_planner_matches_vllm_planning_over_real_layers(reference: dict[str, dict[str, object]], name: str) -> None:
    assert _planned(name) == reference[name]


def test_a_wrong_planner_is_caught(reference: dict[str, dict[str, object]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: Mamba layers keep the user's block size instead of the
    aligned one (what the hand-written engine_layout once assumed)."""
    real = _engine_plan._layer_specs

    def unaligned(vllm_config, layers):  # type: ignore[no-untyped-def]
        specs = real(vllm_config, layers)
        return {
            n: dataclasses.replace(s, block_size=16) if type(s).__name__ == "MambaSpec" else s
            for n, s in specs.items()
        }

    monkeypatch.setattr(_engine_plan, "_layer_specs", unaligned)
    name = BUILT[0]
    # vLLM plans the wrong layers without complaint (the hash unit follows
    # the smaller Mamba block); only the comparison with the real layers
    # can catch it, and it must be the Mamba groups that disagree.
    planned = _planned(name)
    assert planned != reference[name]
    differing = [mine for mine, real in zip(planned["groups"], reference[name]["groups"]) if mine != real]
    assert differing and all("MambaSpec(block_size=16," in spec for spec, _ in differing), differing


@pytest.mark.parametrize("name", sorted(named_engine_models()))
def test_every_named_configuration_plans_and_builds(name: str) -> None:
    """Every named configuration (those whose layers cannot be built here
    too) plans, and the harness's scheduler holds exactly the plan."""
    engine = named_engine_models()[name]
    layout = dataclasses.replace(planned_layout(engine), num_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN)
    harness = harness_of(layout, engine=engine)
    plan = plan_engine(engine, num_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN)
    assert [g.kv_cache_spec for g in harness.kv_cache_config.kv_cache_groups] == [
        g.kv_cache_spec for g in plan.kv_config.kv_cache_groups
    ]
    assert (harness.scheduler_block_size, harness.hash_block_size) == (
        plan.scheduler_block_size,
        plan.hash_block_size,
    )


def test_drawn_layouts_are_the_plans() -> None:
    """The strategy sizes prompts by the layout the engine plans for the
    drawn model and flags (ngram speculation included: its Mamba state
    blocks), and labels the draw engine-reachable. A configuration vLLM
    refuses to plan carries the strategy's placeholder layout; planning it
    again must raise ``InvalidLayout`` (vLLM's verdict), and most draws must
    plan, so the comparison is not vacuous."""
    seen = {"planned": 0, "refused": 0}

    @settings(max_examples=40, database=None)
    @given(config=engine_scheduler_draws())
    def check(config: SchedulerDraw) -> None:
        assert config.engine is not None
        assert config.reach[0] == ENGINE_REACHABLE
        try:
            plan = plan_engine(config.engine, draw=config)
        except InvalidLayout:
            seen["refused"] += 1
            assert config.layout == _REFUSED, f"vLLM refused {config.engine!r} but the draw holds {config.layout!r}"
            return
        seen["planned"] += 1
        assert config.layout.groups == plan.layout().groups
        assert config.layout.hash_block_size == plan.hash_block_size

    check()
    assert seen["planned"] >= 10 and seen["planned"] >= seen["refused"], seen


@pytest.mark.parametrize("name", sorted(named_engine_models()))
def test_engine_layout_against_the_real_path(name: str) -> None:
    """engine_layout (the scheduler-API targets' model of the engine) keeps
    every group block size the engine plans: Mamba groups already sit on the
    smallest attention block (align mode sets mamba_block_size to the
    attention block). It departs on the hash unit only: where the engine's
    unit leaves fewer than four units per Mamba block it picks a finer one,
    which is what an operator's smaller --prefix-match-unit gives; the unit
    it picks always divides every block."""
    real = planned_layout(named_engine_models()[name])
    modelled = engine_layout(real)
    assert modelled.groups == real.groups
    assert modelled.hash_block_size <= real.hash_block_size
    assert all(g.block_size % modelled.hash_block_size == 0 for g in real.groups)
    mamba = [g.block_size for g in real.groups if g.kind == "MambaSpec"]
    if mamba and len(real.groups) > 1 and mamba[0] // real.hash_block_size >= 4:
        assert modelled.hash_block_size == real.hash_block_size


def test_targets_are_labelled() -> None:
    """Every scheduler target says which kind its findings are, and why;
    both kinds run by default."""
    scheduler = [t for t in TARGETS.values() if t.name.startswith("scheduler-")]
    assert {t.reach for t in scheduler} == {ENGINE_REACHABLE, SCHEDULER_API}
    assert all(t.reach_reason for t in scheduler)
    defaults = {t.reach for t in default_targets()}
    assert {ENGINE_REACHABLE, SCHEDULER_API} <= defaults


# -- the leads (docs/leads.md) -------------------------------------------------

_NEMOTRON_TWO_FA = dict(
    architectures=["NemotronHForCausalLM"], model_type="nemotron_h", num_hidden_layers=3,
    hybrid_override_pattern="M**", mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1,
    conv_kernel=4, expand=1, chunk_size=64, intermediate_size=128, hidden_size=64, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, vocab_size=1024, max_position_embeddings=4096,
)


def _harness(engine):  # type: ignore[no-untyped-def]
    layout = dataclasses.replace(planned_layout(engine), num_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN)
    return harness_of(layout, engine=engine)


def test_engine_full_attention_groups_are_looked_up_together() -> None:
    """Lead "a lagging second full-attention group": an engine gives every
    full-attention layer one spec, so a model with more full-attention layers
    than one group holds (NemotronH "M**": one Mamba layer, two attention
    layers, groups of one layer) gets several full-attention groups with the
    same spec, and the coordinator looks them up as one entry: one hit for
    all, so none can lag another."""
    from fuzz.model import EngineDraw

    harness = _harness(EngineDraw.of("nemotron-h", _NEMOTRON_TWO_FA, prefix_match_unit=4))
    groups = harness.kv_cache_config.kv_cache_groups
    fa = [i for i, g in enumerate(groups) if type(g.kv_cache_spec).__name__ == "FullAttentionSpec"]
    assert len(fa) == 2
    assert groups[fa[0]].kv_cache_spec == groups[fa[1]].kv_cache_spec
    entries = [tuple(e.group_ids) for e in harness.manager.coordinator.attention_groups]
    assert tuple(fa) in entries, entries


def test_engine_sliding_window_hybrid_has_no_divergent_path() -> None:
    """Lead "a lagging sliding-window group handed to a divergence-capable
    connector": the only shipped hybrid with sliding-window attention layers
    (NemotronH, ``config.sliding_window``) applies the window to every
    attention layer, so there is no full-attention group and the per-group
    (divergent) lookup is off: ``get_computed_blocks_for_connector`` returns
    the joint hit and never reports a divergence."""
    from fuzz.model import EngineDraw

    engine = EngineDraw.of("nemotron-h", dict(_NEMOTRON_TWO_FA, sliding_window=32), prefix_match_unit=4)
    harness = _harness(engine)
    kinds = {type(g.kv_cache_spec).__name__ for g in harness.kv_cache_config.kv_cache_groups}
    assert kinds == {"MambaSpec", "SlidingWindowSpec"}
    assert harness.manager.coordinator.full_attention_group_id is None


@pytest.mark.parametrize(("target", "reach"), [("scheduler-engine-reachable", ENGINE_REACHABLE), ("scheduler-single-shot", SCHEDULER_API)])
def test_finding_sidecars_carry_the_reach_label(tmp_path: Path, target: str, reach: str) -> None:
    from fuzz.campaign.findings import Findings

    findings = Findings(repro_dir=tmp_path, start=0.0, campaign_seed=None, worker="w0", vllm_version="0.33.0")
    try:
        raise ValueError("planted failure")
    except ValueError as exc:
        meta = findings.record(target, 0, exc)
    assert meta is not None
    assert meta["reach"] == reach and meta["reach_reason"] == TARGETS[target].reach_reason
    written = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert written["reach"] == reach
