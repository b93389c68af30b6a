"""What a worker does with a failure: one key per distinct failure, a
repro in vLLM's test idiom and a JSON sidecar for each key, and the failing example's
choices for the shared database.

A failure's key is its crash state, in the ClusterFuzz sense, read from vLLM's
side rather than ours (:func:`crash_state`): the invariant, plus the exception
type and vLLM's three innermost frames (``file:function``) when vLLM raised,
or else the vLLM function whose result broke the invariant (``where``). The
target is not part of it: one bug reached by several targets is one entry
listing them all, and two different vLLM exceptions never share a key. The
same bug found again, by this worker or another, is written once.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import time
import traceback
from pathlib import Path
from typing import Any

from hypothesis.core import decode_failure
from hypothesis.database import choices_to_bytes

from fuzz import known_bugs
from fuzz.model import InvariantViolation, MissedHit, OpLog, encode_oplog
from fuzz.outcomes import Outcome
from fuzz.registry import get_target

__all__ = ["Findings", "crash_state", "failure_key", "failing_choices", "outcome_of"]

CRASH_DEPTH = 3  # frames in a crash state (ClusterFuzz uses three)

_BLOB = re.compile(r"@reproduce_failure\((?P<version>'[^']*'|\"[^\"]*\"), (?P<blob>b(?:'[^']*'|\"[^\"]*\"))\)")


def failing_line(exc: BaseException) -> str:
    """The deepest frame in vLLM or in our invariants: the dedup key's second half."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/vllm/" in frame.filename or "/invariants/" in frame.filename:
            return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _traceback_frames(exc: BaseException, depth: int = CRASH_DEPTH) -> tuple[str, ...]:
    """The innermost ``depth`` vLLM frames of ``exc``'s traceback, innermost
    first, as ``vllm/v1/core/block_pool.py:BlockPool.get_new_blocks``; when
    none lies in vLLM (the suite's own failure), the innermost frames of all."""
    frames = []
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        path = frame.f_code.co_filename.replace("\\", "/")
        frames.append((path, frame.f_code.co_qualname))
    ours = [(p, q) for p, q in frames if "/vllm/" in p]
    chosen = ours or frames
    out = []
    for path, qualname in reversed(chosen):
        rel = "vllm/" + path.rsplit("/vllm/", 1)[1] if "/vllm/" in path else path.rsplit("/", 2)[-1]
        out.append(f"{rel}:{qualname}")
    return tuple(out[:depth])


def crash_state(exc: BaseException) -> str:
    """What makes a failure distinct, read from vLLM's side.

    * vLLM raised (an :class:`InvariantViolation` carrying ``exception`` and
      ``frames``, or any other exception): ``invariant|ExcType|f1 < f2 < f3``
      with vLLM's three innermost frames, innermost first;
    * an invariant broke on a result: ``invariant|where``, the vLLM function
      whose result broke it (``Scheduler.schedule``);
    * a missed hit (:class:`fuzz.model.MissedHit`) adds ``|missed hit``: never
      one entry with a violation of the same claim.
    """
    if isinstance(exc, MissedHit):
        return f"{exc.invariant}|{exc.where or failing_line(exc)}|{Outcome.MISSED_HIT.value}"
    invariant = getattr(exc, "invariant", None)
    if invariant is None:  # not a checked failure: the exception itself
        return f"{type(exc).__name__}|{type(exc).__name__}|{' < '.join(_traceback_frames(exc)) or '?'}"
    exception = getattr(exc, "exception", None)
    if exception:
        frames = tuple(getattr(exc, "frames", ()))[:CRASH_DEPTH]
        return f"{invariant}|{exception}|{' < '.join(frames) or '?'}"
    return f"{invariant}|{getattr(exc, 'where', '') or failing_line(exc)}"


def outcome_of(exc: BaseException) -> str:
    """The sidecar's ``outcome``: "missed hit" or "violation" (fuzz.outcomes)."""
    return (Outcome.MISSED_HIT if isinstance(exc, MissedHit) else Outcome.VIOLATION).value


def failure_key(target: str, exc: BaseException) -> str:
    """The deduplication key: the crash state (``target`` is listed in the
    entry, not part of the key)."""
    del target
    return crash_state(exc)


def _sidecar_oplog(exc: BaseException) -> dict[str, Any] | None:
    """The sidecar's ``oplog``: the shrunk log the repro file was written
    from, else the failing run's whole log (fuzz.model.encode_oplog); None
    for a failure that carries none (the truncation tier). ``python -m fuzz
    replay`` reruns it under every claim."""
    for log in (getattr(exc, "repro_oplog", None), getattr(exc, "oplog", None)):
        if isinstance(log, OpLog):
            return encode_oplog(log)
    return None


def _blob(exc: BaseException) -> str | None:
    for line in getattr(exc, "__notes__", []):
        if "reproduce_failure" in line:
            return line.strip()
    return None


def failing_choices(exc: BaseException) -> bytes | None:
    """The minimal failing example as the example database stores it, from
    the ``@reproduce_failure`` blob Hypothesis attached (``print_blob``)."""
    m = _BLOB.search(_blob(exc) or "")
    if m is None:
        return None
    try:
        return choices_to_bytes(decode_failure(ast.literal_eval(m["blob"])))
    except Exception:  # noqa: BLE001 - an unreadable blob: the repro and sidecar still exist
        return None


class Findings:
    """The distinct failures one worker found, written as repros and sidecars."""

    def __init__(self, *, repro_dir: str | Path, start: float, campaign_seed: int | None, worker: str,
                 vllm_version: str) -> None:
        self.repro_dir = Path(repro_dir)
        self.start = start
        self.campaign_seed = campaign_seed
        self.worker = worker
        self.vllm_version = vllm_version
        self.keys: set[str] = set()
        self.entries: dict[str, dict[str, Any]] = {}  # key -> its sidecar
        # stem -> the sidecar's "oplog": in the file only, never in the
        # campaign's totals (a run's whole record can be long).
        self.oplogs: dict[str, dict[str, Any] | None] = {}

    def known(self, target: str, exc: BaseException) -> bool:
        """True when this failure was recorded already; ``target`` is then
        added to the entry's targets (one bug, several targets: one entry)."""
        key = failure_key(target, exc)
        if key not in self.keys:
            return False
        self._also_found_by(key, target)
        return True

    def _also_found_by(self, key: str, target: str) -> None:
        meta = self.entries[key]
        if target in meta["targets"]:
            return
        meta["targets"].append(target)
        found_by = get_target(target)
        if found_by.reach == "engine-reachable" and meta.get("reach") != "engine-reachable":
            meta["reach"], meta["reach_reason"] = found_by.reach, found_by.reach_reason
        self._write_sidecar(meta)

    def _write_sidecar(self, meta: dict[str, Any]) -> None:
        path = self.repro_dir / f"{meta['stem']}.json"
        if path.exists():  # another worker wrote this bug first: keep its targets too
            try:
                theirs = json.loads(path.read_text()).get("targets", [])
            except (OSError, ValueError):
                theirs = []
            meta["targets"] = sorted(set(meta["targets"]) | set(theirs), key=(theirs + meta["targets"]).index)
        path.write_text(json.dumps({**meta, "oplog": self.oplogs.get(meta["stem"])}, indent=2))

    def record(self, target_name: str, seed: int | None, exc: BaseException) -> dict[str, Any] | None:
        """Write the repro and sidecar of a new failure and return the sidecar
        (None when this key is known already: then ``target_name`` joins the
        entry's targets)."""
        invariant = getattr(exc, "invariant", type(exc).__name__)
        key = failure_key(target_name, exc)
        if key in self.keys:
            self._also_found_by(key, target_name)
            return None
        self.keys.add(key)
        digest = hashlib.sha1(key.encode()).hexdigest()[:8]
        # Named by the crash state alone, so every worker writes one bug to one file.
        stem = f"{invariant}-{digest}".replace("/", "_")
        self.repro_dir.mkdir(parents=True, exist_ok=True)
        message = str(exc)
        # One file: the test a vLLM contributor pastes into vLLM's tests
        # (fuzz.upstream), and its place there; the sidecar keeps the run.
        repro_file, upstream = None, None
        writer = get_target(target_name).repro_writer()
        if writer is not None:
            upstream = writer(exc, invariant, sidecar=f"{stem}.json")
            if upstream is not None:
                repro_file = self.repro_dir / f"test_{stem.replace('-', '_')}.py"
                repro_file.write_text(upstream[1])
        bug = None
        if isinstance(exc, InvariantViolation):
            bug = known_bugs.match_violation(exc, self.vllm_version)
        target = get_target(target_name)
        meta = {
            "target": target_name,  # the first to find it
            # Every target that reached the same crash state (fuzz.campaign.totals merges them).
            "targets": [target_name],
            "stem": stem,
            # Scheduler tier: engine-reachable or scheduler-API, and why (the
            # strongest label of the targets that found it).
            "reach": target.reach,
            "reach_reason": target.reach_reason,
            "invariant": invariant,
            # "violation", or "missed hit" (fuzz.outcomes): counted and reported apart.
            "outcome": outcome_of(exc),
            # A documented bug of this vLLM release (fuzz/known_bugs.py): reported,
            # never a new violation.
            "known_bug": None if bug is None else bug.id,
            "failing_line": failing_line(exc),
            # The structured facts (fuzz/known_bugs.py matches on them).
            "exception": getattr(exc, "exception", None),
            "vllm_frames": list(getattr(exc, "frames", ())),
            "where": getattr(exc, "where", ""),
            "key": key,
            "seed": seed,
            "campaign_seed": self.campaign_seed,
            "blob": _blob(exc),
            "violation": message[:4000],
            "vllm_version": self.vllm_version,
            "repro": None if repro_file is None else repro_file.name,
            # Where the repro belongs in vLLM's tests tree.
            "upstream_path": None if upstream is None else upstream[0],
            "found_after_s": round(time.time() - self.start, 3),
            "found_at": round(time.time(), 3),
            "worker": self.worker,
        }
        self.entries[key] = meta
        self.oplogs[stem] = _sidecar_oplog(exc)
        self._write_sidecar(meta)
        return meta
