"""How a real vLLM defect is pinned: a strict xfail that expects one failure.

``@known_vllm_bug(reason, raises=...)`` marks the test ``known_vllm_bug`` and
strict-xfails it on exactly the expected exception (an
:class:`~fuzz.model.InvariantViolation` unless said otherwise): any other
failure is an error, and the day vLLM fixes the bug the test passes and turns
the run red (XPASS, strict). Then set ``fixed_in`` on the bug's entry in
``fuzz/known_bugs.py`` and delete the pin.

A standalone repro that must import vLLM only
(``test_sink_full_attention_manager.py``) spells the two marks out instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from fuzz.model import InvariantViolation

__all__ = ["known_vllm_bug"]

_T = TypeVar("_T", bound=Callable[..., object])


def known_vllm_bug(
    reason: str,
    *,
    raises: type[BaseException] = InvariantViolation,
    affected: bool = True,
) -> Callable[[_T], _T]:
    """Pin a test as a known vLLM bug: strict xfail on ``raises``, for
    ``reason``; with ``affected`` false (a release that has the fix) the
    test must pass."""

    def pin(test: _T) -> _T:
        test = pytest.mark.xfail(affected, strict=True, raises=raises, reason=reason)(test)
        return pytest.mark.known_vllm_bug(test)

    return pin
