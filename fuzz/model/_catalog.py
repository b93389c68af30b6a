"""What the installed vLLM offers, in the suite's terms.

The strategies must know which spec classes exist (a class added by a new
vLLM, or by a test, is drawn with no code change) and which release is
installed (a known-unbuildable class is not drawn), without importing vLLM
or the adapter. The adapter fills this in when it is imported; whoever runs
a strategy has imported the adapter to run anything at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

__all__ = ["Installed", "installed", "register_installed"]


@dataclass(frozen=True)
class Installed:
    vllm_version: str
    # Qualified names of every KVCacheSpec subclass reachable now (a call:
    # tests define and retire classes while the process runs).
    spec_classes: Callable[[], tuple[str, ...]]
    # The layout vLLM's engine plans for an EngineDraw, with a number of
    # ngram speculative tokens (default 0) (None: refused).
    plan_layout: Callable[..., Any] | None = None


_INSTALLED: Installed | None = None


def register_installed(facts: Installed) -> None:
    global _INSTALLED
    _INSTALLED = facts


def installed() -> Installed:
    if _INSTALLED is None:
        raise RuntimeError(
            "no vLLM registered: import fuzz.adapter before drawing (conftest.py and "
            "python -m fuzz do; a script must too)"
        )
    return _INSTALLED
