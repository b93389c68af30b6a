"""The pytest module ``python -m fuzz run`` executes (with pytest-xdist).

Not collected by the normal test run (its name matches no collection
pattern); the runner passes it explicitly, with the campaign's
:class:`~fuzz.campaign.config.CampaignConfig` in the environment. There is
one item per worker slot; it fuzzes the slot's targets in fair slices for the
whole budget (:func:`fuzz.campaign.fuzzer.run_slot`) and fails, naming each
target's violations, if it found any. Progress goes to the stats directory
(:mod:`fuzz.campaign.progress`).
"""

from __future__ import annotations

import contextlib
import os

import pytest

from fuzz import adapter
from fuzz.coverage import active_tracer
from fuzz.campaign.config import CampaignConfig
from fuzz.campaign.databases import DatabaseUnavailable, open_database
from fuzz.campaign.findings import Findings
from fuzz.campaign.fuzzer import run_slot
from fuzz.campaign.progress import Progress
from fuzz.model import HarnessError
from fuzz.registry import get_target

CONFIG = CampaignConfig.from_env()
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
SLOTS: dict[int, list[str]] = {}
for _target, _slot in CONFIG.items if CONFIG else ():
    SLOTS.setdefault(_slot, []).append(_target)


@pytest.mark.parametrize("slot", sorted(SLOTS), ids=[f"slot{s}" for s in sorted(SLOTS)])
def test_campaign(slot: int) -> None:
    assert CONFIG is not None
    config = CONFIG
    progress = Progress(config.stats_dir, f"{WORKER}-slot{slot}", start=config.start,
                        vllm_version=adapter.VLLM_VERSION)
    findings = Findings(repro_dir=config.repro_dir, start=config.start, campaign_seed=config.seed, worker=WORKER,
                        vllm_version=adapter.VLLM_VERSION)

    def harness_error(line: str) -> None:
        """Stop: the runner sees the file, stops every worker and exits 2."""
        progress.harness_error(line)
        pytest.exit(f"harness error: {' '.join(line.split())}", returncode=2)

    try:
        database = open_database(list(config.db)) if config.db else None
    except Exception as exc:  # noqa: BLE001 - reachable a moment ago in the runner: now a harness error
        harness_error(f"{type(exc).__name__}: {exc}")
    # Targets this vLLM cannot host are skipped, one line each (the runner
    # exits 2 when none can run).
    runnable = []
    for name in SLOTS[slot]:
        missing = adapter.missing_capabilities(get_target(name).needs)
        if missing:
            progress.totals.unsupported[name] = "; ".join(missing)
        else:
            runnable.append(name)
    progress.flush()
    if not runnable:
        return
    planted: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if config.plant in adapter.PLANTED_TRUNCATE_BUGS:
        planted = adapter.planted_truncate_bug(config.plant)
    elif config.plant:
        planted = adapter.planted_scheduler_bug(config.plant)
    try:
        with planted:
            tracer = active_tracer()
            run_slot(config, slot, runnable, database=database, progress=progress, findings=findings,
                     slice_context=None if tracer is None else tracer.slice)
    except DatabaseUnavailable as exc:
        harness_error(str(exc))
    except HarnessError as exc:
        harness_error(str(exc))
    failures = progress.totals.new_failures
    if failures:
        lines = [f"{f['target']}: [{f['invariant']}] {f['violation'].splitlines()[0][:300]}" for f in failures]
        pytest.fail(f"{len(failures)} violation(s):\n" + "\n".join(lines), pytrace=False)
