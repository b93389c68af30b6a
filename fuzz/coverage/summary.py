"""What one combined coverage result says about vLLM's KV-core files: the
record :mod:`fuzz.coverage` measures and :mod:`fuzz.coverage.render` shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Summary"]


@dataclass
class Summary:
    """What one combined coverage result says about :data:`fuzz.coverage.MODULES`."""

    files: dict[str, dict[str, int]]  # module -> lines, lines covered, branches, branches covered
    functions: list[dict[str, Any]]  # rows for FUNCTIONS: module, name, branches, covered, missing
    growth: dict[str, list[tuple[float, int]]]  # target (and "all") -> (seconds, covered branches)
    vllm_version: str = "?"
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"vllm_version": self.vllm_version, "files": self.files, "functions": self.functions,
                "growth": {k: [list(p) for p in v] for k, v in self.growth.items()}, "notes": self.notes}
