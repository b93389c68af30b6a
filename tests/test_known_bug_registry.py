"""Every known-unbuildable spec type has its strict-xfail known-bug test."""

from pathlib import Path

from invariants.classification import KNOWN_UNBUILDABLE

KNOWN_BUG_DIR = Path(__file__).parent / "known_bugs"


def test_each_known_unbuildable_spec_has_a_pinned_repro() -> None:
    texts = "\n".join(p.read_text() for p in KNOWN_BUG_DIR.glob("test_*.py"))
    for qualname in KNOWN_UNBUILDABLE:
        cls_name = qualname.rsplit(".", 1)[-1]
        assert cls_name in texts, f"{qualname} is KNOWN_UNBUILDABLE but no repro in {KNOWN_BUG_DIR}"
