"""kvtrunc-fuzz: property-based fuzzing of vLLM's KV-cache block truncation.

Entry point: ``python -m fuzz`` (:mod:`fuzz.cli`). The vLLM adapter is
:mod:`fuzz.adapter`; the targets live in :mod:`fuzz.targets` and are named in
:mod:`fuzz.registry`; :mod:`fuzz.campaign` runs them for a budget
(``python -m fuzz run``/``merge``), :mod:`fuzz.matrix` on every supported
vLLM release (``python -m fuzz matrix``); :mod:`fuzz.bench` measures them.
"""

__all__: list[str] = []
