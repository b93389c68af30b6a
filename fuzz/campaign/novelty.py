"""What counts as new behaviour when the schedule weighs a slice
(:mod:`fuzz.campaign.schedule`): the distinct things the targets report
reaching, read from :mod:`fuzz.telemetry`'s counters in this process.

- every branch label (``reach()``, the scheduler tier's step labels, the
  state machine's run labels);
- every known vLLM bug met and set aside (a claim state);
- every reason vLLM refused a drawn layout;
- every per-group hit gap (in scheduler blocks);
- every pair of labels one example reached together
  (:data:`fuzz.telemetry.LABEL_PAIRS`): a target whose labels are all
  known can still combine them in ways it never had, as a state machine
  does long after its single labels stop coming (AFL counts edges, pairs
  of blocks, for the same reason).

Cheap: one snapshot of the counters per slice. Layouts and spec kinds are
left out on purpose: they are what was drawn, not what vLLM did with it,
and a target drawing a new combination of known behaviours has found
nothing new.
"""

from __future__ import annotations

import itertools

from fuzz import telemetry

__all__ = ["KINDS", "features"]

KINDS = ("branches", "known_bugs", "rejections", "hit_gap")


def features() -> frozenset[str]:
    """Every behaviour reached so far in this process, as ``kind: key``."""
    snapshot = telemetry.snapshot()
    single = (f"{kind}: {key}" for kind in KINDS for key in snapshot.get(kind, {}))
    pairs = (f"pair: {a} & {b}" for a, b in telemetry.LABEL_PAIRS)
    return frozenset(itertools.chain(single, pairs))
