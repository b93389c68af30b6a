"""Print the length, in lines, of every upstream-form repro: each case of
``tests/findings/test_upstream_repro.py`` (its ``CASES``) and each known
bug's pinned file under ``tests/known_bugs/upstream/``, with the medians.

    HYPOTHESIS_PROFILE=ci PYTHONPATH=. .venv/bin/python scripts/repro_sizes.py [--json OUT]

The cases' files are written by that test module's own test (only the
length test runs, ``-k``), recorded where it calls ``written`` (this script
imports no test code: a pytest plugin wraps the function in the module
collected); the known bugs' files are read as they are. One line per file:
``kind | name | path in vLLM's tests tree | lines``, then the medians.
Used for the repro-size table of docs/figures.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CASES_MODULE = "tests/findings/test_upstream_repro.py"
LENGTH_TEST = "test_a_planted_bug_is_written_short_in_vllm_s_idiom"
KNOWN = ROOT / "tests" / "known_bugs" / "upstream"


class Recorder:
    """A pytest plugin: each case's ``written(bug, claim)`` records its file's path and size."""

    def __init__(self) -> None:
        self.sizes: dict[str, tuple[str, int]] = {}

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for module in {item.module for item in items if isinstance(item, pytest.Function)}:
            if hasattr(module, "written"):
                module.written = self._wrap(module.written)

    def _wrap(self, written):  # type: ignore[no-untyped-def]
        def recording(bug: str, claim: str):  # type: ignore[no-untyped-def]
            rel, source, violation = written(bug, claim)
            self.sizes[f"{bug} -> {claim}"] = (rel, len(source.splitlines()))
            return rel, source, violation

        return recording


def _median(sizes: list[int]) -> str:
    return f"median {statistics.median(sizes):g} over {len(sizes)} file(s)" if sizes else "no files"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the sizes to this file")
    args = parser.parse_args()
    recorder = Recorder()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-k", LENGTH_TEST, str(ROOT / CASES_MODULE)],
                       plugins=[recorder])
    known = {str(p.relative_to(KNOWN)): len(p.read_text().splitlines()) for p in sorted(KNOWN.rglob("test_*.py"))}
    for name, (rel, lines) in sorted(recorder.sizes.items()):
        print(f"case | {name} | {rel} | {lines}")
    for rel, lines in known.items():
        print(f"known bug | {Path(rel).stem.removeprefix('test_')} | {rel} | {lines}")
    cases = [lines for _, lines in recorder.sizes.values()]
    print(f"cases: {_median(cases)}; known bugs: {_median(list(known.values()))}; "
          f"all: {_median(cases + list(known.values()))}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"cases": {k: v[1] for k, v in recorder.sizes.items()}, "known_bugs": known}, out, indent=1,
                      sort_keys=True)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
