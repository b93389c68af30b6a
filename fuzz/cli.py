"""``python -m fuzz``: run fuzz campaigns, list targets, replay repros, merge
sharded reports, run the targets on every supported vLLM release.

Exit codes, for every subcommand: 0 no violation, 1 violations found (or a
replayed repro still fails), 2 usage or harness error (one line), 3 only
missed hits found (lookups that served less than the index held: a
performance bug, never a corruption; ``run`` and ``merge``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from fuzz.args import EXIT_ERROR, EXIT_MISSED_HIT, EXIT_OK, EXIT_VIOLATION, OneLineParser, UsageError

__all__ = ["EXIT_ERROR", "EXIT_MISSED_HIT", "EXIT_OK", "EXIT_VIOLATION", "UsageError", "main", "matrix_exit_code", "parse_duration"]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BUDGET = "60s"


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h``, ``1m30s`` -> seconds."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or parts is None or not any(parts.groups()):
        raise UsageError(f"--budget {text!r}: expected a duration like 90s, 10m or 1h")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    seconds = h * 3600 + m * 60 + s
    if seconds <= 0:
        raise UsageError(f"--budget {text!r}: must be positive")
    return seconds


def _workers(text: str) -> int:
    if text == "auto":
        return max(1, os.cpu_count() or 1)
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--workers {text!r}: expected a positive integer or 'auto'")
    return int(text)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _target_names(requested: list[str], *, default: list[str]) -> list[str]:
    from fuzz.registry import TARGETS

    unknown = [n for n in requested if n not in TARGETS]
    if unknown:
        raise UsageError(f"--target {unknown[0]}: unknown target; known: {', '.join(TARGETS)}")
    return list(dict.fromkeys(requested)) or default


def _vllm_env(path: str | None) -> dict[str, str]:
    """The environment of a subprocess that imports vLLM: a source checkout
    first on the import path (``--vllm-src``), and vLLM's caches kept per
    vLLM install unless the user chose them (:func:`fuzz.matrix.envs.cache_env`)."""
    from fuzz.matrix.envs import cache_env

    env = dict(os.environ)
    src = None
    if path is not None:
        src = Path(path).expanduser().resolve()
        if not (src / "vllm" / "__init__.py").is_file():
            raise UsageError(f"--vllm-src {path}: no vllm/__init__.py there (expected a vLLM source checkout root)")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), str(ROOT), env.get("PYTHONPATH", "")]))
    for name, value in cache_env(src).items():
        env.setdefault(name, value)
    return env


def _build_parser() -> argparse.ArgumentParser:
    from fuzz.matrix import REFERENCE_RELEASES, SUPPORTED_RELEASES
    from fuzz.matrix.envs import DEFAULT_ROOT

    p = OneLineParser(prog="python -m fuzz", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", metavar="{run,list,replay,merge,matrix,bugbench}")
    run = sub.add_parser("run", help="fuzz the targets for a wall-clock budget")
    run.add_argument("--budget", default=DEFAULT_BUDGET, help="fuzzing time, e.g. 90s, 10m; start-up (~10 s) comes on top (default %(default)s)")
    run.add_argument("--workers", default="1", help="worker processes: N or auto (pytest-xdist)")
    run.add_argument("--profile", default="fuzz", help="Hypothesis settings profile (default %(default)s)")
    run.add_argument("--seed", type=int, default=None, help="fix the seed sequence (same seeds, same examples)")
    run.add_argument("--target", action="append", default=[], help="target name (repeatable; default: the default targets)")
    run.add_argument("--db", action="append", default=None, metavar="SPEC",
                     help="example database shared by workers and runners: a directory (default .hypothesis/fuzz-db), "
                          "redis://HOST:PORT/N, readonly:SPEC or github:OWNER/REPO[/ARTIFACT]; repeat to combine "
                          "(see docs/scaling.md)")
    run.add_argument("--shard", default=None, metavar="K/N", help="run only runner K's share of N (targets and seeds)")
    run.add_argument("--reuse-only", action="store_true",
                     help="generate nothing: replay the database's examples, and what others save (reproduce what they found)")
    run.add_argument("--junit", default=None, help="write JUnit XML here")
    run.add_argument("--repro-dir", default=str(ROOT / "fuzz-out" / "repros"), help="where minimal repros go")
    run.add_argument("--report-dir", default=str(ROOT / "fuzz-out" / "report"), help="where report.md and report.html go")
    run.add_argument("--vllm-src", default=None, help="a vLLM source checkout to fuzz instead of the installed vLLM")
    run.add_argument("--plant", default=None, help="plant a known truncation or scheduler bug (self-tests and benchmarks)")
    run.add_argument("--coverage", action="store_true",
                     help="measure line and branch coverage of vLLM's KV-cache and scheduler code (coverage.py; "
                          "see fuzz/coverage/__init__.py and docs/coverage.md)")
    sub.add_parser("list", help="list the targets")
    replay = sub.add_parser("replay", help="rerun a saved finding and say whether it still fails")
    replay.add_argument("file", help="a finding's .json sidecar or repro .py file written by `run`: the operation log "
                                     "its sidecar keeps is replayed under every claim; without one, the .py runs")
    replay.add_argument("--vllm-src", default=None, help="replay against a vLLM source checkout")
    merge = sub.add_parser("merge", help="merge the reports of a sharded campaign's runners into one")
    merge.add_argument("campaigns", nargs="+", help="campaign.json files (or the report dirs holding them)")
    merge.add_argument("--report-dir", default=str(ROOT / "fuzz-out" / "report"), help="where the merged report goes")
    merge.add_argument("--repro-dir", default=str(ROOT / "fuzz-out" / "repros"), help="where the shards' repros were gathered")
    sub.add_parser("bugbench", help="time to find each known (--planted: each planted) vLLM bug over repeated trials",
                   add_help=False)
    matrix = sub.add_parser("matrix", help="run the targets on every supported vLLM release",
                            description="Run the targets on every supported vLLM release (see fuzz/matrix/).")
    matrix.add_argument("releases", nargs="*", metavar="RELEASE",
                        help="a version (0.30.0) or src:/path/to/vllm-checkout; default: " + " ".join(SUPPORTED_RELEASES))
    matrix.add_argument("--vllm-src", action="append", default=[], metavar="PATH",
                        help="also run on this vLLM source checkout (root first on PYTHONPATH, no install)")
    matrix.add_argument("--reference", action="store_true",
                        help="also run the pre-fix reference release(s) " + ", ".join(REFERENCE_RELEASES)
                        + " (violations expected, never change the exit code)")
    matrix.add_argument("--target", action="append", default=[], help="target name (repeatable); default: every target")
    matrix.add_argument("--examples", type=_positive_int, default=100,
                        help="examples per target (FUZZ_CI_EXAMPLES, ci profile; default %(default)s)")
    matrix.add_argument("--timeout", type=_positive_float, default=900.0,
                        help="seconds before one (release, target) run is killed (default %(default)s)")
    matrix.add_argument("--generated-only", action="store_true",
                        help="skip pinned @example()s, so a violation shows what generation alone finds")
    matrix.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="release install cache (default .cache/vllm-envs)")
    matrix.add_argument("--out", type=Path, default=ROOT / "fuzz-out" / "matrix",
                        help="per-run logs, JUnit XML and statistics (default fuzz-out/matrix)")
    matrix.add_argument("--json", type=Path, default=None, help="also write the cells as JSON here")
    matrix.add_argument("--list", action="store_true", help="print the releases and targets, run nothing")
    return p


def _cmd_list() -> int:
    from fuzz.registry import TARGETS

    width = max(len(n) for n in TARGETS)
    for t in TARGETS.values():
        flag = "*" if t.default else " "
        print(f"{flag} {t.name:<{width}}  {t.summary}")
    print("(* = run by default)")
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    # Start-up counts from here: the runner's own set-up is part of it.
    start = time.time()
    from fuzz.campaign import CampaignConfig, CampaignRecord, databases, parse_shard, run_campaign, shard_items
    from fuzz.campaign.report import schedule_table, startup_line, summary_table, write_reports
    from fuzz.registry import default_targets

    budget = parse_duration(args.budget)
    workers = _workers(args.workers)
    if args.coverage and args.plant:
        raise UsageError("--coverage measures unmodified vLLM: drop --plant (planted edits are compiled under vLLM's filenames)")
    names = _target_names(args.target, default=[t.name for t in default_targets()])
    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    items = shard_items(names, shard, workers)
    names = list(dict.fromkeys(t for t, _ in items))
    dbs = args.db or [str(ROOT / ".hypothesis" / "fuzz-db")]
    try:  # reach the database once here: a bad spec or a dead server is one line
        databases.open_database(dbs)
    except databases.DatabaseError as exc:
        raise UsageError(str(exc)) from None
    env = _vllm_env(args.vllm_src)
    repro_dir = Path(args.repro_dir)
    report_dir = Path(args.report_dir)
    for d in (repro_dir, report_dir):
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create {d}: {exc.strerror}") from None
    config = CampaignConfig(
        targets=tuple(names),
        items=tuple(items),
        slots=workers,
        budget=budget,
        start=start,
        repro_dir=str(repro_dir),
        stats_dir=tempfile.mkdtemp(prefix="fuzz-stats-"),
        db=tuple(dbs),
        seed=args.seed,
        shard=None if shard is None else str(shard),
        reuse_only=args.reuse_only,
        plant=args.plant,
        coverage=args.coverage,
    )
    print(f"fuzz run: targets {', '.join(names)}; budget {budget:.0f}s; workers {workers}; "
          f"seed {args.seed}; db {', '.join(map(databases.describe, dbs))}"
          + (f"; shard {shard}" if shard else ""), flush=True)
    result = run_campaign(config, workers=workers, profile=args.profile, env=env,
                          junit=Path(args.junit) if args.junit else None,
                          preflight=(lambda: _unknown_plant(args.plant)) if args.plant else None)
    if result.refused:
        raise UsageError(result.refused)
    total = result.totals
    print(summary_table(total, result.elapsed))
    print(schedule_table(total))
    print(startup_line(total))
    sections = _coverage_sections(config, total, [Path(config.stats_dir) / "coverage"], report_dir)
    paths = write_reports(total, report_dir, repro_dir=repro_dir, elapsed=result.elapsed, config=config,
                          sections=sections)
    print(f"report: {paths[0]} and {paths[1]}")
    shutil.copy(result.log, report_dir / "pytest.log")
    CampaignRecord(config, total, result.elapsed).write(report_dir)
    for name, why in sorted(total.unsupported.items()):
        print(f"target {name}: unsupported, skipped: {why}")
    if result.harness_errors:
        kept = f"; {len(total.failures)} violation(s) or missed hit(s) found before it, repros kept in {repro_dir}"
        print(f"python -m fuzz: harness error: {result.harness_errors[0]}{kept if total.failures else ''}",
              file=sys.stderr)
        return EXIT_ERROR
    if names and set(names) <= set(total.unsupported):
        print(f"python -m fuzz: harness error: vLLM {total.vllm_version} can host none of the targets "
              f"({', '.join(names)})", file=sys.stderr)
        return EXIT_ERROR
    set_aside = total.telemetry.get("known_bugs", {})
    if set_aside:
        met = ", ".join(f"{bug_id} ({n} step(s))" for bug_id, n in sorted(set_aside.items()))
        print(f"known vLLM bugs met and set aside ({len(set_aside)}, fuzz/known_bugs.py): {met}")
    else:
        print("known vLLM bugs met and set aside: none")
    known = [f for f in total.failures if f.get("known_bug")]
    if known:
        ids = sorted({f["known_bug"] for f in known})
        print(f"{len(known)} violation(s) are known vLLM bugs of {total.vllm_version} "
              f"(fuzz/known_bugs.py): {', '.join(ids)}; repros in {repro_dir}")
    if total.missed_hits:
        print(f"{len(total.missed_hits)} distinct missed hit(s) (performance, not corruption); repros in {repro_dir}")
    if total.new_failures:
        print(f"{len(total.new_failures)} distinct violation(s); repros in {repro_dir}")
        return EXIT_VIOLATION
    if total.missed_hits:
        return EXIT_MISSED_HIT
    if result.pytest_rc not in (0, 5):
        from fuzz.outcomes import HARNESS_MARK

        misfit = [ln[ln.index(HARNESS_MARK) :] for ln in result.log.read_text().splitlines() if HARNESS_MARK in ln]
        if misfit:  # the adapter could not be imported against this vLLM
            print(f"python -m fuzz: {misfit[0][len('kvtrunc-fuzz '):]}", file=sys.stderr)
            return EXIT_ERROR
        print(f"harness error (pytest exit {result.pytest_rc}); log: {report_dir / 'pytest.log'}")
        print(result.log.read_text()[-3000:])
        return EXIT_ERROR
    return EXIT_OK


def _coverage_sections(config, total, sources: list[Path], report_dir: Path, *,  # type: ignore[no-untyped-def]
                       overhead: bool = True) -> tuple:
    """Combine the coverage data of ``sources`` into ``report_dir``, print the
    per-file lines and the overhead, and return the report's section."""
    from fuzz import coverage

    if not config.coverage:
        return ()
    previous = coverage.fuzzing_rate(report_dir / "campaign.json", config.targets)
    if coverage.combine(sources, report_dir) is None:
        print("coverage: no worker saved coverage data")
        return ()
    section = coverage.report_section(report_dir)
    if section is None:
        return ()
    md, _ = section
    print("\n".join(md[: md.index("### Branches per function")]).rstrip())
    if overhead:
        untraced = None if previous is None or previous[2] else previous[:2]
        print(coverage.overhead_line((total.example_count, sum(total.seconds.values())), untraced))
    print(f"coverage: {report_dir / coverage.DATA_FILE}, {report_dir / 'coverage-summary.json'}")
    return (section,)


def _unknown_plant(name: str) -> str | None:
    """Why ``--plant name`` is refused (None: it is a planted truncation or
    scheduler bug). Imports vLLM, so the runner asks while its workers start."""
    from fuzz.adapter import PLANTED_SCHEDULER_BUGS, PLANTED_TRUNCATE_BUGS

    known = {**PLANTED_TRUNCATE_BUGS, **PLANTED_SCHEDULER_BUGS}
    if name in known:
        return None
    return f"--plant {name}: unknown; known: {', '.join(known)}"


def _cmd_merge(args: argparse.Namespace) -> int:
    from fuzz.campaign import merge_campaigns
    from fuzz.campaign.report import summary_table, write_reports

    paths = [Path(c) / "campaign.json" if Path(c).is_dir() else Path(c) for c in args.campaigns]
    try:
        record = merge_campaigns(paths)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(summary_table(record.totals, record.elapsed))
    report_dir = Path(args.report_dir)
    sections = _coverage_sections(record.config, record.totals, [p.parent for p in paths], report_dir, overhead=False)
    md, html = write_reports(record.totals, report_dir, repro_dir=Path(args.repro_dir), elapsed=record.elapsed,
                             config=record.config, sections=sections)
    record.write(report_dir)
    print(f"merged {len(paths)} shard(s) (shards {record.config.shard}); report: {md} and {html}")
    if record.totals.violations:
        return EXIT_VIOLATION
    return EXIT_MISSED_HIT if record.totals.missed_hits else EXIT_OK


_REPRO_EXPECTED = "expected a repro .py file written by `run`, or its .json sidecar"


def _repro_path(arg: str) -> Path:
    """The repro file ``arg`` names (itself, or through its sidecar's
    ``repro`` field); every bad input is one :class:`UsageError`."""
    path = Path(arg)
    if not path.is_file():
        raise UsageError(f"{arg}: no such file ({_REPRO_EXPECTED})")
    if path.suffix == ".json":
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"{arg}: not JSON ({type(exc).__name__}); {_REPRO_EXPECTED}") from None
        name = meta.get("repro") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name.endswith(".py") or Path(name).name != name:
            raise UsageError(f"{arg}: a JSON file without a finding's 'repro' field naming its .py file; "
                             f"{_REPRO_EXPECTED}")
        path = path.with_name(name)
        if not path.is_file():
            raise UsageError(f"{arg}: its repro {name} is not next to it ({_REPRO_EXPECTED})")
    if path.suffix != ".py":
        raise UsageError(f"{arg}: not a .py file ({_REPRO_EXPECTED})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{arg}: not a Python text file ({_REPRO_EXPECTED})") from None
    if "\ndef test_" not in f"\n{text}":
        raise UsageError(f"{arg}: no test function in it ({_REPRO_EXPECTED})")
    return path


def _sidecar_log(arg: str) -> tuple[dict, object] | None:
    """The sidecar of ``arg`` (itself, or the one beside a repro .py that
    names it) and the operation log it keeps (fuzz.model.OpLog); None where
    there is none (then the .py runs as before)."""
    from fuzz.model import decode_oplog

    path = Path(arg)
    if not path.is_file():
        return None
    # A .py names no sidecar: the one beside it whose "repro" is the file's name.
    candidates = {".json": [path], ".py": sorted(path.parent.glob("*.json"))}.get(path.suffix, [])
    for candidate in candidates:
        try:
            meta = json.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if not isinstance(meta, dict) or not meta.get("oplog"):
            continue
        if candidate != path and meta.get("repro") != path.name:
            continue
        try:
            return meta, decode_oplog(meta["oplog"])
        except ValueError as exc:
            raise UsageError(f"{arg}: its sidecar's oplog cannot be read: {exc}") from None
    return None


def _replay_log(name: str, meta: dict, log) -> int:  # type: ignore[no-untyped-def]
    """Replay a sidecar's operation log through the harness with every
    check on, known vLLM bugs set aside as in a campaign."""
    from fuzz.campaign.findings import crash_state
    from fuzz.repro.shrink import first_violation
    from fuzz.runners.scheduler import ALL_CHECKS

    size = log.size()
    what = f"its operation log ({size['requests']} request(s), {size['steps']} step(s)) under every claim"
    try:
        violation = first_violation(log, ALL_CHECKS)
    except Exception as exc:  # noqa: BLE001 - the harness or this vLLM cannot run the log: one line
        print(f"{name}: could not replay {what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return EXIT_ERROR
    if violation is None:
        known = f"; known vLLM bug {meta['known_bug']} is set aside" if meta.get("known_bug") else ""
        print(f"{name}: PASSES now (replayed {what}: the bug is fixed, or this vLLM never had it{known})")
        return EXIT_OK
    recorded = meta.get("invariant")
    other = f" (the sidecar recorded {recorded})" if recorded and recorded != violation.invariant else ""
    print(f"{name}: STILL FAILS (replayed {what})\n"
          f"  claim: {violation.invariant}{other}\n"
          f"  state: {crash_state(violation)}" + (f" ({violation.state})" if violation.state else "") + "\n"
          f"  {str(violation).splitlines()[0][:400]}")
    return EXIT_VIOLATION


def _cmd_replay(args: argparse.Namespace) -> int:
    found = _sidecar_log(args.file)
    if found is not None:
        if args.vllm_src is not None:  # the checkout must come first on the import path: a fresh process
            proc = subprocess.run([sys.executable, "-m", "fuzz", "replay", args.file], env=_vllm_env(args.vllm_src),
                                  cwd=ROOT, capture_output=True, text=True)
            print(proc.stdout, end="")
            if proc.returncode not in (EXIT_OK, EXIT_VIOLATION):
                print(proc.stderr[-2000:], end="", file=sys.stderr)
            return proc.returncode
        return _replay_log(Path(args.file).name, *found)
    path = _repro_path(args.file)
    env = _vllm_env(args.vllm_src)
    cmd = [sys.executable, "-m", "pytest", str(path.resolve()), "-q", "-p", "no:cacheprovider",
           "--rootdir", str(path.resolve().parent), "-c", os.devnull]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=path.resolve().parent)
    tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
    if proc.returncode == 0:
        print(f"{path.name}: PASSES now (the bug is fixed, or this vLLM never had it)")
        return EXIT_OK
    if proc.returncode == 1:
        print(f"{path.name}: STILL FAILS\n{tail}")
        return EXIT_VIOLATION
    print(f"{path.name}: could not run (pytest exit {proc.returncode})\n{tail}\n{proc.stderr[-2000:]}")
    return EXIT_ERROR


def _cmd_matrix(args: argparse.Namespace) -> int:
    from fuzz import matrix
    from fuzz.registry import TARGETS

    try:
        releases = matrix.releases(args.releases, reference=args.reference, sources=args.vllm_src)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    targets = [TARGETS[n] for n in _target_names(args.target, default=list(TARGETS))]
    if args.json is not None and not args.json.resolve().parent.is_dir():
        raise UsageError(f"--json {args.json}: directory {args.json.resolve().parent} does not exist")
    if args.list:
        for r in releases:
            print(f"release {r.label}: {r.kind}" + (f" {r.path}" if r.path else ""))
        for t in targets:
            print(f"target  {t.name}  ({t.nodeid})")
        return EXIT_OK
    skip_phases = "target,explain" + (",explicit" if args.generated_only else "")
    cells = matrix.run_matrix(releases, targets, examples=args.examples, timeout=args.timeout,
                              out_dir=args.out, root=args.root, skip_phases=skip_phases)
    print(matrix.format_table(cells))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1) + "\n", encoding="utf-8")
    code = matrix_exit_code(cells)
    print(f"\nexit {code}: " + {EXIT_OK: "no violation outside reference rows and known, fixed vLLM bugs",
                                EXIT_VIOLATION: "new violations on a supported release or checkout",
                                EXIT_ERROR: "harness errors: the table is incomplete"}[code])
    return code


def matrix_exit_code(cells: list) -> int:
    """2 on any harness error (the table is incomplete), else 1 on a violation
    that is neither on a reference row nor a known bug of its release, else 0."""
    from fuzz import matrix

    if matrix.incomplete(cells):
        return EXIT_ERROR
    return EXIT_VIOLATION if matrix.new_violations(cells) else EXIT_OK


_COMMANDS = {"list": lambda args: _cmd_list(), "replay": _cmd_replay, "merge": _cmd_merge, "matrix": _cmd_matrix,
             "run": _cmd_run}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv) or ["run"]
    if argv[0] == "bugbench":  # its own options: fuzz/bugbench.py (planted bugs: fuzz/plantbench.py)
        if "--planted" in argv or "--compare" in argv:
            from fuzz import plantbench

            return plantbench.main(argv[1:])
        from fuzz import bugbench

        return bugbench.main(argv[1:])
    try:
        args = _build_parser().parse_args(argv)
        return _COMMANDS[args.command or "run"](args)
    except SystemExit as exc:  # --help
        return EXIT_OK if exc.code in (0, None) else EXIT_ERROR
    except UsageError as exc:
        command = f" {argv[0]}" if argv[0] in _COMMANDS else ""
        print(f"python -m fuzz{command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
