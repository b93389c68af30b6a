"""Forward compatibility: a vLLM the suite was not written against.

Each test builds an overlay of the installed vLLM with a few source lines
changed (what a contributor's branch or the next release looks like, see
``tests/harness/overlays.py``) and runs ``python -m fuzz run --vllm-src`` on it:

* a private API the adapter relies on, renamed: exit 2 and one line naming
  it (a harness that does not fit this vLLM), never a violation; the same
  when a name the adapter imports is gone (pytest cannot even start);
* a constructor that starts rejecting a drawn parameter: config rejections,
  counted per reason in the report, never a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.harness.overlays import make_overlay

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, overlay: Path, *targets: str, budget: str = "8s") -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "fuzz", "run", "--vllm-src", str(overlay), "--budget", budget,
            "--seed", "1", "--db", str(tmp_path / "db"), "--repro-dir", str(tmp_path / "repros"),
            "--report-dir", str(tmp_path / "report")]
    for t in targets:
        argv += ["--target", t]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_renamed_private_method_is_exit_2_and_one_line_naming_it(tmp_path: Path) -> None:
    overlay = make_overlay(
        tmp_path / "vllm-src",
        # Renamed everywhere in vLLM itself: vLLM works, the suite's hook does not.
        {"v1/core/sched/scheduler.py": [("_get_local_prefix_cache_hit", "_lookup_local_prefix_hit")]},
    )
    proc = _run(tmp_path, overlay, "scheduler-single-shot")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    named = [ln for ln in out.splitlines() if "Scheduler._get_local_prefix_cache_hit" in ln]
    assert len(named) == 1, out[-3000:]
    assert "0.33.0" in named[0] and "unsupported" in named[0], named
    assert not list((tmp_path / "repros").glob("*.json")), "a harness misfit must not be reported as a violation"


def test_a_name_the_adapter_imports_gone_is_exit_2_and_one_line_naming_it(tmp_path: Path) -> None:
    overlay = make_overlay(
        tmp_path / "vllm-src",
        # Renamed in vLLM and its one caller: vLLM imports, the adapter does not.
        {
            "v1/core/kv_cache_utils.py": [("def get_request_block_hasher(", "def make_request_block_hasher(")],
            "v1/engine/core.py": [("get_request_block_hasher", "make_request_block_hasher")],
        },
    )
    proc = _run(tmp_path, overlay, "truncate-hybrid", budget="3s")
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "get_request_block_hasher" in lines[0] and "0.33.0" in lines[0] and "fuzz/adapter/" in lines[0], lines
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not list((tmp_path / "repros").glob("*.json"))


def test_a_constructor_rejecting_a_drawn_parameter_shows_up_as_config_rejections(tmp_path: Path) -> None:
    overlay = make_overlay(
        tmp_path / "vllm-src",
        {
            "v1/kv_cache_interface.py": [
                (
                    "    extra_retained_tokens: int = 0\n",
                    "    extra_retained_tokens: int = 0\n\n"
                    "    def __post_init__(self):\n"
                    "        if self.sliding_window > 2 * self.block_size:\n"
                    "            raise ValueError('sliding_window wider than two blocks is not supported')\n",
                )
            ]
        },
    )
    proc = _run(tmp_path, overlay, "truncate-any-layout", budget="15s")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    record = json.loads((tmp_path / "report" / "campaign.json").read_text())
    rejections = record["total"]["telemetry"].get("rejections", {})
    wide = {reason: n for reason, n in rejections.items() if "sliding_window wider" in reason}
    assert wide and sum(wide.values()) > 0, rejections
    assert "sliding_window wider" in (tmp_path / "report" / "report.md").read_text()
