"""Contents by whole prefix, and keys that name one prefix.

The KV at a position depends on every token before it and on the namespace
vLLM hashes beside them; the contents model names it so
(``fuzz/adapter/_identity.py``), and a key two requests carry over two
prefixes is caught where the hasher gives it. The plant
``hash_ignores_parent`` (``hash_block_tokens`` leaves the parent hash out)
is shown on its fixed run: a lone sliding window adopts another request's
block holding the same tokens at the same positions under another first
block; position-and-token contents cannot see it.
"""

from __future__ import annotations

import pytest

from fuzz.adapter import FIXED_RUNS, planted_scheduler_bug
from fuzz.adapter._contents import BlockContents, namespace_of
from fuzz.adapter._identity import PrefixIdentities
from fuzz.model import InvariantViolation
from fuzz.runners.scheduler import run_fixed
from invariants.contents import KEY_NAMES_TWO_PREFIXES, READ_OTHER_PREFIX, check_keys_name_one_prefix, check_reads_written

RUN = FIXED_RUNS["hash_ignores_parent"]


def test_a_read_under_another_prefix_is_reported_with_its_own_state() -> None:
    with planted_scheduler_bug("hash_ignores_parent"), pytest.raises(InvariantViolation) as caught:
        run_fixed(RUN, (check_reads_written,))
    assert caught.value.invariant == "reads-written"
    assert caught.value.state == READ_OTHER_PREFIX, str(caught.value)
    assert "positions [9, 10, 11]" in str(caught.value), str(caught.value)
    run_fixed(RUN, (check_reads_written,))  # unmodified: the second request misses


def test_a_key_carried_over_two_prefixes_is_caught_where_the_hasher_gives_it() -> None:
    with planted_scheduler_bug("hash_ignores_parent"), pytest.raises(InvariantViolation) as caught:
        run_fixed(RUN, (check_keys_name_one_prefix,))
    assert caught.value.invariant == "keys-name-one-prefix"
    assert caught.value.state == KEY_NAMES_TWO_PREFIXES
    assert "their tokens differ at position 0" in str(caught.value), str(caught.value)
    run_fixed(RUN, (check_keys_name_one_prefix,))


def test_position_and_token_alone_do_not_see_the_foreign_block() -> None:
    """The control: with every position's identity unknown (the model before
    whole-prefix contents), the planted run reads what it adopts silently."""
    original = BlockContents.digests
    BlockContents.digests = lambda self, request_id, tokens: None  # type: ignore[method-assign]
    try:
        with planted_scheduler_bug("hash_ignores_parent"), pytest.raises(AssertionError, match="admissions hit"):
            run_fixed(RUN, (check_reads_written,))  # only the run's own hit expectation notices
    finally:
        BlockContents.digests = original  # type: ignore[method-assign]


def test_identities_follow_every_earlier_token_and_the_namespace() -> None:
    ids = PrefixIdentities()
    a = ids.of("a", "", [1, 2, 3, 4])
    assert ids.of("b", "", [9, 2, 3, 4])[1:] != a[1:]  # another first token: every later position differs
    assert ids.of("c", "", [1, 2, 3, 4]) == a  # the same prefix, another request: the same
    assert ids.of("d", namespace_of("tenant", None), [1, 2, 3, 4])[0] != a[0]
    image = namespace_of(None, None, items=[("img", 2)])
    with_image = ids.of("e", image, [1, 2, 3, 4])
    assert with_image[:2] == a[:2] and with_image[2] != a[2]  # an image changes what follows it only
    # Tokens that change mid-way (a rollback) are redone from there, the rest kept.
    assert ids.of("a", "", [1, 2, 7, 8]) == ids.of("f", "", [1, 2, 7, 8])
    assert ids.of("a", "", [1, 2, 7, 8])[:2] == a[:2]
    assert ids.of("a", "", [1, 2]) == a[:2]  # a shorter view of the same tokens


def test_a_block_copied_twice_keeps_each_copy_its_own_identity() -> None:
    """Two copy-on-write copies of one block, then a write into one copy:
    the other still holds what it was copied as (a shared record once made
    a request's own KV read as another prefix's)."""

    class Copy:
        def __init__(self, src: int, dst: int) -> None:
            self.src_block_id, self.dst_block_id = src, dst

    class Cached:
        req_ids, new_block_ids, resumed_req_ids = (), (), ()

    class Output:
        scheduled_new_reqs = ()
        scheduled_cached_reqs = Cached()
        kv_cache_block_copies = (Copy(1, 2), Copy(1, 3))

    contents = BlockContents([4], [True], null_block_id=0)
    contents.tables["a"] = [[1]]
    contents.write("a", 0, 4, 1, [5, 6, 7, 8])
    contents.take_tables(Output())
    contents.tables["b"] = [[3]]
    contents.write("b", 0, 4, 2, [9, 6, 7, 8])
    assert contents.unwritten(2, 0, range(4), [5, 6, 7, 8], contents.digests("a", [5, 6, 7, 8])) == []
