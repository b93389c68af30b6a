"""Fuzz an unclassified spec type under both hypotheses.

For a spec class the classification table does not know yet, run the
truncation target on full attention + that class twice: once assuming it must
cover the endpoint (attention-like), once assuming it may be short (whole
recurrent state). The hypothesis with no violation is what vLLM's current
``truncate_computed_blocks`` implements for it; the person classifying the
class sees the consequence of either choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuzz import adapter
from fuzz.hunting import hunt
from fuzz.targets.target_truncate import check_truncation_scenario
from invariants.classification import Behaviour, provisional
from strategies.scenarios import truncation_scenarios
from strategies.specs import kv_cache_layouts

__all__ = ["HypothesisVerdict", "judge_hypotheses"]

_HYPOTHESES = (Behaviour.MUST_COVER, Behaviour.MAY_BE_SHORT)


@dataclass(frozen=True)
class HypothesisVerdict:
    qualname: str
    outcomes: dict[Behaviour, str | None]  # None: no violation in the budget

    @property
    def implemented(self) -> Behaviour | None:
        """The one hypothesis vLLM's code satisfies, if exactly one holds."""
        holding = [b for b, v in self.outcomes.items() if v is None]
        return holding[0] if len(holding) == 1 else None

    def summary(self) -> str:
        lines = [f"{self.qualname} fuzzed under both hypotheses:"]
        for b, v in self.outcomes.items():
            lines.append(f"  {b.value}: " + ("holds (no violation)" if v is None else f"violated: {v}"))
        implemented = self.implemented
        lines.append(
            "  => vLLM's current truncate_computed_blocks treats it as "
            + (implemented.value if implemented else "neither/both (inconclusive)")
        )
        return "\n".join(lines)


def judge_hypotheses(cls: type, *, max_examples: int = 1000) -> HypothesisVerdict:
    """Run the truncation target on [FullAttention, cls] under each hypothesis."""
    qualname = adapter.qualified_name(cls)
    outcomes: dict[Behaviour, str | None] = {}
    for behaviour in _HYPOTHESES:
        with provisional(qualname, behaviour):
            layouts = kv_cache_layouts(
                kinds=("FullAttentionSpec", cls.__name__),
                min_groups=2,
                max_groups=2,
                required=("FullAttentionSpec", cls.__name__),
            )
            result = hunt(
                check_truncation_scenario,
                # Per-group lookups with evictions in the new group only: the
                # way its hit falls behind full attention's.
                truncation_scenarios(
                    layouts=layouts, lookup_modes=("per_group",), evicting_kinds=(cls.__name__,)
                ),
                max_examples=max_examples,
                seed=0,
            )
        outcomes[behaviour] = None if not result.found else str(result.violation).splitlines()[0]
    return HypothesisVerdict(qualname, outcomes)


