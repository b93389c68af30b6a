"""A new KV-cache spec type is one row of the classification table.

What a vLLM contributor adding a spec class does: define the class, add its
row to ``CLASSIFIED``. With nothing else changed the strategies draw it, the
adapter builds it (for the manager and the scheduler), the repro writer
prints its constructor, the invariants classify it, and the guard is quiet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hypothesis import HealthCheck, Phase, find, settings

from fuzz import adapter
from fuzz.upstream._truncation import spec_code
from fuzz.spec_guard import guard_findings
from fuzz.model import CLASSIFIED, Behaviour, Classification, Param, Span, behaviour_of
from tests.support.harnesses import harness_of
from strategies.specs import drawable_kinds, kv_cache_layouts

ROW = Classification(
    Behaviour.MUST_COVER,
    "a windowed attention type added by a contributor",
    params=(Param("sliding_window"),),
    span=("sliding_window", Span.WINDOW),
)


@contextlib.contextmanager
def a_new_spec_type() -> Iterator[tuple[type, str]]:
    """A new subclass of vLLM's sliding-window spec, with its one row."""
    with adapter.temporary_spec_subclass("SlidingWindowSpec", "ContributedWindowSpec") as cls:
        qualname = adapter.qualified_name(cls)
        CLASSIFIED[qualname] = ROW
        try:
            yield cls, qualname
        finally:
            del CLASSIFIED[qualname]


def test_one_row_makes_a_new_spec_type_drawn_built_and_classified() -> None:
    with a_new_spec_type() as (cls, qualname):
        assert "ContributedWindowSpec" in drawable_kinds()
        assert guard_findings(fuzz_hypotheses=False) == []
        assert behaviour_of(qualname) is Behaviour.MUST_COVER

        # Drawn, with its window parameter in whole blocks.
        layout = find(
            kv_cache_layouts(required=("FullAttentionSpec", "ContributedWindowSpec"), min_groups=2, max_groups=2),
            lambda lay: True,
            settings=settings(database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)),
        )
        group = next(g for g in layout.groups if g.kind == "ContributedWindowSpec")
        window = group.param("sliding_window")
        assert window is not None and window % group.block_size == 0

        # Built: a real manager, and a real scheduler whose observation
        # carries the window the invariants read.
        spec = adapter.build_spec(group)
        assert type(spec) is cls and spec.sliding_window == window
        harness = adapter.ManagerHarness(layout)
        assert [g.spec_class for g in harness.groups].count(qualname) == 1
        sched = harness_of(layout)
        assert ("sliding_window", window) in sched.spans

        # Printed for a repro with the same arguments.
        assert spec_code(group).startswith("ContributedWindowSpec(block_size=")
        assert f"sliding_window={window}" in spec_code(group)
    assert "ContributedWindowSpec" not in drawable_kinds()


def test_without_its_row_the_new_type_is_not_drawn_and_the_guard_fires() -> None:
    with adapter.temporary_spec_subclass("SlidingWindowSpec", "UnrowedWindowSpec"):
        assert "UnrowedWindowSpec" not in drawable_kinds()
        findings = guard_findings(fuzz_hypotheses=False)
    assert len(findings) == 1 and "UnrowedWindowSpec" in findings[0]
