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
    """A pytest plugin: each ``check_repro`` call records the file's size."""

    def __init__(self) -> None:
        self.sizes: dict[str, int | None] = {}

    def record(self, source, bug, tmp_path, check=None):  # type: ignore[no-untyped-def]
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0].split("::")[-1]
        self.sizes[f"{bug} | {test}"] = len(source.splitlines()) if source else None
        return tmp_path / "not-run.py"

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # Each test module holds the check it imported under its own name:
        # swapped there, in the modules collected (this script imports no test code).
        for module in {item.module for item in items if isinstance(item, pytest.Function)}:
            if hasattr(module, "check_repro"):
                module.check_repro = self.record


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
