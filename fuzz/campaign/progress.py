"""The stats directory: how workers tell the runner what they did.

Each worker keeps its :class:`~fuzz.campaign.totals.Totals` and writes them to
``<stats_dir>/<worker>.json`` at most once a second (and at once when it finds
something); the runner merges every file for its progress line and result.
A worker that cannot go on (the shared database is gone) leaves one line in
``harness-error-<worker>.txt``; the runner then stops every worker.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from fuzz import telemetry
from fuzz.campaign.totals import Totals

__all__ = ["Progress", "harness_errors", "read_totals"]


class Progress:
    """One worker's totals, written for the runner."""

    def __init__(self, stats_dir: str | Path, worker: str, *, start: float, vllm_version: str) -> None:
        self.path = Path(stats_dir) / f"{worker}.json"
        self.worker = worker
        self.start = start  # the runner's start (time.time())
        self.totals = Totals(vllm_version=vllm_version)
        self._last_flush = 0.0

    def count(self, target: str) -> None:
        """One more example of ``target``; written out about once a second."""
        examples = self.totals.examples
        if target not in examples:
            examples[target] = 0
            self.totals.first_example_s[target] = round(time.time() - self.start, 3)
        examples[target] += 1
        if time.monotonic() - self._last_flush >= 1.0:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        self.totals.telemetry = telemetry.snapshot()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"worker": self.worker, **self.totals.to_json()}))
        tmp.replace(self.path)

    def harness_error(self, line: str) -> None:
        """Tell the runner this worker cannot go on (one line)."""
        self.flush()
        (self.path.parent / f"harness-error-{self.worker}.txt").write_text(" ".join(line.split()) + "\n")


def read_totals(stats_dir: Path) -> Totals:
    """The merged totals of every worker's progress file (a file being replaced is skipped)."""
    parts = []
    for f in Path(stats_dir).glob("*.json"):
        try:
            parts.append(Totals.from_json(json.loads(f.read_text())))
        except (OSError, ValueError, KeyError):
            continue
    return Totals.sum(parts)


def harness_errors(stats_dir: Path) -> list[str]:
    """One line each, written by workers that could not go on (e.g. database lost)."""
    return [f.read_text().strip() for f in sorted(Path(stats_dir).glob("harness-error-*.txt"))]
