"""The upstream-form repros under ``upstream/`` are vLLM test files (they
import ``tests.v1...`` from vLLM's own tests tree): never collected here;
``test_upstream_form.py`` runs them inside vLLM's tree."""

collect_ignore = ["upstream"]
