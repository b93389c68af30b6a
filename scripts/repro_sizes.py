"""Print the length, in lines, of every standalone repro the repro tests write.

    HYPOTHESIS_PROFILE=ci PYTHONPATH=. .venv/bin/python scripts/repro_sizes.py [--json OUT]

Runs the repro-writing tests of ``tests/findings`` (planted scheduler bugs:
single-shot searches, state-machine searches, fixed runs, speculative and
connector configurations), records the file each one writes instead of
running it (faster; whether it fails planted and passes unmodified is what
the tests themselves check), and prints one line per planted bug and test:
``bug | test | lines``. Used for the repro-size tables of docs/figures.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import pytest

MODULES = (
    "tests/findings/test_scheduler_repro.py",
    "tests/findings/test_scheduler_repro_configs.py",
    "tests/findings/test_scheduler_repro_runs.py",
)


class Recorder:
    """A pytest plugin: each ``_check_repro`` call records the file's size."""

    def __init__(self) -> None:
        self.sizes: dict[str, int | None] = {}

    def pytest_configure(self, config: pytest.Config) -> None:
        import tests.findings.test_scheduler_repro as repro_tests

        def record(source, bug, tmp_path, check=None):  # type: ignore[no-untyped-def]
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0].split("::")[-1]
            self.sizes[f"{bug} | {test}"] = len(source.splitlines()) if source else None
            return tmp_path / "not-run.py"

        repro_tests._check_repro = record  # the modules beside it import it from there


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the sizes to this file")
    args = parser.parse_args()
    recorder = Recorder()
    modules = [m for m in MODULES if os.path.exists(m)]
    code = pytest.main(["-q", "-p", "no:cacheprovider", *modules], plugins=[recorder])
    for key, lines in sorted(recorder.sizes.items()):
        print(f"{key} | {lines}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(recorder.sizes, out, indent=1, sort_keys=True)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
