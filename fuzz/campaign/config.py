"""The campaign contract: what ``python -m fuzz run`` tells its workers.

The runner builds one :class:`CampaignConfig` from the command line; it
reaches the pytest-xdist workers through one environment variable
(:data:`ENV`, JSON) and is validated again when a worker reads it, so a
worker never runs on a half-understood configuration. The same record is
kept in ``campaign.json`` beside the report, where ``python -m fuzz merge``
reads it back.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields

__all__ = ["ENV", "CampaignConfig"]

ENV = "FUZZ_CAMPAIGN"


@dataclass(frozen=True)
class CampaignConfig:
    """One campaign run by one runner (one shard of a sharded campaign).

    ``items`` are this runner's (target, slot) pairs (:mod:`fuzz.campaign.sharding`);
    ``slots`` is the runner's worker count; ``start`` the runner's wall-clock
    start (``time.time()``), from which repros' ``found_after_s`` count.
    """

    targets: tuple[str, ...]
    items: tuple[tuple[str, int], ...]
    slots: int
    budget: float  # fuzzing seconds, start-up not included
    start: float
    repro_dir: str
    stats_dir: str
    db: tuple[str, ...] = ()  # --db specs; empty: no database
    seed: int | None = None
    shard: str | None = None  # "K/N" when sharded
    reuse_only: bool = False
    plant: str | None = None  # a planted truncation bug (self-tests, benchmarks)
    coverage: bool = False  # measure vLLM's code with coverage.py (fuzz.coverage)

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        object.__setattr__(self, "items", tuple((str(t), int(s)) for t, s in self.items))
        object.__setattr__(self, "db", tuple(self.db))
        problems = []
        if not self.targets:
            problems.append("targets: none")
        if any(t not in self.targets for t, _ in self.items):
            problems.append(f"items {list(self.items)} name targets outside {list(self.targets)}")
        if any(s < 0 for _, s in self.items):
            problems.append("items: negative slot")
        if self.slots < 1:
            problems.append(f"slots={self.slots} must be at least 1")
        if not self.budget > 0:
            problems.append(f"budget={self.budget} must be positive")
        if problems:
            raise ValueError("campaign config: " + "; ".join(problems))

    # -- the wire format ------------------------------------------------------
    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "targets": list(self.targets), "items": [list(i) for i in self.items],
                "db": list(self.db)}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> CampaignConfig:
        """Read a config back (unknown keys are ignored; ``python -m fuzz merge``
        reads shards' ``campaign.json``, whose ``items`` and paths it needs not)."""
        known = {f.name for f in fields(cls)}
        missing = {"targets", "slots", "budget"} - set(data)
        if missing:
            raise ValueError(f"campaign config: missing {', '.join(sorted(missing))}")
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs.setdefault("items", [(t, s) for t in data["targets"] for s in range(int(data["slots"]))])  # type: ignore[union-attr, call-overload]
        kwargs.setdefault("start", 0.0)
        kwargs.setdefault("repro_dir", "")
        kwargs.setdefault("stats_dir", "")
        if kwargs.get("db") is None:
            kwargs["db"] = ()
        return cls(**kwargs)  # type: ignore[arg-type]

    def to_env(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> CampaignConfig | None:
        """The config the runner passed, or None outside a campaign."""
        text = (os.environ if environ is None else environ).get(ENV, "")
        return cls.from_json(json.loads(text)) if text.strip() else None
