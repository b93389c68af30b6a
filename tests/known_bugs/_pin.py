"""How a real vLLM defect is pinned: a strict xfail that expects one failure.

``@known_vllm_bug(reason, raises=...)`` marks the test ``known_vllm_bug`` and
strict-xfails it on exactly the expected exception (an
:class:`~fuzz.model.InvariantViolation` unless said otherwise): any other
failure is an error, and the day vLLM fixes the bug the test passes and turns
the run red (XPASS, strict). Then set ``fixed_in`` on the bug's entry in
``fuzz/known_bugs.py`` and delete the pin.

Inside the pin, ``with shown_as(bug_id):`` lets the expected violation
through only where the registry recognises every instance of it as that bug
(the signatures triage matches), so a different failure on the same path is
not taken for it.

A standalone repro that must import vLLM only
(``test_sink_full_attention_manager.py``) spells the two marks out instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from fuzz.model import InvariantViolation

__all__ = ["known_vllm_bug", "shown_as"]

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


@contextlib.contextmanager
def shown_as(bug_id: str, context: Callable[[], str] | None = None) -> Iterator[None]:
    """Re-raise an InvariantViolation from the block only after asserting
    that the registry's ``bug_id`` shows in it (its message, or
    ``context()``, explains a mismatch)."""
    from fuzz.known_bugs import known_bug

    try:
        yield
    except InvariantViolation as exc:
        assert known_bug(bug_id).shows_in_every(exc), context() if context else str(exc)
        raise
