"""KV-cache layouts and the observation of one ``truncate_computed_blocks`` call."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass(frozen=True)
class SpecDraw:
    """One KV-cache group's spec, by vLLM class name.

    ``params`` holds the class-specific integer fields (``sliding_window``,
    ``attention_chunk_size``, ``sink_len``, ...). ``inner`` is only used by the
    uniform-type wrapper (``UniformTypeKVCacheSpecs``): the per-layer specs it
    wraps.
    """

    kind: str
    block_size: int
    params: tuple[tuple[str, int], ...] = ()
    inner: tuple[SpecDraw, ...] = ()

    def param(self, name: str, default: int | None = None) -> int | None:
        return dict(self.params).get(name, default)

    def __repr__(self) -> str:
        args = [f"block_size={self.block_size}"]
        args += [f"{k}={v}" for k, v in self.params]
        if self.inner:
            args.append("kv_cache_specs=[" + ", ".join(map(repr, self.inner)) + "]")
        return f"{self.kind}({', '.join(args)})"


@dataclass(frozen=True)
class LayoutDraw:
    """A whole KV-cache configuration: groups, hash block size, pool size."""

    groups: tuple[SpecDraw, ...]
    hash_block_size: int
    num_blocks: int
    max_model_len: int = 1024

    @property
    def has_mamba(self) -> bool:
        """Whether a group holds Mamba state (its own spec, or one it wraps):
        vLLM's prefix-caching-off and chunked-prefill-off paths differ for it."""
        return any("Mamba" in s.kind for g in self.groups for s in (g, *g.inner))

    @property
    def scheduler_block_size(self) -> int:
        """vLLM's rule: the LCM of every group's block size."""
        return math.lcm(*(g.block_size for g in self.groups))

    def __repr__(self) -> str:
        groups = ", ".join(map(repr, self.groups))
        limit = "" if self.max_model_len == 1024 else f", max_model_len={self.max_model_len}"
        return (
            f"Layout([{groups}], hash_block_size={self.hash_block_size}, "
            f"num_blocks={self.num_blocks}{limit})"
        )


@dataclass(frozen=True)
class EagleDraw:
    """Speculative decoding with an EAGLE-style drafter (EAGLE, EAGLE3, MTP),
    as the scheduler hands it to the ``KVCacheManager``: ``use_eagle`` on (the
    trailing-block drop, ``SpeculativeConfig.use_eagle_block_drop()``) and one
    token of prefill lookahead (``VllmConfig.num_prefill_lookahead_tokens``
    for every drafter but multi-module MTP).

    ``draft_groups`` are the groups holding draft layers, which vLLM's planning
    flags ``is_eagle_group``; draft layers are attention layers, so these are
    attention-like groups. ``()`` means no group was identified as the
    drafter's (a drafter sharing its target's KV), and vLLM then flags every
    group.
    """

    draft_groups: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"Eagle(draft_groups={list(self.draft_groups)})"


@dataclass(frozen=True)
class BlockRef:
    """What the invariants need to know about one ``KVCacheBlock``.

    ``obj_id`` is ``id()`` of the Python object, so "the same block object"
    can be checked without holding the object.
    """

    obj_id: int
    block_id: int
    ref_cnt: int
    block_hash: bytes | None
    is_null: bool


# How a group must truncate, and how its attention span skips old tokens: the
# values of the spec-kind table (fuzz/model/_classification.py) a repro file
# carries with the checks that read them.
class Behaviour(str, Enum):
    MUST_COVER = "must-cover"
    MAY_BE_SHORT = "may-be-short"
    SCRATCH = "scratch"
    UNWRAPPED = "unwrapped"


class Span(str, Enum):
    """How a group's attention span lets it skip old tokens."""

    WINDOW = "window"  # reads the last ``value`` tokens before the next one
    CHUNK = "chunk"  # reads the current chunk of ``value`` tokens

    def first_needed_token(self, value: int, resume: int) -> int:
        """The first token the next computed token (at ``resume``) attends to."""
        if self is Span.WINDOW:
            return max(0, resume - value + 1)
        return resume // value * value


def first_needed_token(span: tuple[str, int] | None, rule: Span | None, resume: int) -> int:
    """The first token the next computed token (at ``resume``) attends to in
    a group: 0, or where its attention span (``span``: its parameter and
    value; ``rule``: how the table says it skips old tokens) starts."""
    if span is None or rule is None:
        return 0
    return rule.first_needed_token(span[1], resume)


@dataclass(frozen=True)
class GroupInfo:
    """Static facts about one group of a built manager."""

    index: int
    spec_class: str  # "module.QualName" of the group's spec class
    inner_classes: tuple[str, ...]  # for the uniform-type wrapper, else ()
    block_size: int
    prefix_cacheable: bool


def group_kind(info: GroupInfo) -> str:
    """The bare class name of the group's spec (``"MambaSpec"``)."""
    return info.spec_class.rsplit(".", 1)[-1]


def group_name(info: GroupInfo) -> str:
    """``group 1 (MambaSpec, block_size=16)``, for messages."""
    return f"group {info.index} ({group_kind(info)}, block_size={info.block_size})"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def answer_acted_on(adm: Any) -> int | None:
    """The connector's answer as the scheduler acts on it (``adm``: an
    :class:`fuzz.model.AdmissionObservation`, or a repro file's record of
    one under its field names): what it returned,
    except for a request that skips reading the prefix cache, whose answer
    vLLM replaces by 0 right after asking (``Scheduler.schedule``: ``if
    request.skip_reading_prefix_cache: ext_tokens, load_kv_async = 0,
    False``), so no truncation or load follows from it."""
    return 0 if adm.skips_prefix_cache else adm.reply


@dataclass(frozen=True)
class GroupTruncation:
    """One group's side of a ``truncate_computed_blocks`` call."""

    info: GroupInfo
    list_obj_id_before: int
    list_obj_id_after: int
    input_before: tuple[BlockRef, ...]
    input_after: tuple[BlockRef, ...]
    output: tuple[BlockRef, ...] | None  # None when the call raised


@dataclass(frozen=True)
class TruncationObservation:
    """Everything observed around one ``truncate_computed_blocks(blocks, n)``."""

    endpoint: int
    groups: tuple[GroupTruncation, ...]
    error: str | None  # "ExcType: message" when the call raised
    tuple_obj_id_before: int
    tuple_obj_id_after: int
    free_blocks_before: int
    free_blocks_after: int
    vllm_version: str
    context: str = field(default="", compare=False)  # the scenario, for messages
    error_type: str | None = None  # the exception type when the call raised
    error_frames: tuple[str, ...] = ()  # its innermost vLLM frames, innermost first
    error_statement: str = ""  # the vLLM statement that raised (fuzz.adapter._observe.raising_statement)

    def describe(self) -> str:
        lines = [f"truncate_computed_blocks(blocks, {self.endpoint}) on vLLM {self.vllm_version}"]
        for g in self.groups:
            out = "raised" if g.output is None else len(g.output)
            lines.append(
                f"  group {g.info.index} {g.info.spec_class.rsplit('.', 1)[-1]} "
                f"block_size={g.info.block_size}: in={len(g.input_before)} out={out} "
                f"ids={[b.block_id for b in g.input_before]}"
            )
        if self.error:
            lines.append(f"  error: {self.error}")
        if self.context:
            lines.append(f"  scenario: {self.context}")
        return "\n".join(lines)


def saved_prefix(saved: Any, tokens: Any, unit: int) -> int:
    """The longest prefix of ``tokens``, in whole blocks of ``unit`` tokens,
    that one of the ``saved`` token sequences starts with."""
    best = 0
    for entry in saved:
        n = 0
        for a, b in zip(entry, tokens):
            if a != b:
                break
            n += 1
        best = max(best, n // unit * unit)
    return best
