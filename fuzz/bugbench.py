"""``python -m fuzz bugbench``: how long the suite takes to find real vLLM bugs
(Magma-style time-to-bug over repeated trials).

The registry is :data:`fuzz.known_bugs.KNOWN_BUGS`: each bug names the
release that fixed it (``fixed_in``), the oldest release known to have it
(``since``), the targets expected to find it (``targets``), and its
signatures (invariant plus vLLM location), which recognise a finding
(:func:`fuzz.known_bugs.match`; never a message). A bug whose ``targets``
is empty is listed with its ``bench_note`` instead of being timed.

Each trial, for one bug:

- runs on the newest *installed* release that has the bug (``--root``, the
  side-by-side installs of :mod:`fuzz.matrix.envs`, or the base venv's
  vLLM), in a child process with that release first on ``PYTHONPATH``;
- fuzzes the bug's targets in the campaign's fair slices
  (:class:`~fuzz.campaign.schedule.DiscoverySchedule`) with the campaign's
  generation phases (generate, target; no shrinking: the clock stops at the
  first example that shows the bug);
- starts from no example database, so nothing is replayed, and sees
  generated examples only: pinned ``@example``\\ s live on the pytest
  functions, which neither the campaign nor this bench runs (they build
  their tests from the registry's strategy and check, and the explicit
  phase is not among their phases);
- has known-bug suppression off (``FUZZ_KNOWN_BUGS=report``,
  :func:`fuzz.known_bugs.suppressing`): the scheduler tier raises a known
  bug's violation instead of setting it aside;
- lets every other failure pass (counted by invariant) and goes on;
- ends at the first example showing the bug or at the wall-clock budget.

Trials of one bug run one after another in one child process (vLLM is
imported once; each target runs a few warm-up examples first, so a trial's
clock holds fuzzing only). Seeds are 0..N-1; slice ``i`` of seed ``s``
uses Hypothesis seed ``s*1000003 + i``.

The result: a table and JSON (found k/N, median and worst seconds to the
first failure, with the commit and machine). A trial that missed counts as
longer than the budget, so the median is ``> budget`` when fewer than half
found the bug.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz.known_bugs import KNOWN_BUGS, SUPPRESS_ENV, KnownBug, _release

__all__ = ["BenchBug", "bench_bugs", "main", "parse_or_exit_code", "summarize_trials"]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BUDGET_S = 120.0
DEFAULT_SEEDS = 5
WARMUP_EXAMPLES = 3


@dataclass(frozen=True)
class BenchBug:
    bug: KnownBug
    release: str | None  # None: no installed release has it
    path: Path | None  # its install (None: the base venv)
    note: str = ""  # why it is not timed, or how the release was chosen


def installed_releases(root: Path) -> dict[str, Path | None]:
    """Release -> install directory (``None``: the base venv's vLLM)."""
    from fuzz.matrix.envs import MARKER

    found: dict[str, Path | None] = {}
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if (d / MARKER).is_file():
                found[d.name] = d
    try:
        found[importlib.metadata.version("vllm")] = None
    except importlib.metadata.PackageNotFoundError:
        pass
    return found


def bench_bugs(root: Path, bug_ids: list[str] | None = None) -> list[BenchBug]:
    """Every known bug (or those named) with the release its trials run on."""
    releases = installed_releases(root)
    out = []
    for bug in KNOWN_BUGS:
        if bug_ids and bug.id not in bug_ids:
            continue
        if not bug.targets:
            out.append(BenchBug(bug, None, None, bug.bench_note or "no target expected to find it"))
            continue
        having = sorted((v for v in releases if bug.affects(v)), key=lambda v: _release(v) or ())
        if not having:
            out.append(BenchBug(bug, None, None, f"no installed release has it (since {bug.since}, "
                                                 f"fixed in {bug.fixed_in}); install one with fuzz.matrix.envs"))
            continue
        release = having[-1]
        note = ""
        if _release(release) != _release(bug.since):
            note = f"earliest affected release {bug.since} not installed here; ran on {release}"
        out.append(BenchBug(bug, release, releases[release], note))
    return out


# -- the child: trials in one process ----------------------------------------------


class _Found(BaseException):
    """The example showed the bug: stop the clock (no shrinking)."""


class _SliceOver(BaseException):
    """The slice (or the trial's budget) has had its time."""


class _Searcher:
    """The campaign's search in one process: the targets' Hypothesis tests in
    slices picked by :class:`~fuzz.campaign.schedule.DiscoverySchedule`, each
    example judged by a predicate (what a trial hunts) and every other
    failure counted."""

    def __init__(self, targets: list[str]) -> None:
        from fuzz import adapter
        from fuzz.registry import get_target

        adapter.init_hashing()
        self.version = adapter.VLLM_VERSION
        self.targets = list(targets)
        self.loaded = {name: get_target(name).load() for name in targets}

    def label(self, exc: BaseException) -> str:
        """A failure, by its known bug or its structured facts."""
        from fuzz import known_bugs
        from fuzz.model import InvariantViolation

        bug = known_bugs.match_violation(exc, self.version) if isinstance(exc, InvariantViolation) else None
        if bug is not None:
            return f"known: {bug.id}"
        frames = getattr(exc, "frames", ()) or ()
        return (f"{getattr(exc, 'invariant', type(exc).__name__)} ({getattr(exc, 'exception', None)} "
                f"at {frames[0].split(':')[-1] if frames else getattr(exc, 'where', '?')})")

    def _run(self, name: str, examples: int, seed: int, stop_at: float, state: dict[str, Any]) -> None:
        from hypothesis import Phase, Verbosity
        from hypothesis.errors import HypothesisException

        from fuzz import telemetry
        from fuzz.hunting import budget_settings, property_test

        strategy, check, machine = self.loaded[name]
        hunted = state["hunted"]

        def wrap(inner: Any) -> Any:
            def counted(*args: Any, **kwargs: Any) -> None:
                state["examples"] += 1
                telemetry.begin_example()
                try:
                    inner(*args, **kwargs)
                except HypothesisException:
                    raise
                except Exception as exc:  # noqa: BLE001 - every failure is judged
                    if hunted is not None and hunted(exc):
                        state["found"] = (time.monotonic() - state["t0"], name, self.label(exc))
                        raise _Found from None
                    state["other"][self.label(exc)] += 1
                finally:
                    telemetry.end_example()
                if time.monotonic() > stop_at:
                    raise _SliceOver

            return counted

        settings = budget_settings(max_examples=examples, phases=[Phase.generate, Phase.target],
                                   verbosity=Verbosity.quiet)
        test = property_test(settings=settings, strategy=strategy, body=check, machine=machine, seed=seed,
                             wrap=wrap)
        try:
            test()
        except (_SliceOver, _Found):
            pass

    def warm_up(self) -> float:
        """Each target's module and first vLLM configuration (a ModelConfig
        takes seconds the first time) are start-up, not search: seconds spent."""
        from fuzz.hunting import settle_heap

        t0 = time.monotonic()
        state = {"examples": 0, "hunted": None, "other": Counter(), "t0": t0}
        for name in self.targets:
            self._run(name, WARMUP_EXAMPLES, 10**9 + 7, time.monotonic() + 30.0, state)
        settle_heap()  # as a campaign does after its first round
        return time.monotonic() - t0

    def trial(self, seed: int, budget: float, hunted: Any) -> dict[str, Any]:
        """One trial: the clock stops at the first example ``hunted(exc)``
        accepts, or at ``budget`` seconds."""
        from fuzz.campaign.novelty import features
        from fuzz.campaign.schedule import DiscoverySchedule

        state: dict[str, Any] = {"examples": 0, "hunted": hunted, "other": Counter(), "found": None,
                                 "t0": time.monotonic()}
        schedule = DiscoverySchedule(list(self.targets), budget)
        start = state["t0"]
        seen = features()
        while state["found"] is None and (turn := schedule.next_turn(time.monotonic() - start)) is not None:
            t0, before = time.monotonic(), state["examples"]
            self._run(turn.target, turn.examples, seed * 1_000_003 + turn.index,
                      min(t0 + 2 * turn.seconds, start + budget), state)
            reached = features()
            schedule.record(turn, seconds=time.monotonic() - t0, examples=state["examples"] - before,
                            novelty=len(reached - seen))
            seen = reached
        found = state["found"]
        return {
            "seed": seed, "found": found is not None,
            "seconds": None if found is None else round(found[0], 2),
            "target": None if found is None else found[1],
            "claim": None if found is None else found[2],
            "examples": state["examples"], "fuzzed_s": round(time.monotonic() - start, 1),
            "other_failures": dict(state["other"]),
        }


def _trials(bug_id: str, targets: list[str], seeds: list[int], budget: float) -> dict[str, Any]:
    from fuzz import known_bugs
    from fuzz.model import InvariantViolation

    assert not known_bugs.suppressing(), f"run with {SUPPRESS_ENV}=report"
    searcher = _Searcher(targets)

    def shows_bug(exc: BaseException) -> bool:
        if not isinstance(exc, InvariantViolation):
            return False
        bug = known_bugs.match_violation(exc, searcher.version)
        return bug is not None and bug.id == bug_id

    warmup_s = searcher.warm_up()
    results = []
    for seed in seeds:
        results.append(searcher.trial(seed, budget, shows_bug))
        print(json.dumps({"bug": bug_id, **results[-1]}), flush=True)
    return {"vllm_version": searcher.version, "warmup_s": round(warmup_s, 1), "trials": results}


# -- the parent ----------------------------------------------------------------------


def summarize_trials(trials: list[dict[str, Any]], budget: float) -> dict[str, Any]:
    """found k/N, median and worst seconds (a miss counts as past the budget)."""
    n = len(trials)
    times = sorted(t["seconds"] if t["found"] else float("inf") for t in trials)
    k = sum(t["found"] for t in trials)
    median = statistics.median(times) if times else float("inf")
    worst = times[-1] if times else float("inf")
    return {"found": k, "trials": n,
            "median_s": None if median == float("inf") else round(median, 1),
            "worst_s": None if worst == float("inf") else round(worst, 1),
            "found_by": dict(Counter(t["target"] for t in trials if t["found"])),
            "examples": sum(t["examples"] for t in trials)}


def _seconds(value: float | None, budget: float) -> str:
    return f"> {budget:.0f}" if value is None else f"{value:.1f}"


def format_table(report: dict[str, Any]) -> str:
    budget = report["budget_s"]
    rows = ["| bug | release | fixed in | targets | found | median s | worst s | found by | other failures |",
            "|---|---|---|---|---:|---:|---:|---|---|"]
    for b in report["bugs"]:
        if b.get("summary") is None:
            rows.append(f"| `{b['id']}` | {b.get('release') or '-'} | {b['fixed_in'] or 'open'} | "
                        f"{', '.join(b['targets']) or '-'} | not timed | | | | {b['note']} |")
            continue
        s = b["summary"]
        other = Counter()
        for t in b["trials"]:
            other.update(t["other_failures"])
        rows.append(
            f"| `{b['id']}` | {b['release']} | {b['fixed_in'] or 'open'} | {', '.join(b['targets'])} | "
            f"{s['found']}/{s['trials']} | {_seconds(s['median_s'], budget)} | {_seconds(s['worst_s'], budget)} | "
            f"{', '.join(f'{k} {v}' for k, v in s['found_by'].items()) or '-'} | "
            f"{', '.join(f'{k} {v}' for k, v in sorted(other.items())) or '-'} |")
    return "\n".join(rows)


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        return "?"


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()} {os.cpu_count()} CPU(s), Python {platform.python_version()}, "
            f"load average {load:.1f} at start")


def run_bench(bugs: list[BenchBug], *, budget: float, seeds: int, timeout_slack: float = 300.0) -> dict[str, Any]:
    from fuzz.matrix.envs import python_env_for

    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(), "machine": machine(), "budget_s": budget, "seeds": seeds, "bugs": []}
    for b in bugs:
        entry: dict[str, Any] = {"id": b.bug.id, "title": b.bug.title, "since": b.bug.since,
                                 "fixed_in": b.bug.fixed_in, "targets": list(b.bug.targets),
                                 "release": b.release, "note": b.note, "summary": None, "trials": []}
        report["bugs"].append(entry)
        if b.release is None:
            print(f"{b.bug.id}: not timed: {b.note}", flush=True)
            continue
        env = python_env_for(b.path)
        env[SUPPRESS_ENV] = "report"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
        with tempfile.TemporaryDirectory(prefix="bugbench-") as tmp:
            out = Path(tmp) / "result.json"
            job = {"bug": b.bug.id, "targets": list(b.bug.targets), "seeds": list(range(seeds)),
                   "budget": budget, "out": str(out)}
            print(f"{b.bug.id}: vLLM {b.release}, targets {', '.join(b.bug.targets)}, "
                  f"{seeds} seed(s) x {budget:.0f}s", flush=True)
            try:
                proc = subprocess.run([sys.executable, "-m", "fuzz.bugbench", "--child", json.dumps(job)],
                                      cwd=ROOT, env=env, timeout=seeds * (budget + 60) + timeout_slack,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                log = proc.stdout
            except subprocess.TimeoutExpired as exc:
                log = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
                proc = None
            if proc is None or proc.returncode != 0 or not out.is_file():
                entry["error"] = log[-3000:]
                print(f"{b.bug.id}: the trials did not complete:\n{log[-3000:]}", flush=True)
                continue
            result = json.loads(out.read_text())
        entry.update(trials=result["trials"], warmup_s=result["warmup_s"], vllm_version=result["vllm_version"],
                     summary=summarize_trials(result["trials"], budget))
        s = entry["summary"]
        print(f"{b.bug.id}: found {s['found']}/{s['trials']}, median {_seconds(s['median_s'], budget)} s, "
              f"worst {_seconds(s['worst_s'], budget)} s", flush=True)
    return report


def parse_or_exit_code(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """``parser``'s arguments, or the exit code when they end the command (a
    usage error, one line on stderr: 2; ``--help``: 0)."""
    from fuzz.args import EXIT_ERROR, UsageError

    try:
        return parser.parse_args(argv)
    except UsageError as exc:
        print(f"python -m fuzz bugbench: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except SystemExit as exc:  # --help
        return 0 if exc.code in (0, None) else EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    from fuzz.matrix.envs import DEFAULT_ROOT

    from fuzz.args import OneLineParser

    p = OneLineParser(prog="python -m fuzz bugbench", description=__doc__.splitlines()[0],
                      epilog="--planted: the planted scheduler bugs instead (fuzz/plantbench.py)")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds per trial (default %(default)s)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="trials per bug (default %(default)s)")
    p.add_argument("--bug", action="append", default=[], help="only this bug id (repeatable)")
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="release installs (default .cache/vllm-envs)")
    p.add_argument("--json", type=Path, default=ROOT / "fuzz-out" / "bugbench.json", help="where the JSON goes")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parse_or_exit_code(p, argv)
    if isinstance(args, int):
        return args
    if args.child is not None:
        job = json.loads(args.child)
        result = _trials(job["bug"], job["targets"], job["seeds"], job["budget"])
        Path(job["out"]).write_text(json.dumps(result))
        return 0
    known = {b.id for b in KNOWN_BUGS}
    unknown = [b for b in args.bug if b not in known]
    if unknown or args.seeds < 1 or args.budget <= 0:
        print(f"python -m fuzz bugbench: {'unknown bug ' + unknown[0] + '; known: ' + ', '.join(sorted(known)) if unknown else '--seeds and --budget must be positive'}",
              file=sys.stderr)
        return 2
    bugs = bench_bugs(args.root, args.bug or None)
    report = run_bench(bugs, budget=args.budget, seeds=args.seeds)
    table = format_table(report)
    print(f"\nbugbench: commit {report['commit']}, {report['date']}, {report['machine']}; "
          f"{args.seeds} seed(s) x {args.budget:.0f} s per bug\n{table}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"json: {args.json}")
    errors = [b for b in report["bugs"] if b.get("error")]
    return 2 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
