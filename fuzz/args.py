"""What every ``python -m fuzz`` command shares on its command line: the
exit codes and the parser whose errors are one line.

Exit codes: 0 no violation, 1 violations found (or a replayed repro still
fails), 2 usage or harness error (one line), 3 only missed hits found."""

from __future__ import annotations

import argparse

__all__ = ["EXIT_ERROR", "EXIT_MISSED_HIT", "EXIT_OK", "EXIT_VIOLATION", "OneLineParser", "UsageError"]

EXIT_OK, EXIT_VIOLATION, EXIT_ERROR, EXIT_MISSED_HIT = 0, 1, 2, 3


class UsageError(Exception):
    """One clear line for the user (``python -m fuzz COMMAND: ...``); exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one :class:`UsageError` line."""

    def error(self, message: str) -> None:  # type: ignore[override]  # one line, exit code 2
        raise UsageError(message)
