"""The guard: every KV-cache spec class in the installed vLLM is classified.

``guard_findings()`` walks every ``KVCacheSpec`` subclass reachable in the
installed vLLM (imported modules and vLLM's spec registry) and returns one
message per class that is neither classified nor exempted in
:mod:`fuzz.model._classification`, naming the class, its module, what vLLM
says about it, the question to decide, and (optionally) how vLLM's current
``truncate_computed_blocks`` behaves for it under both hypotheses
(:func:`judge_hypotheses`): the truncation target runs on full attention +
that class twice, once assuming it must cover the endpoint, once assuming it
may be short; the hypothesis with no violation is what vLLM implements, and
the person classifying the class sees the consequence of either choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuzz import adapter
from fuzz.hunting import hunt, without_module_constants
from fuzz.targets.target_truncate import check_truncation_scenario
from fuzz.model import CLASSIFIED, EXEMPT, Behaviour, provisional, question_for
from strategies.scenarios import truncation_scenarios
from strategies.specs import kv_cache_layouts

__all__ = ["HypothesisVerdict", "guard_findings", "judge_hypotheses", "unclassified_spec_classes"]


def unclassified_spec_classes() -> list[type]:
    return [
        cls
        for cls in adapter.spec_classes()
        if adapter.qualified_name(cls) not in CLASSIFIED
        and adapter.qualified_name(cls) not in EXEMPT
    ]


def guard_findings(*, fuzz_hypotheses: bool = True, max_examples: int = 1000) -> list[str]:
    findings = []
    for cls in unclassified_spec_classes():
        qual = adapter.qualified_name(cls)
        facts = adapter.spec_facts(cls)
        said = (
            f"prefix_cacheable={facts.prefix_cacheable}, kind={facts.kind}, "
            f"manager={facts.manager}, subclass of MambaSpec={facts.is_mamba_subclass}, "
            f"of AttentionSpec={facts.is_attention_subclass}"
            + (f", sample build failed: {facts.build_error}" if facts.build_error else "")
        )
        message = f"UNCLASSIFIED KV-cache spec {cls.__name__} (module {cls.__module__}).\n"
        message += question_for(qual, said)
        if fuzz_hypotheses and facts.manager is not None and facts.prefix_cacheable:
            message += "\n" + judge_hypotheses(cls, max_examples=max_examples).summary()
        findings.append(message)
    return findings


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
        # The verdict must not depend on what else the process imported.
        with provisional(qualname, behaviour), without_module_constants():
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
                    layouts=layouts, lookup_modes=("per_group",), evicting_kinds=(cls.__name__,), eagle="never"
                ),
                max_examples=max_examples,
                seed=0,
            )
        outcomes[behaviour] = None if not result.found else str(result.violation).splitlines()[0]
    return HypothesisVerdict(qualname, outcomes)


