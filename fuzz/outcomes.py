"""Four outcomes, never confused: a vLLM bug, a missed hit, a configuration
vLLM refuses, and a harness that does not fit the installed vLLM.

* **violation**: an invariant failed, or vLLM raised on a configuration it
  accepted, through a path vLLM takes. It gets a repro and exit 1.
* **missed hit**: a lookup served a shorter prefix-cache hit than the
  index held, or the pool evicted a cached block out of its documented
  order (:class:`fuzz.model.MissedHit`): a performance bug, not a
  corruption. Recorded, deduplicated and written up like a violation, but
  counted and reported apart; exit 3 when it is all a run found.
* **config rejected**: vLLM refused the drawn configuration at construction
  (a constructor or validator raised) or at first use, with a documented
  refusal (:data:`REFUSALS`). Counted per reason, never a failure.
* **harness error**: the suite's own code does not fit this vLLM (a missing
  attribute, a changed signature, an import error). Exit 2, one line naming
  what is missing and the vLLM version, no repro.

The decision comes from *where* the exception was raised and *what* it is:
the innermost frame that is either the suite's or vLLM's, and for vLLM's,
whether the vLLM function the suite called is a constructor or validator. Test names and message
text never decide.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import traceback
from dataclasses import dataclass
from enum import Enum
from collections.abc import Callable, Iterator
from typing import TypeVar
from pathlib import Path

from hypothesis.errors import HypothesisException

from fuzz.model import HarnessError, InvariantViolation, MissedHit

__all__ = [
    "HARNESS_MARK",
    "REFUSALS",
    "ConfigRejected",
    "Outcome",
    "Refusal",
    "Verdict",
    "classify",
    "adapter_import_failure",
    "construction_failure",
    "started",
    "vllm_calls",
    "vllm_root",
]

ROOT = Path(__file__).resolve().parent.parent
_T = TypeVar("_T")
# The suite's own code: an exception raised here (not an assertion of a
# check) means the suite does not fit the installed vLLM.
_SUITE = tuple(str(ROOT / d) + os.sep for d in ("fuzz", "strategies", "invariants", "engine", "tests")) + (
    str(ROOT / "conftest.py"),
)
# vLLM functions that decide whether a configuration is acceptable.
_VALIDATOR = re.compile(r"(^|\.)(__init__|__post_init__|validate\w*|verify\w*|_verify\w*|_validate\w*|resolve_kv_cache_block_sizes)$")


class ConfigRejected(Exception):
    """vLLM refused the drawn configuration (``reason``: one line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Outcome(str, Enum):
    VIOLATION = "violation"
    MISSED_HIT = "missed hit"
    CONFIG_REJECTED = "config rejected"
    HARNESS_ERROR = "harness error"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str  # one line: the invariant, the refusal, or what does not fit
    where: str  # "path:Qual.name" of the deciding frame ("" for a violation raised by a check)


@dataclass(frozen=True)
class Refusal:
    """A documented refusal vLLM makes at first use rather than at
    construction: the exception it raises, from which function, on which
    releases (``until``: the last release that refuses this way)."""

    id: str
    exception: str
    frame: str  # qualified function name, as in :func:`fuzz.adapter._observe.vllm_frames`
    until: str | None
    reason: str


REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        id="sliding-window-partial-hits",
        exception="AssertionError",
        frame="SlidingWindowManager.find_longest_cache_hit",
        # 0.28.0 turns partial hits off for such layouts itself
        # (kv_cache_utils: "Disabling fine-grained prefix-cache hits ...").
        until="0.27.1",
        reason="SlidingWindowManager does not support fine-grained (partial) cache hits "
        "(a hash block finer than the sliding-window block)",
    ),
)


def vllm_root() -> str:
    """The directory of the ``vllm`` package that imports here (a
    ``--vllm-src`` checkout when one is first on the path)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None, "vLLM is not importable"
    return os.path.dirname(os.path.abspath(spec.origin)) + os.sep


def _release_le(version: str, last: str) -> bool:
    def parts(v: str) -> tuple[int, ...] | None:
        m = re.match(r"^(\d+)\.(\d+)\.(\d+)", v)
        return None if m is None else tuple(int(x) for x in m.groups())

    v, bound = parts(version), parts(last)
    return v is not None and bound is not None and v <= bound


def _frames(exc: BaseException) -> list[tuple[str, str, int]]:
    """(file, qualified function, line) for every frame, outermost first."""
    return [
        (os.path.abspath(f.f_code.co_filename), f.f_code.co_qualname, lineno)
        for f, lineno in traceback.walk_tb(exc.__traceback__)
    ]


def _show(path: str, qualname: str, lineno: int, vroot: str) -> str:
    if path.startswith(vroot):
        return f"vllm/{path[len(vroot):]}:{qualname}"
    try:
        rel = Path(path).relative_to(ROOT).as_posix()
    except ValueError:
        rel = path
    return f"{rel}:{lineno} ({qualname})"


@dataclass(frozen=True)
class _Origin:
    """Where an exception came from, in the terms the decision uses."""

    what: str  # "ValueError: first line of the message"
    where: str  # the innermost frame that is the suite's or vLLM's ("" if neither)
    in_vllm: bool
    vllm_chain: tuple[str, ...]  # vLLM's frames, outermost first, qualified names
    vllm_frames: tuple[str, ...]  # vLLM's innermost frames, innermost first, "vllm/...:Qual.name"


def _origin(exc: BaseException) -> _Origin:
    first_line = (str(exc).strip().splitlines() or [""])[0][:160]
    what = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
    vroot = vllm_root()
    frames = _frames(exc)
    owned = [(p, q, n) for p, q, n in frames if p.startswith(vroot) or p.startswith(_SUITE)]
    in_vllm = [(p, q, n) for p, q, n in frames if p.startswith(vroot)]
    where = _show(*owned[-1], vroot) if owned else ""
    return _Origin(
        what=what,
        where=where,
        in_vllm=bool(owned) and owned[-1][0].startswith(vroot),
        vllm_chain=tuple(q for _, q, _ in in_vllm),
        vllm_frames=tuple(_show(p, q, n, vroot) for p, q, n in reversed(in_vllm))[:3],
    )


def construction_failure(exc: BaseException, vllm_version: str) -> Exception:
    """What to raise when building vLLM objects for a drawn configuration
    failed: :class:`ConfigRejected` when vLLM raised (its constructors and
    validators refuse what they do not support), :class:`HarnessError`
    when the suite's own code did (it does not fit this vLLM)."""
    origin = _origin(exc)
    if origin.in_vllm:
        return ConfigRejected(f"{origin.what} in {origin.where}")
    return HarnessError(f"{origin.what} at {origin.where or '?'} (vLLM {vllm_version})")


@contextlib.contextmanager
def vllm_calls(vllm_version: str, context: str = "") -> Iterator[None]:
    """Around a scenario's calls into vLLM (prefill, lookups, evictions):
    an exception becomes :class:`ConfigRejected`, an
    :class:`InvariantViolation` ``no-exception`` (vLLM raised in a runtime
    path on a configuration it accepted) or a :class:`HarnessError`."""
    try:
        yield
    except (InvariantViolation, HarnessError, ConfigRejected, HypothesisException):
        raise
    except Exception as exc:  # noqa: BLE001 - every exception gets a verdict
        verdict = classify(exc, vllm_version)
        if verdict.outcome is Outcome.CONFIG_REJECTED:
            raise ConfigRejected(verdict.reason) from exc
        if verdict.outcome is Outcome.HARNESS_ERROR:
            raise HarnessError(verdict.reason) from exc
        origin = _origin(exc)
        raise InvariantViolation(
            "no-exception",
            verdict.reason + (f"\n  scenario: {context}" if context else ""),
            where=origin.vllm_chain[0],
            exception=type(exc).__name__,
            frames=origin.vllm_frames,
        ) from exc


def classify(exc: BaseException, vllm_version: str) -> Verdict:
    """Which of the four outcomes ``exc`` is."""
    if isinstance(exc, MissedHit):
        return Verdict(Outcome.MISSED_HIT, f"[{exc.invariant}]", "")
    if isinstance(exc, InvariantViolation):
        return Verdict(Outcome.VIOLATION, f"[{exc.invariant}]", "")
    if isinstance(exc, ConfigRejected):
        return Verdict(Outcome.CONFIG_REJECTED, exc.reason, "")
    origin = _origin(exc)
    if isinstance(exc, HarnessError):
        return Verdict(Outcome.HARNESS_ERROR, str(exc), "")
    if not origin.where:
        return Verdict(
            Outcome.HARNESS_ERROR, f"{origin.what} outside the suite and vLLM (vLLM {vllm_version})", ""
        )
    if not origin.in_vllm:
        # Raised by the suite's own code: it does not fit this vLLM.
        return Verdict(Outcome.HARNESS_ERROR, f"{origin.what} at {origin.where} (vLLM {vllm_version})", origin.where)
    for refusal in REFUSALS:
        if (
            type(exc).__name__ == refusal.exception
            and refusal.frame in origin.vllm_chain
            and (refusal.until is None or _release_le(vllm_version, refusal.until))
        ):
            return Verdict(Outcome.CONFIG_REJECTED, refusal.reason, origin.where)
    # The vLLM function the suite called: a constructor or validator means
    # vLLM refused the configuration; anything else is a runtime path.
    if _VALIDATOR.search(origin.vllm_chain[0]):
        return Verdict(Outcome.CONFIG_REJECTED, f"{origin.what} in {origin.where}", origin.where)
    return Verdict(Outcome.VIOLATION, f"vLLM raised {origin.what} in {origin.where}", origin.where)


# Prefixes the one line a worker's pytest prints when the adapter cannot even
# be imported against the installed vLLM; the runner shows only that line.
HARNESS_MARK = "kvtrunc-fuzz harness error: "


def adapter_import_failure(exc: BaseException) -> str:
    """One line for an adapter that cannot be imported against this vLLM (a
    name or module it imports is gone): what is missing, from where, the
    vLLM version and our line that asked for it. An import of our own that
    fails for any other reason is still a harness error, named the same way."""
    import sys

    vllm = sys.modules.get("vllm")
    version = getattr(vllm, "__version__", "unknown")
    where = next(
        (f"{Path(f.filename).relative_to(ROOT)}:{f.lineno}"
         for f in reversed(traceback.extract_tb(exc.__traceback__)) if f.filename.startswith(_SUITE)),
        "?",
    )
    if isinstance(exc, ModuleNotFoundError):
        what = f"no module {exc.name}"
    elif isinstance(exc, ImportError):
        what = str(exc).split(" (")[0]  # "cannot import name 'X' from 'M'", without the file path
    else:
        what = f"{type(exc).__name__}: {exc}"
    return f"{HARNESS_MARK}the adapter does not fit vLLM {version}: {what} (asked at {where}); every target is unsupported"


def started(build: Callable[[], _T], vllm_version: str) -> _T:
    """``build()`` (a vLLM engine, scheduler, manager), with its failure
    sorted into the three outcomes: a refusal by vLLM's constructors or
    validators becomes :class:`ConfigRejected`, a misfit of the suite's
    own code :class:`HarnessError` (one line, the version named), and a
    crash in a vLLM runtime path propagates unchanged: a violation."""
    try:
        return build()
    except (ConfigRejected, HarnessError, InvariantViolation):
        raise
    except Exception as exc:
        verdict = classify(exc, vllm_version)
        if verdict.outcome is Outcome.CONFIG_REJECTED:
            raise ConfigRejected(verdict.reason) from exc
        if verdict.outcome is Outcome.HARNESS_ERROR:
            raise HarnessError(verdict.reason) from exc
        raise
