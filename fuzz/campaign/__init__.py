"""The machinery of ``python -m fuzz run`` and ``python -m fuzz merge``.

One job per module:

- :mod:`~fuzz.campaign.config`: the contract the runner hands its workers (:class:`CampaignConfig`);
- :mod:`~fuzz.campaign.sharding`: which (target, slot) items a runner takes (``--shard K/N``);
- :mod:`~fuzz.campaign.databases`: the shared example database (``--db``), also a pytest plugin;
- :mod:`~fuzz.campaign.runner`: starts the pytest-xdist workers and watches their progress;
- :mod:`~fuzz.campaign.worker`: the pytest module each worker runs, one item per slot;
- :mod:`~fuzz.campaign.schedule`: fair time slices between a slot's targets;
- :mod:`~fuzz.campaign.fuzzer`: one slot's slices: fresh generation, replay of what the database gained;
- :mod:`~fuzz.campaign.findings`: failure keys, repros and sidecars, choices saved for others;
- :mod:`~fuzz.campaign.progress`: the stats directory workers write and the runner reads;
- :mod:`~fuzz.campaign.totals`: what was counted (:class:`Totals`, merged for workers and shards alike);
- :mod:`~fuzz.campaign.record`: ``campaign.json``, and merging several runners' records;
- :mod:`~fuzz.campaign.report`: the summary table, ``report.md`` and ``report.html``.
"""

from fuzz.campaign.config import CampaignConfig
from fuzz.campaign.record import CampaignRecord, merge_campaigns
from fuzz.campaign.runner import CampaignResult, run_campaign
from fuzz.campaign.sharding import Shard, parse_shard, shard_items
from fuzz.campaign.totals import Totals

__all__ = [
    "CampaignConfig",
    "CampaignRecord",
    "CampaignResult",
    "Shard",
    "Totals",
    "merge_campaigns",
    "parse_shard",
    "run_campaign",
    "shard_items",
]
