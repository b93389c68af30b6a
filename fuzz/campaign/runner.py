"""The runner side of ``python -m fuzz run``: start the workers, watch them,
add up what they counted.

The workers are pytest(-xdist) processes running :mod:`fuzz.campaign.worker`
with the :class:`~fuzz.campaign.config.CampaignConfig` in their environment;
each writes its :class:`~fuzz.campaign.totals.Totals` to the stats directory
(:mod:`fuzz.campaign.progress`), which the runner merges for its progress
line and its result, and stops every worker when one reports a harness error.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fuzz import coverage
from fuzz.campaign import config as config_module
from fuzz.campaign.config import CampaignConfig
from fuzz.campaign.progress import harness_errors, read_totals
from fuzz.campaign.totals import Totals

__all__ = ["CampaignResult", "run_campaign"]

ROOT = Path(__file__).resolve().parents[2]
WORKER_MODULE = Path(__file__).with_name("worker.py")


@dataclass(frozen=True)
class CampaignResult:
    totals: Totals
    elapsed: float  # wall time from the config's start
    pytest_rc: int
    harness_errors: list[str]  # one line each, from workers that could not go on
    log: Path  # pytest's output
    refused: str | None = None  # what the preflight check refused (the workers were stopped)


def progress_line(total: Totals, elapsed: float, budget: float) -> str:
    n = total.example_count
    branches = len(total.telemetry.get("branches", {}))
    return (
        f"[{elapsed:6.1f}s, budget {budget:.0f}s] examples {n:>7}  {n / max(elapsed, 1e-9):7.1f}/s  "
        f"failures {len(total.violations)}  missed hits {len(total.missed_hits)}  branches {branches}  "
        f"targets started {len(total.first_example_s)}"
    )


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_campaign(config: CampaignConfig, *, workers: int, profile: str, env: dict[str, str],
                 junit: Path | None = None, preflight: Callable[[], str | None] | None = None) -> CampaignResult:
    """Run the workers to the end of the budget, printing progress (a live
    line on a terminal, one line every 10 s otherwise).

    ``preflight`` is a check that needs vLLM (e.g. a planted bug's name): it
    runs here while the workers start, rather than before them, so its
    import costs no start-up; a message it returns stops the workers."""
    stats_dir = Path(config.stats_dir)
    # Only the plugins a worker needs: autoloading every installed pytest
    # plugin (anyio, trio, ...) costs each worker about 1.4 s of start-up.
    env = dict(env, HYPOTHESIS_PROFILE=profile, PYTHONUNBUFFERED="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env[config_module.ENV] = config.to_env()
    cmd = [sys.executable, "-m", "pytest", str(WORKER_MODULE), "-q", "-p", "no:cacheprovider",
           "--rootdir", str(ROOT), "-o", "addopts=", "-W", "ignore::DeprecationWarning"]
    if config.coverage:
        cmd += ["-p", "fuzz.coverage"]  # starts the tracer before conftest.py imports vLLM
        env[coverage.TRACE_ENV] = coverage.trace_env(config.stats_dir, config.start, config.slots)
    if workers > 1:
        cmd += ["-p", "xdist.plugin", "-n", str(workers), "--dist", "load"]
    if junit is not None:
        cmd += ["--junitxml", str(junit.resolve())]
    tty = sys.stdout.isatty()
    log = stats_dir / "pytest.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        refused = preflight() if preflight is not None else None
        if refused is not None:
            _stop(proc)
            return CampaignResult(Totals(), time.time() - config.start, proc.returncode, [], log, refused)
        last_plain = 0.0
        while proc.poll() is None:
            time.sleep(0.5)
            if harness_errors(stats_dir):
                _stop(proc)  # e.g. the shared database is gone: no point fuzzing on
                break
            elapsed = time.time() - config.start
            if tty:
                print("\r" + progress_line(read_totals(stats_dir), elapsed, config.budget), end="", flush=True)
            elif elapsed - last_plain >= 10:
                last_plain = elapsed
                print(progress_line(read_totals(stats_dir), elapsed, config.budget), flush=True)
    elapsed = time.time() - config.start
    total = read_totals(stats_dir)
    if tty:
        print()
    print(progress_line(total, elapsed, config.budget))
    return CampaignResult(total, elapsed, proc.returncode, harness_errors(stats_dir), log)
