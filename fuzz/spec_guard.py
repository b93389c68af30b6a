"""The guard: every KV-cache spec class in the installed vLLM is classified.

``guard_findings()`` walks every ``KVCacheSpec`` subclass reachable in the
installed vLLM (imported modules and vLLM's spec registry) and returns one
message per class that is neither classified nor exempted in
:mod:`invariants.classification`, naming the class, its module, what vLLM
says about it, the question to decide, and (optionally) how vLLM's current
``truncate_computed_blocks`` behaves for it under both hypotheses.
"""

from __future__ import annotations

from fuzz import adapter
from invariants.classification import CLASSIFIED, EXEMPT, question_for

__all__ = ["guard_findings", "unclassified_spec_classes"]


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
            from fuzz.targets.spec_hypotheses import judge_hypotheses

            message += "\n" + judge_hypotheses(cls, max_examples=max_examples).summary()
        findings.append(message)
    return findings
