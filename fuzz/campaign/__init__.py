"""The machinery of ``python -m fuzz run`` and ``python -m fuzz merge``.

One job per module:

- :mod:`~fuzz.campaign.config`: the contract the runner hands its workers (:class:`CampaignConfig`);
- :mod:`~fuzz.campaign.sharding`: which (target, slot) items a runner takes (``--shard K/N``);
- :mod:`~fuzz.campaign.databases`: the shared example database (``--db``), also a pytest plugin;
- :mod:`~fuzz.campaign.runner`: starts the pytest-xdist workers and watches their progress;
- :mod:`~fuzz.campaign.worker`: the pytest module each worker runs (rounds, failures, repros);
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
