"""``python -m fuzz``: run fuzz campaigns, list targets, replay repros.

Exit codes: 0 no violation, 1 violations found (or a replayed repro still
fails), 2 usage or harness error.
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
from pathlib import Path

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
EXIT_OK, EXIT_VIOLATION, EXIT_ERROR = 0, 1, 2
DEFAULT_BUDGET = "60s"


class UsageError(Exception):
    """One clear line for the user; exit code 2."""


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


def _vllm_src_env(path: str | None, env: dict[str, str]) -> dict[str, str]:
    if path is None:
        return env
    src = Path(path).expanduser().resolve()
    if not (src / "vllm" / "__init__.py").is_file():
        raise UsageError(f"--vllm-src {path}: no vllm/__init__.py there (expected a vLLM source checkout root)")
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", metavar="{run,list,replay,merge,matrix}")
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
                     help="generate nothing: replay the database's examples each round (reproduce what others found)")
    run.add_argument("--junit", default=None, help="write JUnit XML here")
    run.add_argument("--repro-dir", default=str(ROOT / "fuzz-out" / "repros"), help="where minimal repros go")
    run.add_argument("--report-dir", default=str(ROOT / "fuzz-out" / "report"), help="where report.md and report.html go")
    run.add_argument("--vllm-src", default=None, help="a vLLM source checkout to fuzz instead of the installed vLLM")
    run.add_argument("--plant", default=None, help="plant a known truncation bug (self-test and benchmarks)")
    run.add_argument("--round-examples", type=int, default=100, help=argparse.SUPPRESS)
    sub.add_parser("list", help="list the targets")
    replay = sub.add_parser("replay", help="rerun a saved repro and say whether it still fails")
    replay.add_argument("file", help="a repro .py file written by `run` (its .json sidecar is used when present)")
    replay.add_argument("--vllm-src", default=None, help="replay against a vLLM source checkout")
    merge = sub.add_parser("merge", help="merge the reports of a sharded campaign's runners into one")
    merge.add_argument("campaigns", nargs="+", help="campaign.json files (or the report dirs holding them)")
    merge.add_argument("--report-dir", default=str(ROOT / "fuzz-out" / "report"), help="where the merged report goes")
    merge.add_argument("--repro-dir", default=str(ROOT / "fuzz-out" / "repros"), help="where the shards' repros were gathered")
    sub.add_parser("matrix", help="run the targets on every supported vLLM release (see fuzz/matrix.py)", add_help=False)
    return p


def _cmd_list() -> int:
    from fuzz.registry import TARGETS

    width = max(len(n) for n in TARGETS)
    for t in TARGETS.values():
        flag = "*" if t.default else " "
        print(f"{flag} {t.name:<{width}}  {t.summary}")
    print("(* = run by default)")
    return EXIT_OK


def _aggregate(stats_dir: Path) -> dict:
    total: dict = {"examples": {}, "seconds": {}, "failures": [], "telemetry": {}, "vllm_version": "?"}
    for f in stats_dir.glob("*.json"):
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        total["vllm_version"] = data.get("vllm_version", "?")
        for k, v in data["examples"].items():
            total["examples"][k] = total["examples"].get(k, 0) + v
        for k, v in data["seconds"].items():
            total["seconds"][k] = total["seconds"].get(k, 0.0) + v
        total["failures"].extend(data["failures"])
        for name, counter in data["telemetry"].items():
            agg = total["telemetry"].setdefault(name, {})
            for label, n in counter.items():
                agg[label] = agg.get(label, 0) + n
    return total


def _progress_line(total: dict, elapsed: float, budget: float) -> str:
    n = sum(total["examples"].values())
    branches = len(total["telemetry"].get("branches", {}))
    distinct = len({f["key"] for f in total["failures"]})
    return (
        f"[{elapsed:6.1f}s, budget {budget:.0f}s] examples {n:>7}  {n / max(elapsed, 1e-9):7.1f}/s  "
        f"failures {distinct}  branches {branches}"
    )


def _cmd_run(args: argparse.Namespace) -> int:
    from fuzz import databases, sharding
    from fuzz.registry import TARGETS, default_targets

    budget = parse_duration(args.budget)
    workers = _workers(args.workers)
    names = args.target or [t.name for t in default_targets()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise UsageError(f"--target {unknown[0]}: unknown target; known: {', '.join(TARGETS)}")
    try:
        shard = sharding.parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    items = sharding.shard_items(names, shard, workers)
    names = list(dict.fromkeys(t for t, _ in items))
    dbs = args.db or [str(ROOT / ".hypothesis" / "fuzz-db")]
    try:  # reach the database once here: a bad spec or a dead server is one line
        databases.open_database(dbs)
    except databases.DatabaseError as exc:
        raise UsageError(str(exc)) from None
    if args.plant:
        from fuzz.adapter import PLANTED_TRUNCATE_BUGS

        if args.plant not in PLANTED_TRUNCATE_BUGS:
            raise UsageError(f"--plant {args.plant}: unknown; known: {', '.join(PLANTED_TRUNCATE_BUGS)}")
    env = _vllm_src_env(args.vllm_src, dict(os.environ))
    repro_dir = Path(args.repro_dir)
    report_dir = Path(args.report_dir)
    for d in (repro_dir, report_dir):
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create {d}: {exc.strerror}") from None
    stats_dir = Path(tempfile.mkdtemp(prefix="fuzz-stats-"))
    start = time.time()
    config = {
        "targets": names,
        "slots": workers,
        "budget": budget,
        "start": start,
        "seed": args.seed,
        "db": dbs,
        "items": items,
        "shard": None if shard is None else str(shard),
        "reuse_only": args.reuse_only,
        "repro_dir": str(repro_dir),
        "stats_dir": str(stats_dir),
        "plant": args.plant,
        "round_examples": args.round_examples,
    }
    env.update(FUZZ_CAMPAIGN=json.dumps(config), HYPOTHESIS_PROFILE=args.profile, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "fuzz" / "campaign.py"), "-q", "-p", "no:cacheprovider",
           "--rootdir", str(ROOT), "-o", "addopts=", "-W", "ignore::DeprecationWarning"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "load"]
    else:
        cmd += ["-p", "no:xdist"]
    if args.junit:
        cmd += ["--junitxml", str(Path(args.junit).resolve())]
    tty = sys.stdout.isatty()
    print(f"fuzz run: targets {', '.join(names)}; budget {budget:.0f}s; workers {workers}; "
          f"seed {args.seed}; db {', '.join(map(databases.describe, dbs))}"
          + (f"; shard {shard}" if shard else ""), flush=True)
    log = stats_dir / "pytest.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        last_plain = 0.0
        while proc.poll() is None:
            time.sleep(0.5)
            if _harness_errors(stats_dir):
                _stop(proc)  # e.g. the shared database is gone: no point fuzzing on
                break
            elapsed = time.time() - start
            if tty:
                print("\r" + _progress_line(_aggregate(stats_dir), elapsed, budget), end="", flush=True)
            elif elapsed - last_plain >= 10:
                last_plain = elapsed
                print(_progress_line(_aggregate(stats_dir), elapsed, budget), flush=True)
    elapsed = time.time() - start
    total = _aggregate(stats_dir)
    if tty:
        print()
    print(_progress_line(total, elapsed, budget))
    rc = proc.returncode
    from fuzz.report import summary_table, write_reports

    print(summary_table(total, elapsed))
    paths = write_reports(total, report_dir, repro_dir=repro_dir, elapsed=elapsed, config=config)
    print(f"report: {paths[0]} and {paths[1]}")
    shutil.copy(log, report_dir / "pytest.log")
    (report_dir / "campaign.json").write_text(json.dumps({"total": total, "config": config, "elapsed": elapsed}))
    harness_errors = _harness_errors(stats_dir)
    if harness_errors:
        kept = f"; {len({f['key'] for f in total['failures']})} violation(s) found before it, repros kept in {repro_dir}"
        print(f"python -m fuzz: harness error: {harness_errors[0]}{kept if total['failures'] else ''}",
              file=sys.stderr)
        return EXIT_ERROR
    if total["failures"]:
        print(f"{len({f['key'] for f in total['failures']})} distinct violation(s); repros in {repro_dir}")
        return EXIT_VIOLATION
    if rc not in (0, 5):
        print(f"harness error (pytest exit {rc}); log: {report_dir / 'pytest.log'}")
        print(log.read_text()[-3000:])
        return EXIT_ERROR
    return EXIT_OK


def _harness_errors(stats_dir: Path) -> list[str]:
    """One line each, written by campaign workers that could not go on (e.g. database lost)."""
    return [f.read_text().strip() for f in sorted(stats_dir.glob("harness-error-*.txt"))]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _cmd_merge(args: argparse.Namespace) -> int:
    from fuzz.report import summary_table, write_reports
    from fuzz.sharding import merge_campaigns

    paths = [Path(c) / "campaign.json" if Path(c).is_dir() else Path(c) for c in args.campaigns]
    try:
        total, config, elapsed = merge_campaigns(paths)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(summary_table(total, elapsed))
    report_dir = Path(args.report_dir)
    md, html = write_reports(total, report_dir, repro_dir=Path(args.repro_dir), elapsed=elapsed, config=config)
    (report_dir / "campaign.json").write_text(json.dumps({"total": total, "config": config, "elapsed": elapsed}))
    print(f"merged {len(paths)} shard(s) (shards {config['shard']}); report: {md} and {html}")
    return EXIT_VIOLATION if total["failures"] else EXIT_OK


def _cmd_replay(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if path.suffix == ".json":
        meta = json.loads(path.read_text())
        path = path.with_name(meta.get("repro") or "")
    if not path.is_file() or path.suffix != ".py":
        raise UsageError(f"replay {args.file}: not a repro .py file (or its .json sidecar)")
    env = _vllm_src_env(args.vllm_src, dict(os.environ))
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "matrix":
        from fuzz import matrix

        return matrix.main(argv[1:])
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed one line of usage error
        return EXIT_OK if exc.code == 0 else EXIT_ERROR
    try:
        if args.command == "list":
            return _cmd_list()
        if args.command == "replay":
            return _cmd_replay(args)
        if args.command == "merge":
            return _cmd_merge(args)
        if args.command in (None, "run"):
            if args.command is None:
                args = parser.parse_args(["run"])
            return _cmd_run(args)
    except UsageError as exc:
        print(f"python -m fuzz: {exc}", file=sys.stderr)
        return EXIT_ERROR
    parser.print_usage(sys.stderr)
    return EXIT_ERROR
