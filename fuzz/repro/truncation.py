"""Standalone repros a vLLM contributor can paste into vLLM's test suite.

A repro is a pytest file in vLLM's ``tests/v1/core`` idiom that imports vLLM
only (never this project), rebuilds the shrunk scenario with vLLM's own
constructors, and asserts the expected behaviour of the failing call. It fails
on the vLLM that produced it and passes once the bug is fixed.
"""

from __future__ import annotations

import textwrap

from fuzz import adapter
from fuzz.kit import TRUNCATION_KIT_MODULES
from fuzz.model import Behaviour, SpecDraw, TruncationObservation, group_behaviour
from fuzz.repro.source import kit_source
from invariants.truncation import loud_failure_expected
from fuzz.model import TruncationScenario

__all__ = ["repro_header", "spec_classes", "specs_lines", "truncation_repro", "truncation_repro_of_failure"]


def repro_header(*, title: str, vllm_version: str, target: str, seed: object, invariant: str, violation: str, scenario: str) -> str:
    first = violation.strip().splitlines()[0] if violation.strip() else ""
    return (
        '"""' + title + "\n\n"
        "Found and shrunk by the kvtrunc-fuzz property suite.\n\n"
        f"vLLM version: {vllm_version}\n"
        f"target: {target}\n"
        f"seed: {seed}\n"
        f"invariant: {invariant}\n"
        + (f"violation: {first}\n" if first else "") + "\n"
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


def spec_classes(draws: tuple[SpecDraw, ...]) -> set[str]:
    """The vLLM spec classes a file's ``SPECS`` constructs (nested ones too)."""
    out: set[str] = set()
    for d in draws:
        out.add(adapter.spec_constructor(d)[0].__name__)
        out |= spec_classes(d.inner)
    return out


def specs_lines(groups: tuple[SpecDraw, ...]) -> list[str]:
    """A file's ``SPECS = [...]``: on one line where it fits in 120 characters, else a spec a line."""
    one = "SPECS = [" + ", ".join(_spec_code(g) for g in groups) + "]"
    return [one] if len(one) <= 120 else ["SPECS = [", *[f"    {_spec_code(g)}," for g in groups], "]"]


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
    header = repro_header(
        title=f"Repro: truncate_computed_blocks violates '{invariant}'.",
        vllm_version=obs.vllm_version,
        target=target,
        seed=seed,
        invariant=invariant,
        violation=violation,
        scenario=repr(scenario),
    )
    layout = scenario.layout
    eagle = scenario.eagle is not None
    loud = loud_failure_expected(obs)
    expected = [] if loud else _expected_lengths(obs)
    notes = [
        f"#   group {g.info.index} {g.info.spec_class.rsplit('.', 1)[-1]}: block {g.info.block_size}, "
        f"{len(g.input_before)} in, expect {n}"
        for g, n in zip(obs.groups, expected)
    ]
    drafter = {k: v for k, v in adapter.eagle_manager_kwargs(eagle).items() if k != "use_eagle"}
    # name -> (the value an if of the kit may read, None for the others; its lines)
    constants: dict[str, tuple[object, list[str]]] = {
        "SPECS": (None, specs_lines(layout.groups)),
        "HASH_BLOCK_SIZE": (None, [f"HASH_BLOCK_SIZE = {layout.hash_block_size}"]),
        "SCHEDULER_BLOCK_SIZE": (
            None, [f"SCHEDULER_BLOCK_SIZE = {layout.scheduler_block_size}  # LCM of the group block sizes"]
        ),
        "NUM_BLOCKS": (None, [f"NUM_BLOCKS = {layout.num_blocks}"]),
        "MAX_MODEL_LEN": (None, [f"MAX_MODEL_LEN = {layout.max_model_len}"]),
        "PREFILL_CHUNK": (None, [f"PREFILL_CHUNK = {scenario.prefill_chunk}"]),
        "PROMPTS": (None, ["PROMPTS = [", *[f"    {scenario.prompt_tokens(i)}," for i in range(len(scenario.prompts))],
                           "]"]),
        "REPLAY": (None, [f"REPLAY = {scenario.replay_tokens()}"]),
        "EVICT_FROM": (None, [f"EVICT_FROM = {list(scenario.evict_from)}"]),
        "ENDPOINT": (None, [f"ENDPOINT = {obs.endpoint}"]),
        "HYBRID": (len(layout.groups) > 1, []),
        "LOOKUP": (scenario.lookup_mode, []),
        "LOUD_FAILURE": (loud, []),
        "EXPECTED_LENGTHS": (None, [
            "# Attention-like groups return ENDPOINT // block_size blocks, Mamba",
            "# groups min(that, what they hold), scratch groups none:",
            *notes,
            f"EXPECTED_LENGTHS = {expected}",
        ]),
        "USE_EAGLE": (eagle, [
            "# An EAGLE-style drafter (EAGLE, EAGLE3, MTP): the scheduler builds the",
            "# manager with use_eagle=True, so lookups drop the last matched block of",
            "# the draft groups (is_eagle_group; none flagged: vLLM flags every group).",
            "USE_EAGLE = True",
        ]),
        "DRAFT_GROUPS": (None, [f"DRAFT_GROUPS = {list(scenario.eagle.draft_groups) if eagle else []}"]),
        "DRAFTER_KWARGS": (None, [f"DRAFTER_KWARGS = {drafter!r}"]),
    }
    values = {name: value for name, (value, _) in constants.items() if value is not None}
    roots = {"test_truncate_computed_blocks_repro"}
    used = kit_source(roots, values, constant_names=constants, modules=TRUNCATION_KIT_MODULES).constants
    emitted = [line for name, (_, text) in constants.items() if name in used for line in text]
    # The constants' values name spec classes (and torch dtypes): their imports too.
    more_imports = {"torch": ("torch", None), **{k: ("vllm.v1.kv_cache_interface", k) for k in spec_classes(layout.groups)}}
    kit = kit_source(roots, values, constant_names=constants, extra="\n".join(emitted), more_imports=more_imports,
                     modules=TRUNCATION_KIT_MODULES)
    return "\n".join([header, *kit.imports, "", *emitted, "", "", kit.code, ""])


def truncation_repro_of_failure(
    *, target: str, seed: object, invariant: str, violation: str, failure: BaseException | None
) -> str | None:
    """The repro of ``failure``, from the truncation run it carries
    (:func:`fuzz.runners.truncation.carrying_run`; Hypothesis raises the
    minimal example's). None when it carries none: the run broke before
    the truncation call returned an observation."""
    run = getattr(failure, "truncation_run", None)
    if run is None:
        return None
    scenario, obs = run
    return truncation_repro(
        scenario,  # type: ignore[arg-type]
        obs,  # type: ignore[arg-type]
        target=target,
        seed=seed,
        invariant=invariant,
        violation=violation,
    )
