"""``campaign.json``: the record a runner leaves beside its report, and the
merge of several runners' records (``python -m fuzz merge``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from fuzz.campaign.config import CampaignConfig
from fuzz.campaign.totals import Totals

__all__ = ["CampaignRecord", "merge_campaigns"]

FILENAME = "campaign.json"


@dataclass(frozen=True)
class CampaignRecord:
    config: CampaignConfig
    totals: Totals
    elapsed: float  # the runner's wall time

    def write(self, report_dir: Path) -> Path:
        path = report_dir / FILENAME
        path.write_text(json.dumps({"total": self.totals.to_json(), "config": self.config.to_json(),
                                    "elapsed": self.elapsed}))
        return path

    @classmethod
    def read(cls, path: Path) -> CampaignRecord:
        """ValueError naming the file when it is not a runner's record."""
        try:
            data = json.loads(Path(path).read_text())
            return cls(CampaignConfig.from_json(data["config"]), Totals.from_json(data["total"]),
                       float(data.get("elapsed", 0.0)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a campaign.json written by `python -m fuzz run` ({exc})") from None


def merge_campaigns(paths: list[Path]) -> CampaignRecord:
    """One record for several shards: counts add up, failures are
    deduplicated (:meth:`Totals.merge`), the targets are the union in order,
    the slots add up, and elapsed is the longest shard's wall time."""
    if not paths:
        raise ValueError("no campaign.json files given")
    records = [CampaignRecord.read(p) for p in paths]
    targets: list[str] = []
    for r in records:
        targets += [t for t in r.config.targets if t not in targets]
    first = records[0].config
    config = replace(
        first,
        targets=tuple(targets),
        items=tuple(i for r in records for i in r.config.items),
        slots=sum(r.config.slots for r in records),
        shard=", ".join(r.config.shard or "1/1" for r in records),
        coverage=any(r.config.coverage for r in records),
    )
    return CampaignRecord(config, Totals.sum(r.totals for r in records), max(r.elapsed for r in records))
