"""Coverage of vLLM's own KV-cache and scheduler code (``python -m fuzz run --coverage``).

coverage.py measures line and branch coverage of :data:`MODULES` in every
campaign worker; the runner combines the workers' data files, ``python -m
fuzz merge`` the shards', and :func:`summarize` turns one combined result
into the tables the report prints.

Three parts, one per process role:

- **worker** (a pytest plugin, ``-p fuzz.coverage``): importing it starts
  the tracer when the campaign asks for coverage, before ``conftest.py``
  imports vLLM, so import-time lines count too. Each target's slices run
  under a coverage *context* named after the target
  (:meth:`Tracer.slice`), and every couple of seconds the arcs each target
  has reached so far are diffed against the last look: the new ones go to
  a timeline (seconds since the campaign started, target, new arcs), which
  gives the coverage-over-time curves without re-analysing anything while
  fuzzing.
- **runner / merge**: :func:`combine` joins data files and timelines.
- **report**: :func:`summarize` (per file, per function, never-taken
  branches with their source lines, covered branches against seconds per
  target), :func:`markdown` and :func:`svg_growth`.

Only unmodified vLLM is measured: planted scheduler edits are compiled under
``scheduler.py``'s filename and would be counted against its lines, so the
CLI refuses ``--coverage`` with ``--plant``.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import html
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz.coverage.render import compare, growth_table, markdown, overhead_line, svg_growth
from fuzz.coverage.summary import Summary

__all__ = [
    "FUNCTIONS",
    "MODULES",
    "Summary",
    "TRACE_ENV",
    "Tracer",
    "active_tracer",
    "combine",
    "compare",
    "growth_table",
    "markdown",
    "overhead_line",
    "summarize",
    "trace_env",
    "svg_growth",
]

# The modules measured, relative to the directory holding the ``vllm`` package.
MODULES: tuple[str, ...] = (
    "vllm/v1/core/kv_cache_manager.py",
    "vllm/v1/core/kv_cache_coordinator.py",
    "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/v1/core/sched/scheduler.py",
)

# The functions this suite exists for: (module, qualified-name pattern). A
# pattern ``*.name`` is every class's method of that name. The scheduler's
# waiting-queue admission is a loop inside ``schedule()``: the region
# ``Scheduler.schedule[waiting]`` (:func:`_regions`).
FUNCTIONS: tuple[tuple[str, str], ...] = (
    ("vllm/v1/core/kv_cache_manager.py", "KVCacheManager.truncate_computed_blocks"),
    ("vllm/v1/core/kv_cache_manager.py", "KVCacheManager.get_computed_blocks"),
    ("vllm/v1/core/kv_cache_manager.py", "KVCacheManager.get_computed_blocks_for_connector"),
    ("vllm/v1/core/kv_cache_manager.py", "KVCacheManager.allocate_slots"),
    ("vllm/v1/core/kv_cache_coordinator.py", "*.find_longest_cache_hit"),
    ("vllm/v1/core/kv_cache_coordinator.py", "*.find_longest_cache_hit_per_group"),
    ("vllm/v1/core/single_type_kv_cache_manager.py", "*.find_longest_cache_hit"),
    ("vllm/v1/core/single_type_kv_cache_manager.py", "*.get_num_blocks_to_allocate"),
    ("vllm/v1/core/single_type_kv_cache_manager.py", "*.remove_skipped_blocks"),
    ("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule[waiting]"),
    ("vllm/v1/core/sched/scheduler.py", "Scheduler.update_from_output"),
)

DATA_DIR = "coverage"  # under a campaign's stats directory: workers' data files and timelines
DATA_FILE = ".coverage"  # the combined result, in the report directory
TIMELINE = "coverage-timeline.json"
SNAPSHOT_EVERY_S = 2.0
STARTUP = "start-up"  # the timeline's name for arcs run outside every target's slices


def vllm_root() -> Path:
    """The directory holding the ``vllm`` package this interpreter would import
    (found without importing it: the tracer must start first)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        raise RuntimeError("no vllm package on the import path")
    return Path(spec.origin).resolve().parent.parent


def _module_of(path: str) -> str | None:
    """``vllm/v1/core/...py`` for a measured file's absolute path (any install)."""
    norm = path.replace(os.sep, "/")
    return next((m for m in MODULES if norm.endswith("/" + m)), None)


# -- the worker side ---------------------------------------------------------------


class Tracer:
    """coverage.py running in one worker process, with a timeline per target."""

    def __init__(self, out_dir: Path, worker: str, *, start: float) -> None:
        import coverage

        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.worker = worker
        self.start = start  # the runner's start (time.time())
        root = vllm_root()
        self.cov = coverage.Coverage(
            data_file=str(self.out_dir / DATA_FILE), data_suffix=worker, branch=True,
            include=[str(root / m) for m in MODULES], config_file=False,
        )
        self.known: dict[tuple[str, str], set[tuple[int, int]]] = {}  # (target, module) -> arcs seen
        self.events: list[list[Any]] = []  # [seconds, target, {module: [[from, to], ...]}]
        # Arcs run outside every slice (importing vLLM, hash set-up) are
        # start-up's: coverage's empty context.
        self.targets: list[str] = [STARTUP]
        self._last = 0.0
        self._done = False
        self.cov.start()

    @contextlib.contextmanager
    def slice(self, target: str) -> Iterator[None]:
        """Run one slice of ``target`` under its context; look at what it reached
        afterwards (at most every :data:`SNAPSHOT_EVERY_S`)."""
        if target not in self.targets:
            self.targets.append(target)
        self.cov.switch_context(target)  # STARTUP is "": no slice is ever named so
        try:
            yield
        finally:
            if time.monotonic() - self._last >= SNAPSHOT_EVERY_S:
                self.snapshot()

    def snapshot(self) -> None:
        """Diff every target's arcs against the last look; append the new ones."""
        self._last = time.monotonic()
        now = round(time.time() - self.start, 3)
        data = self.cov.get_data()
        files = {f: m for f in data.measured_files() if (m := _module_of(f))}
        for target in self.targets:
            data.set_query_contexts(["^" + re.escape("" if target == STARTUP else target) + "$"])
            new: dict[str, list[list[int]]] = {}
            for path, module in files.items():
                arcs = set(data.arcs(path) or ())
                seen = self.known.setdefault((target, module), set())
                fresh = arcs - seen
                if fresh:
                    seen |= fresh
                    new[module] = sorted([a, b] for a, b in fresh)
            if new:
                self.events.append([now, target, new])
        data.set_query_contexts(None)
        self._write_timeline()

    def _write_timeline(self) -> None:
        tmp = self.out_dir / f"timeline-{self.worker}.tmp"
        tmp.write_text(json.dumps({"worker": self.worker, "events": self.events}))
        tmp.replace(self.out_dir / f"timeline-{self.worker}.json")

    def finish(self) -> None:
        """Last look, stop, save (once)."""
        if self._done:
            return
        self._done = True
        self.snapshot()
        self.cov.stop()
        self.cov.save()


_TRACER: Tracer | None = None


def active_tracer() -> Tracer | None:
    """This worker's tracer (None: the campaign measures no coverage)."""
    return _TRACER


TRACE_ENV = "FUZZ_COVERAGE_TRACE"  # set by the campaign runner: where and since when to trace


def trace_env(stats_dir: str, start: float, slots: int) -> str:
    """The value of :data:`TRACE_ENV` for a campaign whose workers measure
    coverage (``slots``: its worker count; with several, pytest-xdist's
    controller process runs nothing and is left alone)."""
    return json.dumps({"dir": str(Path(stats_dir) / DATA_DIR), "start": start, "slots": slots})


def _start_from_env() -> None:
    """Start the tracer in a campaign worker that asks for coverage
    (:data:`TRACE_ENV`)."""
    global _TRACER
    text = os.environ.get(TRACE_ENV, "")
    if not text:
        return
    asked = json.loads(text)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if asked["slots"] > 1 and worker is None:
        return
    _TRACER = Tracer(Path(asked["dir"]), worker or "main", start=float(asked["start"]))
    atexit.register(_TRACER.finish)


def pytest_unconfigure(config: Any) -> None:  # the plugin's one hook: save before the process ends
    if _TRACER is not None:
        _TRACER.finish()


_start_from_env()


# -- the runner and merge side ---------------------------------------------------------


def combine(sources: Iterable[Path], report_dir: Path) -> Path | None:
    """Combine coverage data files and timelines into ``report_dir``.

    ``sources`` are directories holding data files (``.coverage*``) and
    timelines (``timeline-*.json`` from workers, or ``coverage-timeline.json``
    from an earlier combine); the sources are left as they were. Returns the
    combined data file, or None when no source holds coverage data."""
    import coverage

    data_files: list[str] = []
    events: list[list[Any]] = []
    parts: list[str] = []  # the worker data files behind the result, through every combine
    for src in sources:
        src = Path(src)
        here = [p for p in sorted(src.glob(DATA_FILE + "*")) if p.is_file()]
        data_files += [str(p) for p in here]
        for tl in sorted(src.glob("timeline-*.json")) + sorted(src.glob(TIMELINE)):
            data = json.loads(tl.read_text())
            events += data["events"]
            parts += data.get("parts", [])
        parts += [p.name for p in here if p.name != DATA_FILE]
    if not data_files:
        return None
    report_dir.mkdir(parents=True, exist_ok=True)
    # Combine into a scratch file first: a source may be report_dir itself.
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / DATA_FILE
        cov = coverage.Coverage(data_file=str(scratch), branch=True, config_file=False)
        cov.combine(data_files, strict=True, keep=True)
        cov.save()
        shutil.copyfile(scratch, report_dir / DATA_FILE)
    events.sort(key=lambda e: e[0])
    (report_dir / TIMELINE).write_text(json.dumps({"events": events, "parts": parts}))
    return report_dir / DATA_FILE


# -- the report side ------------------------------------------------------------------


def _regions(source: str) -> list[tuple[str, int, int]]:
    """Every function's (qualified name, first line, last line), innermost last
    for nested ones, plus ``Scheduler.schedule[waiting]``: the loop in
    ``schedule()`` over the waiting queue (a ``while`` statement whose
    condition or body's first lines name ``waiting``)."""
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out.append((name, child.lineno, child.end_lineno or child.lineno))
                if name.endswith("Scheduler.schedule"):
                    loop = _waiting_loop(child)
                    if loop is not None:
                        out.append((name + "[waiting]", loop.lineno, loop.end_lineno or loop.lineno))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def _waiting_loop(func: ast.AST) -> ast.While | None:
    """The outermost ``while`` in ``func`` whose first statements take a request
    from the waiting queue (``self.waiting`` / ``*_waiting`` queues)."""
    for node in ast.walk(func):
        if isinstance(node, ast.While):
            head = ast.unparse(node.test) + " ".join(ast.unparse(s) for s in node.body[:4])
            if "waiting" in head:
                return node
    return None


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("*."):
        return name.count(".") == 1 and name.endswith(pattern[1:])
    return name == pattern


def _arc_list(raw: Iterable[Iterable[int]]) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in raw}


def summarize(report_dir: Path) -> Summary | None:
    """The tables for the combined result in ``report_dir`` (None: no data)."""
    import coverage

    data_file = Path(report_dir) / DATA_FILE
    if not data_file.is_file():
        return None
    cov = coverage.Coverage(data_file=str(data_file), branch=True, config_file=False)
    cov.load()
    measured = {m: f for f in cov.get_data().measured_files() if (m := _module_of(f))}
    root = vllm_root()
    for module in MODULES:  # a module never entered is measured as all-missing
        measured.setdefault(module, str(root / module))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coverage.json"
        cov.json_report(morfs=list(measured.values()), outfile=str(out), ignore_errors=True)
        report = json.loads(out.read_text())["files"]
    files: dict[str, dict[str, int]] = {}
    branch_arcs: dict[str, set[tuple[int, int]]] = {}
    functions: list[dict[str, Any]] = []
    notes: list[str] = []
    for module in MODULES:
        entry = next((v for k, v in report.items() if _module_of(str(Path(k).resolve())) == module
                      or k.replace(os.sep, "/").endswith(module)), None)
        if entry is None:
            notes.append(f"{module}: no source to analyse")
            continue
        s = entry["summary"]
        files[module] = {"lines": s["num_statements"], "lines_covered": s["covered_lines"],
                         "branches": s.get("num_branches", 0), "branches_covered": s.get("covered_branches", 0)}
        executed = _arc_list(entry.get("executed_branches", []))
        missing = _arc_list(entry.get("missing_branches", []))
        branch_arcs[module] = executed | missing
        source_path = measured[module]
        source = Path(source_path).read_text()
        lines = source.splitlines()
        regions = _regions(source)
        for pattern_module, pattern in FUNCTIONS:
            if pattern_module != module:
                continue
            for name, first, last in regions:
                if not _pattern_matches(pattern, name):
                    continue
                # A branch belongs to the innermost function around its source
                # line; the waiting-loop region keeps its own lines.
                inner = [(n, a, b) for n, a, b in regions if a > first and b <= last and n != name
                         and not n.endswith("[waiting]")]

                def mine(arc: tuple[int, int], first: int = first, last: int = last,
                         inner: list[tuple[str, int, int]] = inner) -> bool:
                    return first <= arc[0] <= last and not any(a <= arc[0] <= b for _, a, b in inner)

                got = sorted(a for a in executed if mine(a))
                miss = sorted(a for a in missing if mine(a))
                hit_lines = [n for n in entry["executed_lines"] if mine((n, 0))]
                functions.append({
                    "module": module, "function": name, "lines": [first, last],
                    "statements": len(hit_lines) + len([n for n in entry["missing_lines"] if mine((n, 0))]),
                    "statements_covered": len(hit_lines),
                    "branches": len(got) + len(miss), "covered": len(got),
                    "missing": [{"from": a, "to": b, "source": lines[a - 1].strip() if 0 < a <= len(lines) else "",
                                 "to_source": "exit" if b < 0 else (lines[b - 1].strip() if b <= len(lines) else "")}
                                for a, b in miss],
                })
    growth = _growth(report_dir, branch_arcs, {m: measured[m] for m in branch_arcs})
    version = _version_at(root)
    return Summary(files, functions, growth, version, notes)


def _version_at(root: Path) -> str:
    for meta in root.glob("vllm-*.dist-info/METADATA"):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "?"


def _growth(report_dir: Path, branch_arcs: dict[str, set[tuple[int, int]]],
            sources: dict[str, str]) -> dict[str, list[tuple[float, int]]]:
    """Covered branches against seconds, per target and for all targets together.

    The timeline holds arcs as the tracer saw them; coverage's file reporter
    (its plugin API) translates them as its reports do (a statement spanning
    several lines counts at its first line)."""
    import coverage
    from coverage.python import PythonFileReporter

    path = Path(report_dir) / TIMELINE
    if not path.is_file():
        return {}
    cov = coverage.Coverage(config_file=False)
    reporters = {m: PythonFileReporter(p, coverage=cov) for m, p in sources.items()}
    events = json.loads(path.read_text())["events"]
    seen: dict[str, set[tuple[str, int, int]]] = {}
    growth: dict[str, list[tuple[float, int]]] = {}
    for t, target, new in sorted(events, key=lambda e: e[0]):
        for who in (target, "all"):
            got = seen.setdefault(who, set())
            before = len(got)
            for module, arcs in new.items():
                if module not in reporters:
                    continue
                valid = branch_arcs[module]
                translated = reporters[module].translate_arcs({(a, b) for a, b in arcs})
                got |= {(module, a, b) for a, b in translated if (a, b) in valid}
            if len(got) != before or who not in growth:
                growth.setdefault(who, []).append((float(t), len(got)))
    return growth


def report_section(report_dir: Path) -> tuple[list[str], str] | None:
    """Summarize the combined result in ``report_dir``, write
    ``coverage-summary.json`` there and return the report's section
    (Markdown lines, HTML); None when there is no coverage data."""
    summary = summarize(report_dir)
    if summary is None:
        return None
    (Path(report_dir) / "coverage-summary.json").write_text(json.dumps(summary.to_json(), indent=1))
    md = markdown(summary)
    body = "\n".join(md[1:])
    page = (f"<h2>{html.escape(md[0].lstrip('# '))}</h2>" + svg_growth(summary.growth)
            + "<pre>" + html.escape(body) + "</pre>")
    return md, page


def fuzzing_rate(record_path: Path, targets: Iterable[str]) -> tuple[int, float, bool] | None:
    """(examples, fuzzing seconds, traced) of the campaign recorded at
    ``record_path`` when it ran exactly ``targets``; None otherwise."""
    try:
        data = json.loads(Path(record_path).read_text())
    except (OSError, ValueError):
        return None
    if sorted(data.get("config", {}).get("targets", [])) != sorted(targets):
        return None
    total = data.get("total", {})
    return (sum(total.get("examples", {}).values()), sum(total.get("seconds", {}).values()),
            bool(data["config"].get("coverage")))


def measure_overhead(targets: list[str], *, seconds: float = 4.0, repeats: int = 3) -> list[str]:
    """Examples per second of each target with the tracer on and off, in one
    process, alternating runs of ``seconds`` with the same seeds (so both see
    the same machine load); medians of ``repeats``. Returns table lines."""
    import statistics

    import coverage

    from fuzz import adapter
    from fuzz.hunting import budget_settings, property_test
    from fuzz.registry import get_target
    from hypothesis import Phase, Verbosity

    class _Stop(BaseException):
        pass

    adapter.init_hashing()
    root = vllm_root()
    cov = coverage.Coverage(data_file=None, branch=True, include=[str(root / m) for m in MODULES],
                            config_file=False)

    def rate(name: str, seed: int, secs: float, traced: bool) -> float:
        strategy, check, machine = get_target(name).load()
        count, stop_at = 0, time.monotonic() + secs

        def wrap(inner: Any) -> Any:
            def counted(*args: Any, **kwargs: Any) -> None:
                nonlocal count
                count += 1
                try:
                    inner(*args, **kwargs)
                except Exception:  # noqa: BLE001 - a known bug's failure: still an example
                    pass
                if time.monotonic() > stop_at:
                    raise _Stop

            return counted

        settings = budget_settings(max_examples=10**9, phases=[Phase.generate, Phase.target],
                                   verbosity=Verbosity.quiet)
        test = property_test(settings=settings, strategy=strategy, body=check, machine=machine, seed=seed, wrap=wrap)
        t0 = time.monotonic()
        if traced:
            cov.start()
        try:
            test()
        except _Stop:
            pass
        finally:
            if traced:
                cov.stop()
        return count / (time.monotonic() - t0)

    out = ["| target | untraced examples/s | traced examples/s | overhead |", "|---|---:|---:|---:|"]
    for name in targets:
        rate(name, 10**6, 1.0, False)  # warm-up: the target's module, its first vLLM configuration
        runs: dict[bool, list[float]] = {False: [], True: []}
        for r in range(repeats):
            for traced in ((False, True) if r % 2 == 0 else (True, False)):
                runs[traced].append(rate(name, r, seconds, traced))
        plain, traced_rate = statistics.median(runs[False]), statistics.median(runs[True])
        out.append(f"| {name} | {plain:.1f} | {traced_rate:.1f} | {100 * (1 - traced_rate / plain):.0f}% |")
        print(out[-1], flush=True)
    return out


if __name__ == "__main__":  # python -m fuzz.coverage compare OURS THEIRS | overhead [TARGET ...]
    import sys

    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        summaries = [json.loads((Path(d) / "coverage-summary.json").read_text()) for d in sys.argv[2:]]
        print("\n".join(compare(*summaries)))
    elif len(sys.argv) >= 2 and sys.argv[1] == "overhead":
        from fuzz.registry import default_targets

        names = sys.argv[2:] or [t.name for t in default_targets()]
        print("\n".join(measure_overhead(names)))
    else:
        print("usage: python -m fuzz.coverage compare CAMPAIGN_REPORT_DIR VLLM_TESTS_DIR\n"
              "       python -m fuzz.coverage overhead [TARGET ...]", file=sys.stderr)
        sys.exit(2)
