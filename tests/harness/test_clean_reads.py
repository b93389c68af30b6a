"""The contents model reads a block's positions again only where they may
have changed (fuzz/adapter/_clean_reads.py): at every read of every fixed
run, planted and unplanted, what it finds is what a read of every position
finds, and a block rewritten after a clean read is read again."""

from __future__ import annotations

from typing import Any

import pytest

from fuzz.adapter import FIXED_RUNS, planted_scheduler_bug
from fuzz.adapter._clean_reads import CleanReads
from fuzz.adapter._contents import BlockContents
from fuzz.runners.scheduler import run_fixed


class _ReadsEverything(CleanReads):
    def unseen(self, key: Any, runs: list[range], *args: Any) -> list[int]:
        return [p for r in runs for p in r]


@pytest.mark.parametrize("planted", [False, True])
@pytest.mark.parametrize("run", sorted(FIXED_RUNS))
def test_a_read_finds_what_a_read_of_every_position_finds(monkeypatch: pytest.MonkeyPatch, run: str, planted: bool) -> None:
    real = BlockContents.unread
    reads = []

    def unread(self: BlockContents, *args: Any, **kwargs: Any) -> Any:
        kept = self.clean_reads
        self.clean_reads = _ReadsEverything()
        try:
            whole = real(self, *args, **kwargs)
            whole_other = set(self.other_prefix)
        finally:
            self.clean_reads = kept
        found = real(self, *args, **kwargs)
        reads.append((sorted(found, key=repr) == sorted(whole, key=repr) and self.other_prefix == whole_other, len(whole)))
        return found

    monkeypatch.setattr(BlockContents, "unread", unread)
    try:
        if planted:
            with planted_scheduler_bug(run):
                run_fixed(FIXED_RUNS[run], ())
        else:
            run_fixed(FIXED_RUNS[run], ())
    except AssertionError:  # a plant caught (a claim, or the run's own expected hits)
        assert planted
    assert reads or planted, "the run read nothing"
    assert all(same for same, _ in reads), [i for i, (same, _) in enumerate(reads) if not same]


def test_a_block_rewritten_after_a_clean_read_is_read_again() -> None:
    reads = CleanReads()
    key = ("r0", 0, 5)
    assert reads.unseen(key, [range(4)], (), [10, 11, 12, 13]) == [0, 1, 2, 3]
    assert reads.unseen(key, [range(4)], (), [10, 11, 12, 13]) == []  # unchanged: nothing to read again
    assert reads.unseen(key, [range(5)], (), [10, 11, 12, 13, 14]) == [4]  # only what is new
    assert reads.unseen(key, [range(4)], (), [10, 11, 99, 98, 97]) == [0, 1, 2, 3]  # another prefix
    reads.changed(5)
    assert reads.unseen(key, [range(4)], (), [10, 11, 99, 98, 97]) == [0, 1, 2, 3]  # rewritten
    reads.forget(key)
    assert reads.unseen(key, [range(4)], (), [10, 11, 99, 98, 97]) == [0, 1, 2, 3]  # the last read found a gap
    assert reads.unseen(key, [range(1), range(2, 3)], (), [10, 11, 99]) == [0, 2]  # not one run of positions
