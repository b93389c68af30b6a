"""``python -m fuzz bugbench --planted``: how long a default campaign takes to
find each planted scheduler bug, over repeated trials; ``--compare`` sets two
such benches side by side.

A planted bug (:data:`fuzz.adapter.PLANTED_SCHEDULER_BUGS`) is a deliberate
edit of vLLM's code. A trial searches as a default campaign does: the
default targets share the budget in the campaign's slices
(:class:`~fuzz.bugbench._Searcher`, the schedule the campaign uses), with
known-bug suppression on (a real vLLM bug is set aside, as the campaign sets
it aside), from no example database. The clock stops at the first example
that fails on something the campaign would report as new: a violation that
is not a known bug's. That is what a user of the campaign would see first;
the claim it broke is kept, with whether the invariant table lists the
plant under that claim.

Plants run one after another in one child process (vLLM imported once, one
warm-up); each trial prints a JSON line as it ends, so a child that dies
loses only its current plant: the parent starts a new child for the plants
left. ``--compare BEFORE AFTER`` reads two benches' JSON and prints, for
every plant both timed, found k/N, median seconds and median examples to the
find, and the ratio of the medians.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from fuzz.bugbench import ROOT, _commit, _Searcher, _seconds, machine, parse_or_exit_code, summarize_trials

__all__ = ["compare", "planted_claims", "run_planted"]

CHILD_FLAG = "--planted-child"


def planted_claims() -> dict[str, tuple[str, ...]]:
    """Each planted scheduler bug and the claims the invariant table shows
    catching it (empty: a sibling plant the table does not list)."""
    from fuzz.adapter import PLANTED_SCHEDULER_BUGS
    from invariants.table import INVARIANTS

    claims: dict[str, tuple[str, ...]] = {name: () for name in PLANTED_SCHEDULER_BUGS}
    for row in INVARIANTS:
        for plant in row.planted:
            if plant in claims:
                claims[plant] += (row.name,)
    return claims


def _child(job: dict[str, Any]) -> int:
    """Trials of each plant in turn; one JSON line per trial on stdout."""
    from fuzz import adapter, known_bugs
    from fuzz.model import InvariantViolation
    from fuzz.registry import default_targets

    assert known_bugs.suppressing(), f"a planted bench sets known bugs aside, as a campaign does: unset {known_bugs.SUPPRESS_ENV}"
    searcher = _Searcher([t.name for t in default_targets()])

    def new_failure(exc: BaseException) -> bool:
        """What the campaign reports as new: anything but a known bug's violation."""
        return not (isinstance(exc, InvariantViolation) and known_bugs.match_violation(exc, searcher.version))

    print(json.dumps({"warmup_s": round(searcher.warm_up(), 1), "vllm_version": searcher.version}), flush=True)
    for plant in job["plants"]:
        with adapter.planted_scheduler_bug(plant):
            for seed in job["seeds"]:
                trial = searcher.trial(seed, job["budget"], new_failure)
                print(json.dumps({"plant": plant, **trial}), flush=True)
    return 0


def _read_lines(text: str, into: dict[str, list[dict[str, Any]]], header: dict[str, Any]) -> None:
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "plant" in record:
            into.setdefault(record.pop("plant"), []).append(record)
        elif "warmup_s" in record:
            header.setdefault("warmup_s", []).append(record["warmup_s"])
            header["vllm_version"] = record["vllm_version"]


def run_planted(plants: list[str], *, budget: float, seeds: int, log: Any = sys.stdout) -> dict[str, Any]:
    """Every plant's trials, in as few child processes as survive."""
    claims = planted_claims()
    trials: dict[str, list[dict[str, Any]]] = {}
    header: dict[str, Any] = {}
    left = list(plants)
    attempts = 0
    while left and attempts <= len(plants):
        attempts += 1
        job = {"plants": left, "seeds": list(range(seeds)), "budget": budget}
        env = dict(os.environ)
        env.pop("FUZZ_KNOWN_BUGS", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
        proc = subprocess.Popen([sys.executable, "-m", "fuzz.plantbench", CHILD_FLAG, json.dumps(job)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line])[-60:]
            _read_lines(line, trials, header)
            if line.startswith('{"plant"'):
                record = json.loads(line)
                print(f"{record['plant']} seed {record['seed']}: "
                      + (f"found after {record['seconds']} s ({record['examples']} examples, {record['target']}, "
                         f"{record['claim']})" if record["found"] else f"missed in {budget:.0f} s"),
                      file=log, flush=True)
        proc.wait()
        done = {p for p, ts in trials.items() if len(ts) >= seeds}
        if proc.returncode != 0:
            current = next((p for p in left if p not in done), None)
            print(f"child exited {proc.returncode} during {current}:\n{''.join(tail[-20:])}", file=log, flush=True)
            if current is not None:  # a plant that kills its child is reported, not retried for ever
                trials.setdefault(current, [])
                done.add(current)
                header.setdefault("errors", {})[current] = "".join(tail[-20:])[-2000:]
        left = [p for p in left if p not in done]
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(), "machine": machine(), "budget_s": budget, "seeds": seeds,
        "vllm_version": header.get("vllm_version"), "warmup_s": header.get("warmup_s", []),
        "errors": header.get("errors", {}), "plants": []}
    for plant in plants:
        ts = trials.get(plant, [])
        report["plants"].append({
            "plant": plant, "claims": list(claims.get(plant, ())), "trials": ts,
            "summary": summarize_trials(ts, budget) if ts else None,
            "median_examples": _median_examples(ts),
        })
    return report


def _median_examples(trials: list[dict[str, Any]]) -> float | None:
    """Median examples to the find, a miss counting as past every find."""
    if not trials:
        return None
    counts = sorted(t["examples"] if t["found"] else float("inf") for t in trials)
    m = statistics.median(counts)
    return None if m == float("inf") else m


def format_planted(report: dict[str, Any]) -> str:
    budget = report["budget_s"]
    rows = ["| planted bug | found | median s | worst s | median examples | found first by (claim) |",
            "|---|---:|---:|---:|---:|---|"]
    for p in report["plants"]:
        s = p["summary"]
        if s is None:
            rows.append(f"| `{p['plant']}` | not run | | | | {report['errors'].get(p['plant'], '')[:80]} |")
            continue
        claims = sorted({t["claim"].split(" (")[0] for t in p["trials"] if t["found"]})
        rows.append(f"| `{p['plant']}` | {s['found']}/{s['trials']} | {_seconds(s['median_s'], budget)} | "
                    f"{_seconds(s['worst_s'], budget)} | {_n(p['median_examples'])} | {', '.join(claims) or '-'} |")
    return "\n".join(rows)


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def compare(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, list[str]]:
    """The side-by-side table of two planted benches, and the plants whose
    median got worse: found in fewer trials, or a median more than twice the
    other's and over 5 s apart (seconds move with the host's load; a single
    doubling under a few seconds is noise at five seeds)."""
    by_plant = {p["plant"]: p for p in before["plants"] if p["summary"]}
    rows = [(f"| planted bug | found, {before['commit']} | found, {after['commit']} | median s | "
             "median examples | after/before (median s) |"), "|---|---:|---:|---|---|---:|"]
    worse = []
    for p in after["plants"]:
        b = by_plant.get(p["plant"])
        if b is None or p["summary"] is None:
            continue
        sb, sa = b["summary"], p["summary"]
        mb = sb["median_s"] if sb["median_s"] is not None else float("inf")
        ma = sa["median_s"] if sa["median_s"] is not None else float("inf")
        ratio = "-" if mb in (0, float("inf")) or ma == float("inf") else f"{ma / mb:.2f}"
        if sa["found"] < sb["found"] or (ma > 2 * mb and ma - mb > 5):
            worse.append(p["plant"])
        rows.append(f"| `{p['plant']}` | {sb['found']}/{sb['trials']} | {sa['found']}/{sa['trials']} | "
                    f"{_seconds(sb['median_s'], before['budget_s'])} → {_seconds(sa['median_s'], after['budget_s'])} | "
                    f"{_n(b['median_examples'])} → {_n(p['median_examples'])} | {ratio} |")
    return "\n".join(rows), worse


def main(argv: list[str]) -> int:
    """``--planted [--plant NAME ...] [--seeds N] [--budget S] [--json PATH]``
    or ``--compare BEFORE AFTER`` (called by :func:`fuzz.bugbench.main`)."""
    from fuzz.args import EXIT_ERROR, OneLineParser

    p = OneLineParser(prog="python -m fuzz bugbench --planted", description=__doc__.splitlines()[0])
    p.add_argument("--planted", action="store_true")
    p.add_argument("--plant", action="append", default=[], help="only this planted bug (repeatable)")
    p.add_argument("--seeds", type=int, default=5, help="trials per plant (default %(default)s)")
    p.add_argument("--budget", type=float, default=60.0, help="seconds per trial (default %(default)s)")
    p.add_argument("--json", type=Path, default=ROOT / "fuzz-out" / "plantbench.json", help="where the JSON goes")
    p.add_argument("--compare", nargs=2, type=Path, default=None, metavar=("BEFORE", "AFTER"),
                   help="two planted benches' JSON side by side (runs nothing)")
    args = parse_or_exit_code(p, argv)
    if isinstance(args, int):
        return args
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        table, worse = compare(before, after)
        print(table)
        print(f"\nworse: {', '.join(worse) if worse else 'none'}")
        return 0
    known = planted_claims()
    unknown = [name for name in args.plant if name not in known]
    if unknown or args.seeds < 1 or args.budget <= 0:
        print("python -m fuzz bugbench: " + (f"unknown planted bug {unknown[0]}" if unknown
                                             else "--seeds and --budget must be positive"), file=sys.stderr)
        return EXIT_ERROR
    report = run_planted(args.plant or sorted(known), budget=args.budget, seeds=args.seeds)
    print(f"\nplanted bugbench: commit {report['commit']}, {report['date']}, {report['machine']}; "
          f"{args.seeds} seed(s) x {args.budget:.0f} s per plant, default targets\n{format_planted(report)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"json: {args.json}")
    return 2 if report["errors"] else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == CHILD_FLAG:
        sys.exit(_child(json.loads(sys.argv[2])))
    sys.exit(main(sys.argv[1:]))
