"""Run the targets on each release, one subprocess per (release, target),
and read back one :class:`Cell` per run.

Every pair runs in a subprocess of the base venv's interpreter, the release
first on ``PYTHONPATH`` (:mod:`fuzz.matrix.envs`)::

    python -m pytest <the target's pytest node> -p fuzz.matrix.plugin
        --junitxml=...   # HYPOTHESIS_PROFILE=ci, FUZZ_CI_EXAMPLES=--examples

so its pinned ``@example``s run too; the outcome comes from the JUnit XML and
the plugin's statistics (:mod:`fuzz.matrix.plugin`): pass / violation /
skipped / error, examples run, seconds.
"""

from __future__ import annotations

import json

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fuzz.matrix.envs import DEFAULT_ROOT, ensure_vllm_env, python_env_for
from fuzz import known_bugs
from fuzz.matrix.releases import Release
from fuzz.outcomes import Outcome
from fuzz.registry import Target

__all__ = ["STATUSES", "Cell", "format_table", "incomplete", "new_violations", "run_cell", "run_matrix"]

ROOT = Path(__file__).resolve().parents[2]
STATUSES = ("pass", "violation", "skipped", "error")


@dataclass(frozen=True)
class Cell:
    """The outcome of one target on one release."""

    release: str
    target: str  # the registry name
    status: str  # one of STATUSES
    examples: int | None
    seconds: float
    note: str = ""
    reference: bool = False
    vllm_version: str | None = None
    known_bug: str | None = None  # KnownReleaseBug.bug_id of a documented, fixed bug


def _first_line(text: str | None, limit: int = 160) -> str:
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _cell_from_junit(
    release: Release, target: Target, xml_path: Path, stats: dict, seconds: float
) -> Cell:
    nodeid = target.nodeid
    base = Cell(release.label, target.name, "error", None, seconds, reference=release.reference,
                vllm_version=stats.get("vllm_version"))
    cases = ET.parse(xml_path).getroot().iter("testcase")
    failures, errors, skips, passes = [], [], [], 0
    details = ""
    for case in cases:
        if (el := case.find("failure")) is not None:
            failures.append(el.get("message") or el.text or "")
            details += el.text or ""
        elif (el := case.find("error")) is not None:
            errors.append(el.get("message") or el.text or "")
        elif (el := case.find("skipped")) is not None:
            skips.append(el.get("message") or "")
        else:
            passes += 1
    items = [v for k, v in stats.get("items", {}).items()
             if k == nodeid or k.startswith((nodeid + "[", nodeid + "::"))]
    examples = sum(v["examples"] for v in items) if items else None
    if errors:
        return replace(base, note="pytest error: " + _first_line(errors[0]))
    if failures:
        found = [v for v in items if v.get("first_failure_s") is not None]
        how = ""
        if "Failing explicit example" in details:
            how = "a pinned @example failed; "
        if found:
            f = found[0]
            how += (f"found at example {f['examples_to_failure']} after {f['first_failure_s']:.1f}s, "
                    f"{f['shrink_calls']} shrink calls; ")
        judged = next((v for v in items if v.get("outcome")), {})
        if judged.get("outcome") in (Outcome.HARNESS_ERROR.value, Outcome.CONFIG_REJECTED.value):
            # The suite does not fit this vLLM (or a refusal escaped): not a
            # vLLM bug, and the cell says nothing about vLLM.
            return replace(base, examples=examples, note=f"{judged['outcome']}: {judged['reason']}")
        known = None
        if judged.get("failure"):
            facts = dict(judged["failure"], frames=tuple(judged["failure"]["frames"]))
            known = known_bugs.match(known_bugs.Failure(**facts), stats.get("vllm_version") or release.spec)
        if known is not None:
            fixed = f"fixed in {known.fixed_in}" if known.fixed_in else "open"
            return replace(base, status="violation", examples=examples, known_bug=known.id,
                           note=f"known vLLM bug ({fixed}): {known.id} (pinned by {known.pinned_by}); "
                           + how + _first_line(failures[0]))
        return replace(base, status="violation", examples=examples, note=how + _first_line(failures[0]))
    if skips and not passes:
        return replace(base, status="skipped", examples=examples, note=_first_line(skips[0]))
    if passes:
        return replace(base, status="pass", examples=examples)
    return replace(base, note="the JUnit XML holds no test case")


def run_cell(
    release: Release,
    target: Target,
    *,
    examples: int,
    timeout: float,
    out_dir: Path,
    skip_phases: str,
) -> Cell:
    """Run one target on one (installed) release in a subprocess and read the result."""
    stem = f"{release.spec.replace('/', '_').replace(':', '_')}__{target.name}"
    xml_path, stats_path, log_path = (out_dir / f"{stem}{ext}" for ext in (".xml", ".stats.json", ".log"))
    for p in (xml_path, stats_path):
        p.unlink(missing_ok=True)
    env = python_env_for(release.path)
    env.update(
        HYPOTHESIS_PROFILE="ci",
        FUZZ_CI_EXAMPLES=str(examples),
        FUZZ_MATRIX_STATS=str(stats_path),
        FUZZ_MATRIX_SKIP_PHASES=skip_phases,
    )
    for name in ("HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY", "HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER"):
        env.pop(name, None)  # either would write every example to .hypothesis/observed
    cmd = [sys.executable, "-m", "pytest", target.nodeid, "-q", "-p", "fuzz.matrix.plugin",
           f"--junitxml={xml_path}", "--hypothesis-show-statistics"]
    start = time.monotonic()
    fail = Cell(release.label, target.name, "error", None, 0.0, reference=release.reference)
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(" ".join(cmd) + f"\n# PYTHONPATH={env.get('PYTHONPATH', '')}\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            return replace(fail, seconds=round(time.monotonic() - start, 1),
                           note=f"timed out after {timeout:.0f}s (log: {log_path})")
    seconds = round(time.monotonic() - start, 1)
    fail = replace(fail, seconds=seconds)
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    if not xml_path.is_file():
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or [""]
        return replace(fail, note=f"pytest rc={proc.returncode}, no JUnit XML: {_first_line(tail[0])} (log: {log_path})")
    wrong = _wrong_vllm(release, stats)
    if wrong:
        return replace(fail, note=wrong)
    cell = _cell_from_junit(release, target, xml_path, stats, seconds)
    if cell.status == "pass" and proc.returncode not in (0,):
        return replace(fail, note=f"pytest rc={proc.returncode} although the target passed (log: {log_path})")
    return cell


def _wrong_vllm(release: Release, stats: dict) -> str | None:
    """A message when the subprocess did not import the vLLM it was meant to."""
    got = stats.get("vllm_file")
    if got is None:
        return None  # vLLM never imported (e.g. a target skipped at import); nothing to check
    got_path = Path(got).resolve()
    if release.path is not None and release.path not in got_path.parents:
        return f"imported vllm from {got_path}, not from {release.path}"
    if release.path is None and release.kind == "base" and stats.get("vllm_version") != release.spec:
        return f"base venv imported vllm {stats.get('vllm_version')}, expected {release.spec}"
    return None


def _widths(rows: list[list[str]]) -> list[int]:
    return [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]


def format_table(cells: Sequence[Cell]) -> str:
    """A Markdown table: release | target | result | examples | seconds | note."""
    header = ["release", "target", "result", "examples", "seconds", "note"]
    rows = [header] + [
        [
            c.release,
            c.target,
            c.status + (" (known)" if c.known_bug else " (expected)" if c.reference and c.status == "violation" else ""),
            "-" if c.examples is None else str(c.examples),
            f"{c.seconds:.1f}",
            c.note.replace("|", "\\|"),
        ]
        for c in cells
    ]
    w = _widths(rows)
    lines = ["| " + " | ".join(v.ljust(w[i]) for i, v in enumerate(r)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (n + 2) for n in w) + "|")
    return "\n".join(lines)


def incomplete(cells: Sequence[Cell]) -> list[Cell]:
    """The cells with no result (a harness error): the table is incomplete."""
    return [c for c in cells if c.status == "error"]


def new_violations(cells: Sequence[Cell]) -> list[Cell]:
    """Violations that are neither on a reference row nor a known bug of their release."""
    return [c for c in cells if c.status == "violation" and not c.reference and not c.known_bug]


def install(release: Release, root: Path) -> tuple[Release, str | None]:
    """The release with its install directory (installed if missing), or why the install failed."""
    if release.kind != "pypi":
        return release, None
    try:
        return replace(release, path=ensure_vllm_env(release.spec, root)), None
    except (RuntimeError, ValueError, OSError) as exc:
        return release, f"install failed: {_first_line(str(exc))}"


def run_matrix(
    releases: Sequence[Release],
    targets: Sequence[Target],
    *,
    examples: int = 100,
    timeout: float = 900.0,
    out_dir: Path = ROOT / "fuzz-out" / "matrix",
    root: Path = DEFAULT_ROOT,
    skip_phases: str = "target,explain",
) -> list[Cell]:
    """Install what is missing, run every target on every release, one
    subprocess each, in order; progress goes to stderr. A release that fails
    to install gets an ``error`` cell per target; the rest still run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cells: list[Cell] = []
    for release in releases:
        t0 = time.monotonic()
        release, problem = install(release, root)
        if problem:
            print(f"[matrix] {release.label}: {problem}", file=sys.stderr, flush=True)
            cells += [Cell(release.label, t.name, "error", None, round(time.monotonic() - t0, 1), problem,
                           release.reference) for t in targets]
            continue
        for target in targets:
            cell = run_cell(release, target, examples=examples, timeout=timeout,
                            out_dir=out_dir, skip_phases=skip_phases)
            if release.kind == "src" and cell.vllm_version:
                cell = replace(cell, release=f"{release.label} (vllm {cell.vllm_version})")
            cells.append(cell)
            print(f"[matrix] {cell.release} {cell.target}: {cell.status} "
                  f"({cell.examples if cell.examples is not None else '-'} examples, {cell.seconds:.1f}s)",
                  file=sys.stderr, flush=True)
    return cells
