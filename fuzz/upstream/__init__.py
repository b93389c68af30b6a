"""Findings in vLLM's own test idiom, verified inside vLLM's tests tree."""

from fuzz.upstream._tree import SKIP_REASON, TreeOutcome, run_in_tree, tests_tree

__all__ = ["SKIP_REASON", "TreeOutcome", "run_in_tree", "tests_tree", "upstream_form", "upstream_path",
           "upstream_repro", "upstream_repro_of_failure"]


def __getattr__(name: str) -> object:
    # The writer imports the harness (and vLLM): loaded on first use, so the
    # tree's pytest plugin, which imports this package, stays light.
    if name in ("upstream_form", "upstream_path", "upstream_repro", "upstream_repro_of_failure"):
        from fuzz.upstream import _writer

        return getattr(_writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
