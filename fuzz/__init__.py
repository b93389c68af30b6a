"""kvtrunc-fuzz: property-based fuzzing of vLLM's KV-cache block truncation.

Entry point: ``python -m fuzz`` (:mod:`fuzz.cli`). The vLLM adapter is
:mod:`fuzz.adapter`; the targets live in :mod:`fuzz.targets`.
"""

__all__: list[str] = []
