"""Differential output oracle: the engine's greedy tokens and logprobs must
equal those of a cold run (prefix caching and the connector off).

Pure Python, no vLLM import, so its self-tests run in any environment.

Tolerance (``LOGPROB_TOL = 1e-4``, absolute, on natural-log probabilities):
the model is float32 end to end. A warm run differs from the cold one only in
where prefill is split (cache hits, align-mode chunk ends, loaded states), so
honest differences are float32 rounding in the chunked SSD scan and in
attention over split chunks: at most 2.1e-5 over a 200-example CPU run
(docs/engine-tier.md). A wrong Mamba state or KV block, with the tiny
model's std-0.5 weights, moves logprobs by 1e-1 and more and usually flips
the greedy token (the planted defects in tests/engine/test_engine_tier.py). 1e-4
sits 5x above the largest honest difference seen and three orders below the
planted defects' effect.

Greedy ties: when the two runs pick different tokens at step ``i`` but the
cold run's logprobs of the two tokens differ by at most the tolerance, the
pick is a numerical tie, not a defect: the comparison stops there (the
continuations legitimately differ) and the verdict says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "LOGPROB_TOL",
    "ColdResult",
    "Completion",
    "OutputMismatch",
    "Verdict",
    "check_completion",
]

LOGPROB_TOL = 1e-4


@dataclass(frozen=True)
class Completion:
    """What the engine under test returned for one request."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # logprob of each sampled token
    finish_reason: str | None = None
    num_cached_tokens: int | None = None


@dataclass(frozen=True)
class ColdResult:
    """The cold run's greedy tokens, with the top-k logprobs at each step."""

    token_ids: tuple[int, ...]
    top: tuple[dict[int, float], ...] = field(default=())

    def logprob(self, step: int, token: int) -> float | None:
        return self.top[step].get(token) if step < len(self.top) else None


class OutputMismatch(AssertionError):
    """The engine's output differs from the cold run beyond tolerance."""


@dataclass(frozen=True)
class Verdict:
    status: str  # "match", "tie" (stopped at a numerical tie), "loud" (request failed with an error)
    compared_steps: int
    max_logprob_diff: float


def check_completion(
    label: str, got: Completion, cold: ColdResult, *, tol: float = LOGPROB_TOL, loud_ok: bool = False
) -> Verdict:
    """Claim: ``got`` equals ``cold`` token by token, logprobs within ``tol``.

    A request that finished with an error is *loud*: accepted only when
    ``loud_ok`` (the connector was told to over-promise), else a mismatch.
    Raises :class:`OutputMismatch` naming the request, the step, both tokens
    and both logprobs.
    """
    if got.finish_reason == "error":
        if loud_ok:
            return Verdict("loud", 0, 0.0)
        raise OutputMismatch(f"{label}: request failed (finish_reason='error') though the connector told the truth")
    n = len(got.token_ids)
    if n > len(cold.token_ids):
        raise OutputMismatch(f"{label}: {n} tokens but the cold run has only {len(cold.token_ids)}")
    if len(got.logprobs) != n:
        raise OutputMismatch(f"{label}: {n} tokens but {len(got.logprobs)} logprobs")
    worst = 0.0
    for i, (tok, lp) in enumerate(zip(got.token_ids, got.logprobs)):
        want = cold.token_ids[i]
        want_lp = cold.logprob(i, want)
        if tok != want:
            got_in_cold = cold.logprob(i, tok)
            if got_in_cold is not None and want_lp is not None and want_lp - got_in_cold <= tol:
                return Verdict("tie", i, worst)
            raise OutputMismatch(
                f"{label}: step {i}: token {tok} (logprob {lp:.6f}) but the cold run chose "
                f"{want} (logprob {want_lp}); cold logprob of {tok}: {got_in_cold}; "
                f"tokens so far {list(got.token_ids[:i + 1])} vs {list(cold.token_ids[:i + 1])}"
            )
        if want_lp is None:
            raise OutputMismatch(f"{label}: step {i}: the cold run has no logprob for its own token {want}")
        diff = abs(lp - want_lp)
        worst = max(worst, diff)
        if diff > tol:
            raise OutputMismatch(
                f"{label}: step {i}: token {tok} agrees but logprob {lp:.7f} vs cold {want_lp:.7f} "
                f"(|diff| {diff:.2e} > tol {tol:.0e})"
            )
    return Verdict("match", n, worst)
