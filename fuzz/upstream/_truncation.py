"""A truncation-tier finding as a test in vLLM's idiom, for vLLM's
``tests/v1/core``: the KV-cache config and ``KVCacheManager`` built with
vLLM's own classes (as the layout was drawn), the lookup's hit that the
failing run handed over, written as the pool's concrete blocks per group,
one ``truncate_computed_blocks`` call, and what it must do, asserted as
concrete block ids, refcounts and free counts.

``truncate_computed_blocks`` is pure slicing of what it is given: the file
builds the hit from the pool's blocks by id instead of caching prompts and
evicting (the run's scenario is quoted in the docstring). The expected
values come from the suite's own model of the call (the spec-kind table's
behaviour of each group, :func:`fuzz.model.group_behaviour`), never from
vLLM. Generated Python is built as plain statements (style rule 17).
"""

from __future__ import annotations

import inspect
import textwrap

from fuzz import adapter
from fuzz.model import (
    Behaviour,
    InvariantViolation,
    SpecDraw,
    TruncationObservation,
    TruncationScenario,
    group_behaviour,
    group_kind,
)
from invariants.table import INVARIANTS
from invariants.truncation import loud_failure_expected

__all__ = ["spec_code", "truncation_repro", "truncation_repro_of_failure"]

_INTERFACE = "vllm.v1.kv_cache_interface"


def _value_code(value: object) -> str:
    """Python source for a constructor argument the adapter chose."""
    if isinstance(value, SpecDraw):
        return spec_code(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_value_code(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        items = [_value_code(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return repr(value)  # ints, strings, and torch dtypes (repr: torch.float32)


def spec_code(draw: SpecDraw) -> str:
    """The spec's constructor call, with exactly the arguments the adapter
    builds it with (one source: :func:`fuzz.adapter.spec_constructor`)."""
    cls, kwargs = adapter.spec_constructor(draw)
    return f"{cls.__name__}(" + ", ".join(f"{k}={_value_code(v)}" for k, v in kwargs.items()) + ")"


def _classes(draws: tuple[SpecDraw, ...]) -> set[str]:
    out: set[str] = set()
    for d in draws:
        out.add(adapter.spec_constructor(d)[0].__name__)
        out |= _classes(d.inner)
    return out


def _claim(invariant: str) -> str:
    for row in INVARIANTS:
        if row.name == invariant and row.tier == "truncation":
            return " ".join((inspect.getdoc(row.check) or invariant).split("\n\n")[0].split())
    return invariant


def _group_lines(i: int, spec: str) -> list[str]:
    """A group of the config: on one line where it fits, else its spec's
    arguments a line each."""
    line = f'            KVCacheGroupSpec(["layer{i}"], {spec}),'
    if len(line) <= 100:
        return [line]
    name, _, args = spec.partition("(")
    parts, depth, start = [], 0, 0
    for at, c in enumerate(args[:-1]):
        depth += (c in "([{") - (c in ")]}")
        if c == "," and depth == 0:
            parts.append(args[start:at].strip())
            start = at + 1
    parts.append(args[start:-1].strip())
    return [f'            KVCacheGroupSpec(["layer{i}"], {name}(',
            *[f"                {p}," for p in parts], "            )),"]


def _blocks(ids: list[int | None]) -> str:
    return "[" + ", ".join("pool.null_block" if i is None else f"pool.blocks[{i}]" for i in ids) + "]"


def _expected(obs: TruncationObservation) -> list[list[int]]:
    """Each group's block ids after the call, by the model: attention-like
    groups keep endpoint // block_size, Mamba min(that, what they hold),
    scratch groups none."""
    out = []
    for g in obs.groups:
        need = obs.endpoint // g.info.block_size
        behaviour = group_behaviour(g.info)
        keep = need if behaviour is Behaviour.MUST_COVER else min(need, len(g.input_before)) \
            if behaviour is Behaviour.MAY_BE_SHORT else 0
        out.append([b.block_id for b in g.input_before[:keep]])
    return out


def truncation_repro(scenario: TruncationScenario, obs: TruncationObservation, *, invariant: str,
                     vllm_version: str | None = None) -> str:
    """The source of a pytest file in vLLM's idiom that makes ``obs``'s call
    again on its concrete hit and asserts what the model says it returns."""
    layout, eagle = scenario.layout, scenario.eagle
    n = obs.endpoint
    imports = {"vllm.v1.core.kv_cache_manager": {"KVCacheManager"},
               "vllm.v1.core.kv_cache_utils": {"generate_scheduler_kv_cache_config"},
               _INTERFACE: {"KVCacheConfig", "KVCacheGroupSpec"} | _classes(layout.groups)}
    specs = [spec_code(g) for g in layout.groups]
    uses_torch = any("torch." in s for s in specs)
    b = [f"def test_truncate_computed_blocks_{invariant.replace('-', '_')}():",
         textwrap.fill(_claim(invariant), 92, initial_indent='    """', subsequent_indent="    ") + '"""',
         "    config = generate_scheduler_kv_cache_config([KVCacheConfig(",
         f"        num_blocks={layout.num_blocks},",
         "        kv_cache_tensors=[],",
         "        kv_cache_groups=[",
         *[line for i, s in enumerate(specs) for line in _group_lines(i, s)],
         "        ],",
         "    )])"]
    drafter = ""
    if eagle is not None:
        b.append("    # An EAGLE-style drafter: the manager built with use_eagle"
                 + (", its draft groups flagged." if eagle.draft_groups else " (no group flagged: vLLM drops on each)."))
        b += [f"    config.kv_cache_groups[{i}].is_eagle_group = True" for i in eagle.draft_groups]
        drafter = ", " + ", ".join(f"{k}={v!r}" for k, v in adapter.eagle_manager_kwargs(True).items())
    b += [(f"    manager = KVCacheManager(config, max_model_len={layout.max_model_len}, "
           f"scheduler_block_size={layout.scheduler_block_size},"),
          f"                             hash_block_size={layout.hash_block_size}, enable_caching=True{drafter})",
          "    pool = manager.block_pool",
          "",
          "    # The lookup's hit, as the failing run handed it over (the pool's blocks by id):"]
    given = [[None if r.is_null else r.block_id for r in g.input_before] for g in obs.groups]
    b += [f"    #   group {g.info.index}: {group_kind(g.info)}, block_size {g.info.block_size}, "
          f"{len(g.input_before)} block(s)" for g in obs.groups]
    b += ["    hit = manager.create_kv_cache_blocks((", *[f"        {_blocks(ids)}," for ids in given], "    ))"]
    if loud_failure_expected(obs):
        b += [f"    # A must-cover group holds fewer than {n} tokens, or {n} is not a multiple of a",
              "    # prefix-cacheable group's block size: the call must fail loudly.",
              "    with pytest.raises(AssertionError):",
              f"        manager.truncate_computed_blocks(hit, {n})"]
    else:
        expected = _expected(obs)
        b += [f"    result = manager.truncate_computed_blocks(hit, {n})",
              f"    # Attention-like groups keep {n} // block_size blocks, Mamba groups min(that, what",
              "    # they hold), scratch groups none: a prefix of each group's input.",
              "    kept = [[b.block_id for b in group] for group in result.blocks]",
              f'    assert kept == {expected}, f"truncate_computed_blocks(hit, {n}) kept {{kept}}"']
    held = [r.block_id for g in obs.groups for r in g.input_before if not r.is_null]
    b += ["    # Pure slicing: the input, its refcounts and the free pool are untouched.",
          "    given = [[b.block_id for b in group] for group in hit.blocks]",
          f'    assert given == {[[r.block_id for r in g.input_before] for g in obs.groups]}, f"its input became {{given}}"',
          *([f"    assert [pool.blocks[i].ref_cnt for i in {held}] == {[0] * len(held)}, \"refcounts changed\""]
            if held else []),
          f"    assert pool.get_num_free_blocks() == {layout.num_blocks - 1}, \"the free pool changed\""]
    version = vllm_version or obs.vllm_version
    context = textwrap.fill(f"The run: {scenario!r}", 88, subsequent_indent="    ")
    head = ["# SPDX-License-Identifier: Apache-2.0",
            f"\"\"\"vLLM {version} breaks '{invariant}' in KVCacheManager.truncate_computed_blocks (kvtrunc-fuzz).",
            "", context + '"""', "", "import pytest", *(["import torch"] if uses_torch else []), ""]
    for module in sorted(imports):
        names = sorted(imports[module])
        line = f"from {module} import {', '.join(names)}"
        head.append(line if len(line) <= 100 else f"from {module} import (\n" + "".join(f"    {x},\n" for x in names) + ")")
    return "\n".join([*head, "", "pytestmark = pytest.mark.cpu_test", "", "", *b, ""])


def truncation_repro_of_failure(failure: BaseException | None, invariant: str, *,
                                sidecar: str = "") -> tuple[str, str] | None:
    """``failure``'s repro, from the truncation run it carries
    (:func:`fuzz.runners.truncation.carrying_run`; Hypothesis raises the
    minimal example's): (its place in vLLM's tests tree, its source). None
    when it carries none: the run broke before the call returned."""
    del sidecar  # the tier's sidecar keeps no run: the file is its record
    run = getattr(failure, "truncation_run", None) if isinstance(failure, InvariantViolation) else None
    if run is None:
        return None
    scenario, obs = run
    source = truncation_repro(scenario, obs, invariant=invariant)  # type: ignore[arg-type]
    return f"v1/core/test_truncate_computed_blocks_{invariant.replace('-', '_')}.py", source
