"""The upstream form of a finding whose claim no assertion states yet: the
run's concrete steps in vLLM's idiom (as :mod:`fuzz.upstream._writer` writes
them), ending at the step that broke the claim, and instead of an assertion
a docstring that names the claim, the step, and the command that checks it
(``python -m fuzz replay`` of the finding's sidecar, which reruns the whole
record under every claim).

:func:`scheduler_repro_of_failure` is the scheduler tier's repro writer (the
targets' ``repro`` in :mod:`fuzz.registry`): the file with its facts
asserted where the violation carries them and the writer states them, else
this steps-only form; one file per finding.
"""

from __future__ import annotations

import textwrap

from fuzz.model import InvariantViolation, OpLog
from fuzz.upstream._writer import (
    _claim,
    _drop_unread_outputs,
    _File,
    _program,
    _scheduler,
    _source,
    _Unwritable,
    upstream_form,
    upstream_path,
)
from invariants.table import INVARIANTS

__all__ = ["scheduler_repro_of_failure", "steps_only_repro"]


def _broken_at(log: OpLog, violation: InvariantViolation) -> str:
    last = log.steps[-1]
    if last.error:
        return f"step {last.index}, where {last.error_where or 'schedule'}() raises {last.error.split(':')[0]}"
    return f"step {last.index}" + (f" (in {violation.where})" if violation.where else "")


def _seen(violation: InvariantViolation) -> str:
    """The check's own first line (after the claim's name), cut short."""
    first = str(violation).splitlines()[0].removeprefix(f"[{violation.invariant}] ").strip()
    first = first[:240].rstrip(".:").replace("\\", "/").replace('"', "'")  # plain text in a docstring
    return f" The check saw: {first}." if first else ""


def steps_only_repro(oplog: OpLog, violation: InvariantViolation, *, sidecar: str,
                     vllm_version: str | None = None) -> str | None:
    """A pytest file in vLLM's idiom that replays ``oplog`` up to its last
    step, the claim ``violation`` broke and the check's command in its
    docstring (``sidecar``: the finding's JSON file). None where the run
    uses what the writer does not state (speculative decoding, prompt
    embeddings, ...): the sidecar alone then carries the finding."""
    if not oplog.steps:
        return None
    invariant = violation.invariant
    doc = (f"{_claim(invariant)} This run breaks it at {_broken_at(oplog, violation)}.{_seen(violation)} "
           f"No assertion here states it yet: `python -m fuzz replay {sidecar}` replays the whole run under "
           "every claim.")
    f = _File()
    f.need("vllm.utils.hashing", "sha256")
    f.need("vllm.v1.core.kv_cache_utils", "init_none_hash")
    f.body += [f"def test_{invariant.replace('-', '_')}():",
               textwrap.fill(doc, 92, initial_indent='    """', subsequent_indent="    ", break_on_hyphens=False,
                             break_long_words=False) + '"""',
               "    init_none_hash(sha256)"]
    try:
        _scheduler(f, oplog, ())
        f.body.append("")
        _program(f, oplog, ())
    except _Unwritable:
        return None
    _drop_unread_outputs(f.body)
    return _source(f, violation, vllm_version)


def _replayed(log: OpLog, invariant: str) -> InvariantViolation | None:
    """``log`` shrunk by replay with the claim's check alone (every check
    the replay knows for a claim with no row), then replayed: the violation
    carrying the log the file is written from; None when no replay breaks
    the claim."""
    from fuzz.repro.shrink import replay_violation, shrink_oplog

    rows = [row.check for row in INVARIANTS if row.name == invariant and row.tier == "scheduler"]
    checks = tuple(rows[:1]) or None
    if replay_violation(log, invariant, checks) is None:
        return None
    for candidate in (shrink_oplog(log, invariant, checks=checks), log):
        violation = replay_violation(candidate, invariant, checks)
        if violation is not None and isinstance(violation.oplog, OpLog):
            return violation
    return None


def scheduler_repro_of_failure(failure: BaseException | None, invariant: str, *,
                               sidecar: str) -> tuple[str, str] | None:
    """``failure``'s repro, from the operation log its run attached
    (:func:`fuzz.runners.scheduler.carrying_oplog`): (its place in vLLM's
    tests tree, its source), the facts asserted where it carries them
    (:func:`fuzz.upstream.upstream_form`), else the steps-only form. The
    log it was written from is set as the failure's ``repro_oplog`` (the
    sidecar keeps it). None when there is no log, no replay breaks the
    claim, or the run uses what the writer does not state."""
    log = getattr(failure, "oplog", None)
    if not isinstance(failure, InvariantViolation) or not isinstance(log, OpLog):
        return None
    if failure.facts:
        form = upstream_form(log, invariant)
        if form is not None:
            failure.repro_oplog = form[2].oplog
            return form[0], form[1]
    violation = _replayed(log, invariant)
    if violation is None:
        return None
    source = steps_only_repro(violation.oplog, violation, sidecar=sidecar)  # type: ignore[arg-type]
    if source is None:
        return None
    failure.repro_oplog = violation.oplog
    return f"{upstream_path(violation.oplog)}/test_{invariant.replace('-', '_')}.py", source  # type: ignore[arg-type]
