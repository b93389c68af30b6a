"""What a worker does with a failure: one key per distinct failure, a
standalone repro and a JSON sidecar for each key, and the failing example's
choices for the shared database.

A failure's key is ``target|invariant|failing line`` (the deepest frame in
vLLM or in the suite's invariants): the same bug found again, by this worker
or another, has the same key and is written once.
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
from fuzz.model import InvariantViolation
from fuzz.registry import get_target

__all__ = ["Findings", "failure_key", "failing_choices"]

_BLOB = re.compile(r"@reproduce_failure\((?P<version>'[^']*'|\"[^\"]*\"), (?P<blob>b(?:'[^']*'|\"[^\"]*\"))\)")


def failing_line(exc: BaseException) -> str:
    """The deepest frame in vLLM or in our invariants: the dedup key's second half."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/vllm/" in frame.filename or "/invariants/" in frame.filename:
            return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def failure_key(target: str, exc: BaseException) -> str:
    return f"{target}|{getattr(exc, 'invariant', type(exc).__name__)}|{failing_line(exc)}"


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

    def known(self, target: str, exc: BaseException) -> bool:
        return failure_key(target, exc) in self.keys

    def record(self, target_name: str, seed: int | None, exc: BaseException) -> dict[str, Any] | None:
        """Write the repro and sidecar of a new failure and return the sidecar
        (None when this key is known already)."""
        invariant = getattr(exc, "invariant", type(exc).__name__)
        key = failure_key(target_name, exc)
        if key in self.keys:
            return None
        self.keys.add(key)
        digest = hashlib.sha1(key.encode()).hexdigest()[:8]
        stem = f"{target_name}-{invariant}-{digest}".replace("/", "_")
        self.repro_dir.mkdir(parents=True, exist_ok=True)
        message = str(exc)
        repro_file = None
        writer = get_target(target_name).repro_writer()
        if writer is not None:
            source = writer(target=target_name, seed=seed, invariant=invariant, violation=message)
            if source:
                repro_file = self.repro_dir / f"test_{stem.replace('-', '_')}.py"
                repro_file.write_text(source)
        bug = None
        if isinstance(exc, InvariantViolation):
            bug = known_bugs.match(known_bugs.failure_of(exc), self.vllm_version)
        target = get_target(target_name)
        meta = {
            "target": target_name,
            # Scheduler tier: engine-reachable or scheduler-API, and why.
            "reach": target.reach,
            "reach_reason": target.reach_reason,
            "invariant": invariant,
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
            "found_after_s": round(time.time() - self.start, 3),
            "found_at": round(time.time(), 3),
            "worker": self.worker,
        }
        (self.repro_dir / f"{stem}.json").write_text(json.dumps(meta, indent=2))
        return meta
