"""What the repro tests share: the search budget and strategy that find a
planted bug whose case has no fixed run (``tests/findings/test_upstream_repro.py``
imports them)."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

from strategies.single_shot import single_shot_scenarios

SEARCH = settings(max_examples=2000, derandomize=True, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))


def planted_search_strategy():  # type: ignore[no-untyped-def]
    """The single-shot scenarios without the twins and load flavours: those
    build the open vLLM 0.33.0 bugs' states on purpose, and a repro shrunk
    from such a scenario fails on unmodified vLLM too (the undercount's
    ValueError), which these planted-bug repros must not."""
    return single_shot_scenarios(shortcut=False, allow_over=False)
