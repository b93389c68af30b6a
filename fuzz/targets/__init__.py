"""Fuzz targets: Hypothesis tests that drive vLLM's real code.

Files named ``target_*.py``; test functions named ``fuzz_*``. pytest collects
them (see ``pyproject.toml``), ``python -m fuzz run`` runs them on a budget.
"""
