"""The pytest module ``python -m fuzz run`` executes (with pytest-xdist).

Not collected by the normal test run (its name matches no collection
pattern); the runner passes it explicitly, with the campaign's
:class:`~fuzz.campaign.config.CampaignConfig` in the environment. Each item
is one (target, slot) pair and fuzzes its target in rounds of fresh seeds
until its time slice ends: the example database (shared by every worker)
carries what one round found into the next and across runs. Each worker
writes its :class:`~fuzz.campaign.totals.Totals` to
``<stats_dir>/<worker>.json`` about once a second.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import time
import traceback
import unittest
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import seed as hyp_seed
from hypothesis.stateful import run_state_machine_as_test

from fuzz import adapter, telemetry
from fuzz.campaign.config import CampaignConfig
from fuzz.campaign.databases import DatabaseUnavailable, check_database, open_database
from fuzz.campaign.totals import Totals
from fuzz.hunting import budget_settings
from fuzz.registry import get_target

CONFIG = CampaignConfig.from_env()
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
ITEMS = list(CONFIG.items) if CONFIG else []


class _Progress:
    """This worker's totals, written for the runner at most once a second."""

    def __init__(self, config: CampaignConfig) -> None:
        self.config = config
        self.totals = Totals(vllm_version=adapter.VLLM_VERSION)
        self.keys: set[str] = set()
        self.last_flush = 0.0

    def count(self, target: str) -> None:
        self.totals.count(target)
        self.flush()

    def flush(self, force: bool = False) -> None:
        if not force and time.monotonic() - self.last_flush < 1.0:
            return
        self.last_flush = time.monotonic()
        self.totals.telemetry = telemetry.snapshot()
        path = Path(self.config.stats_dir) / f"{WORKER}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"worker": WORKER, **self.totals.to_json()}))
        tmp.replace(path)


PROGRESS = _Progress(CONFIG) if CONFIG else None


def _failing_line(exc: BaseException) -> str:
    """The deepest frame in vLLM or in our invariants: the dedup key's second half."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/vllm/" in frame.filename or "/invariants/" in frame.filename:
            return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _blob(exc: BaseException) -> str | None:
    for line in getattr(exc, "__notes__", []):
        if "reproduce_failure" in line:
            return line.strip()
    return None


def _record_failure(config: CampaignConfig, progress: _Progress, target_name: str, seed: int | None,
                    exc: BaseException) -> None:
    invariant = getattr(exc, "invariant", type(exc).__name__)
    line = _failing_line(exc)
    key = f"{target_name}|{invariant}|{line}"
    if key in progress.keys:
        return
    progress.keys.add(key)
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    stem = f"{target_name}-{invariant}-{digest}".replace("/", "_")
    repro_dir = Path(config.repro_dir)
    repro_dir.mkdir(parents=True, exist_ok=True)
    message = str(exc)
    repro_file = None
    writer = get_target(target_name).repro_writer()
    if writer is not None:
        source = writer(target=target_name, seed=seed, invariant=invariant, violation=message)
        if source:
            repro_file = repro_dir / f"test_{stem.replace('-', '_')}.py"
            repro_file.write_text(source)
    meta = {
        "target": target_name,
        "invariant": invariant,
        "failing_line": line,
        "key": key,
        "seed": seed,
        "campaign_seed": config.seed,
        "blob": _blob(exc),
        "violation": message[:4000],
        "vllm_version": adapter.VLLM_VERSION,
        "repro": None if repro_file is None else repro_file.name,
        "found_after_s": round(time.time() - config.start, 3),
        "found_at": round(time.time(), 3),
        "worker": WORKER,
    }
    (repro_dir / f"{stem}.json").write_text(json.dumps(meta, indent=2))
    progress.totals.failures.append(meta)
    progress.flush(force=True)


def _round_settings(config: CampaignConfig, phases: list[Phase], database: Any) -> settings:
    return budget_settings(max_examples=config.round_examples, phases=phases, database=database, print_blob=True)


def _run_round(config: CampaignConfig, progress: _Progress, target_name: str, seed: int | None, database: Any,
               reuse: bool) -> None:
    strategy, check, machine = get_target(target_name).load()
    phases = [Phase.generate, Phase.target, Phase.shrink]
    if config.reuse_only:
        phases = [Phase.reuse, Phase.shrink]
    elif reuse:
        phases.insert(0, Phase.reuse)

    def counted(value: Any) -> None:
        progress.count(target_name)
        check(value)

    # One database key per target (the wrapper's source is the same for all),
    # so runners sharing a database replay each target's own failures.
    counted._hypothesis_internal_add_digest = target_name.encode()  # type: ignore[attr-defined]

    if machine is not None:
        class Counted(machine):  # type: ignore[misc, valid-type]
            def teardown(self) -> None:
                progress.count(target_name)
                super().teardown()

        if seed is not None:
            random.seed(seed)
        run_state_machine_as_test(Counted, settings=_round_settings(config, phases, database))
        return
    test = given(strategy)(counted)
    if seed is not None:
        # @seed alone also sets database=None: a seeded campaign would neither
        # replay nor save anything. The settings applied after it win.
        test = hyp_seed(seed)(test)
    _round_settings(config, phases, database)(test)()


def _harness_error(config: CampaignConfig, progress: _Progress, message: str) -> None:
    """Stop this worker's campaign: the runner sees the file, stops every worker and exits 2."""
    progress.flush(force=True)
    line = " ".join(message.split())
    (Path(config.stats_dir) / f"harness-error-{WORKER}.txt").write_text(line + "\n")
    pytest.exit(f"harness error: {line}", returncode=2)


@pytest.mark.parametrize(("target_name", "slot"), ITEMS, ids=[f"{t}#{s}" for t, s in ITEMS])
def test_campaign(target_name: str, slot: int) -> None:
    assert CONFIG is not None and PROGRESS is not None
    config, progress = CONFIG, PROGRESS
    # The budget is fuzzing time: each target gets an equal share on every
    # worker (slots == workers), counted from when the item starts, so the
    # start-up (importing vLLM, ~5-10 s) comes on top of it.
    deadline = time.time() + config.budget / len(config.targets)
    try:
        database = open_database(list(config.db)) if config.db else None
    except Exception as exc:  # noqa: BLE001 - reachable a moment ago in the runner: now a harness error
        _harness_error(config, progress, f"{type(exc).__name__}: {exc}")
    planted = adapter.planted_truncate_bug(config.plant) if config.plant else contextlib.nullcontext()
    found = []
    started = time.time()
    with planted:
        rnd = 0
        while time.time() < deadline:
            seed = None if config.seed is None else config.seed * 1_000_003 + slot * 10_007 + rnd
            try:
                check_database(database)
                # Once this item found something, stop replaying it from the
                # database every round and look for other failures.
                _run_round(config, progress, target_name, seed, database, reuse=not found)
            except DatabaseUnavailable as exc:
                _harness_error(config, progress, str(exc))
            except unittest.SkipTest:
                pass  # --reuse-only, and nothing in the database for this target yet
            except Exception as exc:  # noqa: BLE001 - every failure is a finding
                found.append(exc)
                _record_failure(config, progress, target_name, seed, exc)
            rnd += 1
            if len(found) >= 5:
                break
            if config.reuse_only:
                if found:
                    break  # the database's failure is reported; replaying it again adds nothing
                time.sleep(0.5)  # wait for other runners to save something
    progress.totals.seconds[target_name] = progress.totals.seconds.get(target_name, 0.0) + time.time() - started
    progress.flush(force=True)
    if found:
        pytest.fail(f"{len(found)} violation(s) in {target_name}; first: {str(found[0])[:2000]}", pytrace=False)
