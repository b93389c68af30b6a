"""Findings in vLLM's own test idiom, verified inside vLLM's tests tree."""

from fuzz.upstream._tree import SKIP_REASON, TreeOutcome, run_in_tree, tests_tree

__all__ = ["SKIP_REASON", "TreeOutcome", "run_in_tree", "scheduler_repro_of_failure", "steps_only_repro",
           "tests_tree", "truncation_repro", "truncation_repro_of_failure", "upstream_form", "upstream_path",
           "upstream_repro"]

# Name -> the private module defining it.
_LAZY = {"upstream_form": "_writer", "upstream_path": "_writer", "upstream_repro": "_writer",
         "scheduler_repro_of_failure": "_steps",
         "steps_only_repro": "_steps", "truncation_repro": "_truncation", "truncation_repro_of_failure": "_truncation"}


def __getattr__(name: str) -> object:
    # The writer imports the harness (and vLLM): loaded on first use, so the
    # tree's pytest plugin, which imports this package, stays light.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"fuzz.upstream.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
