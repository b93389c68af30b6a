"""The writer's passes share parsed trees (fuzz/repro/trees.py) and leave them as parsed."""

from __future__ import annotations

import ast

import pytest

from fuzz.repro.trees import parents, parse, walk
from fuzz.targets.target_scheduler import UNSUPPORTED

SOURCE = "def f(x):\n    y = [x]\n    return y\n"


def test_a_text_is_parsed_and_walked_once() -> None:
    tree = parse(SOURCE)
    assert parse(SOURCE) is tree
    assert walk(tree) is walk(tree)
    assert [type(n) for n in walk(tree)] == [type(n) for n in ast.walk(ast.parse(SOURCE))]
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert parents(tree)[id(fn.body[0])] is fn


def test_a_syntax_error_is_raised_each_time() -> None:
    for _ in range(2):
        with pytest.raises(SyntaxError):
            parse("def f(:\n")


@pytest.mark.skipif(UNSUPPORTED is not None, reason=UNSUPPORTED or "")
@pytest.mark.parametrize("invariant", ["reads-written", "same-step-hazard", "hit-matches-index"])
def test_writing_a_file_again_in_the_same_process_writes_the_same_file(invariant: str) -> None:
    """A pass that changed a shared tree would hand the next pass reading
    that text a different tree: the second file would differ."""
    from fuzz.repro.scheduler import scheduler_repro
    from tests.findings.repro_checks import tiny_log

    log = tiny_log()
    first = scheduler_repro(log, invariant=invariant, target="t", seed=0, violation="")
    again = scheduler_repro(log, invariant=invariant, target="t", seed=0, violation="")
    assert first is not None and first == again
