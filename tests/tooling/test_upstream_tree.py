"""fuzz.upstream.run_in_tree: files run inside a scratch copy of vLLM's
tests tree, with vLLM's ``tests`` package, under a planted bug when asked,
and the cached tree is left as it was. One pytest subprocess."""

from __future__ import annotations

import pytest

from fuzz.upstream import SKIP_REASON, TreeOutcome, run_in_tree, tests_tree

pytestmark = [pytest.mark.slow, pytest.mark.skipif(tests_tree() is None, reason=SKIP_REASON)]

PROBE = '''
import pytest

import tests

pytestmark = pytest.mark.cpu_test


def test_tests_is_vllms_package():
    from tests.v1.core.utils import create_scheduler  # only vLLM's tests tree has it

    assert callable(create_scheduler)
    assert "vllm-tests-" in tests.__file__, tests.__file__


def test_schedule_is_planted():
    from vllm.v1.core.sched.scheduler import Scheduler

    assert "[planted max_tokens_skip_unguarded]" in Scheduler.schedule.__code__.co_filename


def test_fails():
    assert 1 == 2, "one is not two"


@pytest.mark.skip(reason="not today")
def test_skips():
    pass
'''


def test_a_probe_runs_in_vllms_tree_under_a_plant() -> None:
    tree = tests_tree()
    assert tree is not None
    before = sorted(p.relative_to(tree) for p in (tree / "v1" / "core").iterdir())
    got = run_in_tree({"v1/core/test_probe.py": PROBE, "v1/core/test_broken.py": "import not_a_module\n"},
                      plant="max_tokens_skip_unguarded")
    node = "tests/v1/core/test_probe.py::"
    assert got[node + "test_tests_is_vllms_package"] == TreeOutcome("passed"), got
    assert got[node + "test_schedule_is_planted"] == TreeOutcome("passed"), got
    assert got[node + "test_fails"].outcome == "failed", got
    assert got[node + "test_fails"].message.startswith("AssertionError: one is not two"), got
    assert got[node + "test_skips"] == TreeOutcome("skipped", "Skipped: not today"), got
    assert got["tests/v1/core/test_broken.py"].outcome == "error", got
    assert "not_a_module" in got["tests/v1/core/test_broken.py"].message, got
    assert sorted(p.relative_to(tree) for p in (tree / "v1" / "core").iterdir()) == before


def test_a_path_outside_the_tree_is_refused() -> None:
    with pytest.raises(ValueError, match="inside the tests tree"):
        run_in_tree({"../escape.py": ""})
