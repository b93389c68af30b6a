"""Watching a real ``Scheduler`` without changing what it does.

:class:`Spies` wraps four calls on one scheduler *instance* (the class is
untouched, so planted bugs still apply): the local prefix lookup, the
manager's ``get_computed_blocks`` (to see the divergent-hit fallback),
``truncate_computed_blocks`` and ``allocate_slots``. Each wrapper records its
arguments and result in the waiting request's
:class:`fuzz.model.AdmissionObservation` (frozen: each event replaces it)
and calls through. :func:`vllm_frames` reads where in vLLM an exception came
from (the crash state used for known-bug matching and deduplication).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import linecache
import os
import traceback
from collections.abc import Callable
from typing import Any

from fuzz import outcomes
from fuzz.adapter import _compat, _planted
from fuzz.adapter._env import VLLM_ROOT, VLLM_VERSION
from fuzz.adapter._hits import index_hold

from vllm.v1.request import Request  # noqa: E402

from fuzz.model import AdmissionObservation, HarnessError  # noqa: E402

__all__ = ["Spies", "block_ids", "raising_statement", "step_failure", "vllm_frames"]


def block_ids(blocks: Any) -> tuple[tuple[int, ...], ...]:
    """Per group, the block ids of a ``KVCacheBlocks``."""
    return tuple(tuple(b.block_id for b in group) for group in blocks.blocks)


def vllm_frames(exc: BaseException, depth: int = 3) -> tuple[str, ...]:
    """The innermost ``depth`` frames of ``exc``'s traceback that lie in vLLM,
    innermost first, as ``"vllm/v1/core/block_pool.py:BlockPool.get_new_blocks"``."""
    frames = []
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(VLLM_ROOT + os.sep):
            rel = "vllm/" + os.path.relpath(path, VLLM_ROOT).replace(os.sep, "/")
            frames.append(f"{rel}:{frame.f_code.co_qualname}")
    return tuple(reversed(frames))[:depth]


def raising_statement(exc: BaseException) -> str:
    """The source of the statement that raised ``exc`` (whitespace
    collapsed), when vLLM's code raised it: ``"assert num_new_tokens == 1 +
    self.num_spec_tokens"``. Known-bug signatures name it, so a different
    assert in the same function is a different failure. Empty when the
    raising frame is not vLLM's or its source is unavailable."""
    last, lineno = None, 0
    for frame, line in traceback.walk_tb(exc.__traceback__):
        last, lineno = frame, line
    if last is None:
        return ""
    path = os.path.abspath(last.f_code.co_filename)
    if not path.startswith(VLLM_ROOT + os.sep):
        return ""
    return _statement_at(last.f_code.co_filename, lineno, len(linecache.getlines(last.f_code.co_filename)))


@functools.lru_cache(maxsize=256)
def _statement_at(filename: str, lineno: int, _num_lines: int) -> str:
    """The whole statement that covers ``lineno`` of ``filename`` (all its
    lines, for an assert spread over several), read through linecache,
    which also holds the edited source of a planted bug."""
    lines = linecache.getlines(filename)
    if not 0 < lineno <= len(lines):
        return ""
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return " ".join(lines[lineno - 1].split())
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, _COMPOUND):
            end = node.end_lineno or node.lineno
            if node.lineno <= lineno <= end and (best is None or end - node.lineno < best[1] - best[0]):
                best = (node.lineno, end)
    if best is None:
        return " ".join(lines[lineno - 1].split())
    return " ".join("".join(lines[best[0] - 1 : best[1]]).split())


# Statements that hold others: the raising statement is the simple one inside.
_COMPOUND = (
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While,
    ast.With, ast.AsyncWith, ast.Try, ast.Match,
)


def _raising_frame(exc: BaseException) -> Any:
    """The innermost frame of ``exc``'s traceback (None without one)."""
    last = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        last = frame
    return last


def raising_file(exc: BaseException) -> str | None:
    """The absolute path of the file whose code raised ``exc``."""
    last = _raising_frame(exc)
    return None if last is None else os.path.abspath(last.f_code.co_filename)


def step_frames(exc: BaseException) -> tuple[str, ...]:
    """:func:`vllm_frames`, led by the frame that raised when that one is
    not vLLM's (a planted bug's code, as
    ``"outside vLLM:_planted.py:_variant.<locals>.truncate"``): an assert vLLM
    raised in ``Scheduler.schedule`` itself then reads differently from one
    raised in code ``schedule()`` called."""
    frames = vllm_frames(exc)
    last = _raising_frame(exc)
    path = None if last is None else os.path.abspath(last.f_code.co_filename)
    if path is None or path.startswith(VLLM_ROOT + os.sep):
        return frames
    return (f"outside vLLM:{os.path.basename(path)}:{last.f_code.co_qualname}", *frames)[:3]


class Spies:
    """The recording wrappers on one scheduler instance.

    ``admission(request, **lookup)`` starts a request's observation with the
    harness's static facts (groups, block sizes, ...); the wrappers fill in
    the rest as the scheduler calls them.
    """

    def __init__(self, scheduler: Any, num_groups: int, admission: Callable[..., AdmissionObservation]) -> None:
        self.scheduler = scheduler
        self.manager = scheduler.kv_cache_manager
        self.num_groups = num_groups
        self._admission = admission
        self.pending: dict[str, AdmissionObservation] = {}  # admissions of the current step
        # Per request, its last allocate_slots call of the current step:
        # (num_new_computed_tokens, num_external_computed_tokens).
        self.step_allocs: dict[str, tuple[int, int]] = {}
        self._allocated: set[str] = set()  # first allocate_slots done (returned or raised)
        self._current: str | None = None
        self._in_lookup = False
        self._install()

    def new_step(self) -> None:
        self.pending.clear()
        self.step_allocs.clear()
        self._allocated.clear()

    def _note(self, request_id: str, **fields: Any) -> None:
        self.pending[request_id] = dataclasses.replace(self.pending[request_id], **fields)

    def _open(self) -> str | None:
        """The admission in progress. Between a request's lookup and its
        allocation, the scheduler works on that request alone."""
        rid = self._current
        if rid is None or rid not in self.pending or self._in_lookup or rid in self._allocated:
            return None
        return rid

    def _side_lookups(
        self, request: Request, max_cache_hit_length: int | None
    ) -> tuple[tuple[int, ...], int, tuple[tuple[int, ...], ...]]:
        mgr = self.manager
        limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        coord = mgr.coordinator
        joint_blocks, joint_hit, _ = type(mgr).get_computed_blocks(
            mgr, request, *_compat.cache_hit_limit(max_cache_hit_length)
        )
        if _compat.has_per_group_lookup(coord):
            _, hits = coord.find_longest_cache_hit_per_group(request.block_hashes, limit)
            per_group = tuple(hits)
        else:
            per_group = tuple(joint_hit for _ in range(self.num_groups))
        return per_group, joint_hit, block_ids(joint_blocks)

    def _install(self) -> None:
        sched, mgr = self.scheduler, self.manager
        lookup = type(sched)._get_local_prefix_cache_hit

        def local_hit(request: Request, max_cache_hit_length: int | None = None) -> Any:
            held = index_hold(mgr, request, max_cache_hit_length, _compat.prefix_cache_map(mgr.block_pool),
                              _compat.partial_hits_enabled(mgr.coordinator))
            per_group, joint_hit, joint_blocks = self._side_lookups(request, max_cache_hit_length)
            self._in_lookup = True
            try:
                result = lookup(sched, request, *_compat.cache_hit_limit(max_cache_hit_length))
            finally:
                self._in_lookup = False
            blocks, num_local, _boundary, diverged = result
            self._current = request.request_id
            self.pending[request.request_id] = self._admission(
                request,
                local_hit=num_local,
                local_blocks=block_ids(blocks),
                hit_diverged=bool(diverged),
                per_group_hits=per_group,
                joint_hit=joint_hit,
                joint_blocks=joint_blocks,
                **held,
            )
            return result

        def get_computed_blocks(request: Request, max_cache_hit_length: int | None = None) -> Any:
            rid = self._open()
            if rid is not None and request.request_id == rid:
                self._note(rid, fell_back=True)
            return type(mgr).get_computed_blocks(mgr, request, *_compat.cache_hit_limit(max_cache_hit_length))

        def truncate(blocks: Any, num_computed_tokens: int) -> Any:
            rid = self._open()
            if rid is not None:
                self._note(rid, truncated_at=num_computed_tokens)
            return type(mgr).truncate_computed_blocks(mgr, blocks, num_computed_tokens)

        def allocate_slots(request: Request, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
            rid = request.request_id
            self.step_allocs[rid] = (
                kwargs.get("num_new_computed_tokens", 0),
                kwargs.get("num_external_computed_tokens", 0),
            )
            first = rid in self.pending and rid not in self._allocated
            if first:
                new_blocks = kwargs.get("new_computed_blocks")
                self._note(
                    rid,
                    alloc_local_tokens=kwargs.get("num_new_computed_tokens", 0),
                    alloc_external_tokens=kwargs.get("num_external_computed_tokens", 0),
                    alloc_local_blocks=(
                        tuple(() for _ in range(self.num_groups)) if new_blocks is None else block_ids(new_blocks)
                    ),
                )
            try:
                result = type(mgr).allocate_slots(mgr, request, num_new_tokens, *args, **kwargs)
            except Exception:
                if first:
                    self._allocated.add(rid)
                    self._note(rid, alloc_raised=True)
                raise
            if first:
                self._allocated.add(rid)
                self._note(rid, alloc_ok=result is not None)
            return result

        sched._get_local_prefix_cache_hit = local_hit
        mgr.get_computed_blocks = get_computed_blocks
        mgr.truncate_computed_blocks = truncate
        mgr.allocate_slots = allocate_slots


def _raise_if_suite_code(exc: Exception, call: str) -> None:
    """A step's exception is an observation of vLLM only when vLLM raised it.
    One raised by the suite's own code that vLLM calls (the scripted
    connector, the recording wrappers) is the harness's misfit: it leaves as
    :class:`HarnessError`, never as a ``no-exception`` violation. Planted
    bugs stand in for vLLM's code: the scheduler edits are compiled under
    vLLM's file names, and the truncation variants (plain functions in
    ``_planted``) count as vLLM's too."""
    verdict = outcomes.classify(exc, VLLM_VERSION)
    if verdict.outcome is not outcomes.Outcome.HARNESS_ERROR:
        return
    if raising_file(exc) == os.path.abspath(_planted.__file__):
        return
    raise HarnessError(f"during {call}(): {verdict.reason}") from exc


def step_failure(exc: Exception, call: str) -> tuple[str, str, str, tuple[str, ...], str]:
    """A vLLM ``call``'s exception as a step observes it: the error, its
    type, the call, its vLLM frames and the statement that raised."""
    _raise_if_suite_code(exc, call)
    return f"{type(exc).__name__}: {exc}", type(exc).__name__, call, step_frames(exc), raising_statement(exc)
