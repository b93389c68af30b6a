"""The block-contents model (fuzz/adapter/_contents.py) on hand-made steps:
what it records, and what it then reports as unwritten.

The model is fed what a worker sees; these tests hand it SchedulerOutput
look-alikes (only the fields it reads) so each rule is shown on its own.
"""

from __future__ import annotations

from types import SimpleNamespace

from fuzz.adapter._contents import (
    COPIED_BEFORE_FILL, COPIED_FROM_COPY, FAILED_LOAD, BlockContents, checkpoint_params, namespace_of,
    namespace_within, prefill_checkpoint, read_positions, records_state,
)

NULL = 0
TOKENS = list(range(100, 132))  # every request's tokens, unless a test says otherwise


def _out(new=(), cached=(), copies=(), finished=()):  # type: ignore[no-untyped-def]
    """new: (request id, per-group block ids); cached: (request id, new block ids or None, resumed)."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, block_ids=ids) for r, ids in new],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[r for r, _, _ in cached],
            new_block_ids=[ids for _, ids, _ in cached],
            resumed_req_ids={r for r, _, resumed in cached if resumed},
        ),
        kv_cache_block_copies=[SimpleNamespace(src_block_id=s, dst_block_id=d) for s, d in copies],
        finished_req_ids=set(finished),
    )


def _contents(*block_sizes: int) -> BlockContents:
    return BlockContents(block_sizes, [True] * len(block_sizes), NULL)


def test_a_computed_prefix_is_held_and_read_back() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1, 2],))]))
    c.write("a", 0, 7, step=1, tokens=TOKENS)
    assert c.unread("a", 7, 7, [("full", 0)]) == []
    assert c.unbacked_entries([(0, 1, 4)]) == []  # block 1 holds positions 0-3
    # Position 7 was not computed: an entry for the first 8 tokens is ahead of it.
    assert c.unbacked_entries([(0, 2, 8)]) == [(0, 2, 8, [(7, None)])]


def test_a_table_grows_and_a_resumed_request_replaces_it() -> None:
    c = _contents(2)
    c.take_tables(_out(new=[("a", ([1],))]))
    c.take_tables(_out(cached=[("a", ([5],), False)]))
    assert c.tables["a"] == [[1, 5]]
    c.take_tables(_out(cached=[("a", None, False)]))
    assert c.tables["a"] == [[1, 5]]
    c.take_tables(_out(cached=[("a", ([7, 8],), True)]))
    assert c.tables["a"] == [[7, 8]]
    c.forget(["a"])
    assert "a" not in c.tables


def test_a_hit_on_another_requests_block_reads_what_it_wrote() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1, 2],))]))
    c.write("a", 0, 8, step=1, tokens=TOKENS)
    c.take_tables(_out(new=[("b", ([1, 3],))]))  # b adopts block 1 (positions 0-3)
    assert c.unread("b", 4, 6, [("full", 0)]) == []
    # A table naming a fresh block for an adopted position reads nothing there.
    c.take_tables(_out(new=[("c", ([4, 3],))]))
    assert [(g, b, p) for g, b, p, _ in c.unread("c", 4, 6, [("full", 0)])] == [(0, 4, p) for p in range(4)]


def test_a_block_written_at_another_index_does_not_hold_the_position() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1, 2],))]))
    c.write("a", 4, 8, step=1, tokens=TOKENS)  # block 2 holds positions 4-7
    c.take_tables(_out(new=[("b", ([2],))]))  # b names block 2 for positions 0-3
    assert [h for *_, h in c.unread("b", 4, 6, [("full", 0)])] == [(p, 1, 100 + p) for p in (4, 5, 6, 7)]


def test_read_spans_follow_the_groups_rule() -> None:
    assert list(read_positions(("full", 0), 10, 4)) == list(range(10))
    assert list(read_positions(("window", 4), 10, 4)) == [7, 8, 9]
    assert list(read_positions(("chunk", 8), 10, 4)) == [8, 9]
    assert list(read_positions(("rswa", 3), 10, 4)) == [0, 1, 2, 3, 7, 8, 9]
    assert list(read_positions(("state", 0), 10, 4)) == []


def test_a_copy_made_before_its_source_is_filled_lacks_the_fill() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1],)), ("b", ([2],))], copies=[(1, 2)]))
    c.load(([1],), [0], 4, step=3, tokens=TOKENS)  # a's synchronous load fills block 1 in the same step
    c.settle_copies(step=3)
    missing = c.unread("b", 4, 4, [("full", 0)])
    assert [h for *_, h in missing] == [(COPIED_BEFORE_FILL, 3, None)] * 4


def test_a_copy_of_a_same_step_copy_destination_is_marked_as_such() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1],))]))
    c.write("a", 0, 4, step=1, tokens=TOKENS)
    # Step 2: 1 -> 5 and 5 -> 6, both from the contents before the step.
    c.take_tables(_out(new=[("b", ([5],)), ("c", ([6],))], copies=[(1, 5), (5, 6)]))
    c.settle_copies(step=2)
    assert c.unread("b", 4, 4, [("full", 0)]) == []
    assert [h for *_, h in c.unread("c", 4, 4, [("full", 0)])] == [(COPIED_FROM_COPY, 2, None)] * 4


def test_a_copy_of_a_copy_of_a_block_filled_in_the_step_is_marked_a_copy_of_a_copy() -> None:
    """Shrunk from a scheduler-machine campaign (a labelling gap, fixed):
    block 1 is filled in step 2 and copied 1 -> 5 before the fill, 5 -> 6 in
    the same step. 5 holds what the first copy lost (COPIED_BEFORE_FILL), and
    6, read from 5 before that copy, is a copy of a copy (COPIED_FROM_COPY),
    not a block nobody wrote: the two known same-step copy bugs, not a new
    unwritten read."""
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1],))]))
    c.write("a", 0, 2, step=1, tokens=TOKENS)
    c.take_tables(_out(new=[("b", ([5],)), ("c", ([6],))], copies=[(1, 5), (5, 6)]))
    c.write("a", 2, 4, step=2, tokens=TOKENS)  # a fills the rest of block 1 in the step
    c.settle_copies(step=2)
    assert [h for *_, h in c.unread("b", 4, 4, [("full", 0)])] == [(COPIED_BEFORE_FILL, 2, None)] * 2
    assert [h for *_, h in c.unread("c", 4, 4, [("full", 0)])] == [(COPIED_FROM_COPY, 2, None)] * 4


def test_a_copys_destination_keeps_its_own_writes() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1],))]))
    c.write("a", 0, 2, step=1, tokens=TOKENS)
    c.take_tables(_out(new=[("b", ([2],))], copies=[(1, 2)]))
    c.write("a", 2, 4, step=2, tokens=TOKENS)  # a fills the rest of its block in the same step
    c.write("b", 2, 4, step=2, tokens=TOKENS)  # and b its own copy
    c.settle_copies(step=2)
    assert c.unread("b", 4, 4, [("full", 0)]) == []


def test_an_async_load_writes_only_when_it_lands() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1, 2],))]))
    c.start_async_load("a", ([1, 2],), [0], 8, TOKENS)
    assert len(c.unbacked_entries([(0, 1, 4)])) == 1
    c.land_async_load("a", step=2, failed=False)
    assert c.unbacked_entries([(0, 1, 4), (0, 2, 8)]) == []


def test_what_a_failed_load_leaves_is_left_to_the_failed_load_claims() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1, 2],))]))
    c.load(([1, 2],), [0], 8, step=1, tokens=TOKENS, failed=[2])
    assert c.held[2][0] == (FAILED_LOAD, 1, None)
    assert c.unbacked_entries([(0, 2, 8)]) == []
    assert c.unread("a", 8, 8, [("full", 0)]) == []
    # Reads in the failing step itself are excused by block.
    c.take_tables(_out(new=[("b", ([3],))]))
    assert c.unread("b", 4, 4, [("full", 0)], failing=[3]) == []
    assert len(c.unread("b", 4, 4, [("full", 0)])) == 4


def test_a_lagging_group_is_filled_from_its_own_hit() -> None:
    c = _contents(4, 8)
    c.take_tables(_out(new=[("a", ([1, 2], [3]))]))
    c.load(([1, 2], [3]), [4, 0], 8, step=1, tokens=TOKENS)  # group 1 lags: filled from 0
    assert c.unread("a", 8, 8, [("full", 0), ("full", 0)]) == [
        (0, 1, p, None) for p in range(4)
    ]  # group 0's positions 0-3 were its local hit, which nothing here wrote
    assert c.unbacked_entries([(1, 3, 8)]) == []


def test_groups_without_per_position_kv_are_not_recorded() -> None:
    c = BlockContents((4, 4), (True, False), NULL)
    c.take_tables(_out(new=[("a", ([1], [2]))]))
    c.write("a", 0, 4, step=1, tokens=TOKENS)
    assert 2 not in c.held
    assert c.unbacked_entries([(1, 2, 4)]) == []


def test_kv_of_another_token_at_the_position_is_not_the_readers() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([1, 2],))]))
    c.write("a", 0, 8, step=1, tokens=TOKENS)
    other = TOKENS[:2] + [7] + TOKENS[3:]  # b differs from a at position 2
    c.take_tables(_out(new=[("b", ([1, 3],))]))
    # Position 2 holds another token; position 3 its own token, computed
    # after a's token at 2 (another prefix: whole-prefix contents).
    assert [(p, h) for _, _, p, h in c.unread("b", 4, 6, [("full", 0)], tokens=other)] == [
        (2, (2, 1, 102)), (3, (3, 1, 103))]
    assert c.other_prefix == {(1, 3)}
    assert c.unread("b", 4, 6, [("full", 0)], tokens=TOKENS) == []
    # A token nobody can name (an accepted draft's) is taken on trust.
    c.write("a", 0, 4, step=2, tokens=[])
    assert c.unread("b", 4, 6, [("full", 0)], tokens=other) == []


def test_a_null_block_in_the_read_span_holds_nothing() -> None:
    c = _contents(4)
    c.take_tables(_out(new=[("a", ([NULL, 2],))]))
    c.write("a", 4, 6, step=1, tokens=TOKENS)
    assert [(b, p) for _, b, p, _ in c.unread("a", 6, 6, [("full", 0)])] == [(NULL, p) for p in range(4)]
    assert c.unread("a", 6, 6, [("window", 3)]) == []  # the window reads 4-5 only


def test_an_adopted_block_the_request_no_longer_holds_is_not_foreign() -> None:
    """Pinned from a 300 s machine campaign on unmodified vLLM: r4 (no salt)
    adopts blocks 6 and 1 of a window group, waits for an async load (the
    runner holds no table for it yet), and the window leaves it only
    [0, 0, 0, 0, 8, 9]; block 1 goes, in the same step, to tenant a's r5,
    whose load writes it. Judged against the table after allocation, r4
    adopts nothing of another salt; block 6, which it keeps, would be."""
    contents = BlockContents([4], [True], null_block_id=0)
    contents.namespaces.update({"r4": "", "r5": "tenant-a", "r0": ""})
    contents.tables["r0"] = [[6]]
    contents.write("r0", 0, 4, 1, list(range(4)))
    contents.tables["r5"] = [[0, 10, 11, 12, 1]]
    contents.write("r5", 16, 20, 10, list(range(20)))
    assert contents.written_under == {6: "", 1: "tenant-a"}
    adopted = [[0, 0, 6, 1]]
    assert contents.foreign_blocks("r4", adopted, [[0, 0, 0, 0, 8, 9]]) == []
    # No table known: every adopted block is judged (the rule before).
    assert contents.foreign_blocks("r4", adopted) == [(0, 1, "tenant-a")]
    # A block the request keeps is judged.
    contents.written_under[6] = "tenant-b"
    assert contents.foreign_blocks("r4", adopted, [[0, 0, 6, 0, 8, 9]]) == [(0, 6, "tenant-b")]


def test_an_image_is_a_namespace_from_its_placeholder_on() -> None:
    """vLLM folds an image into the hash of every block its placeholder
    overlaps and chains the rest on it: a prefix ending at or before the
    placeholder's start stands under no image, one past it under the image."""
    ns = namespace_of("tenant-a", None, None, [("image-b", 9), ("image-a", 2)])
    assert ns == "tenant-a+mm:image-a@2+mm:image-b@9"
    assert namespace_within(ns, 2) == "tenant-a"
    assert namespace_within(ns, 3) == "tenant-a+mm:image-a@2"
    assert namespace_within(ns, 10) == ns


def test_a_hit_is_judged_by_the_images_placed_before_its_end() -> None:
    """r0 wrote blocks 5 and 6 (4 tokens each) with an image at position 6;
    r1 sends the same tokens without it. A hit of 4 tokens (block 5) reads
    nothing of the image and crosses no namespace; a partial hit of 6
    tokens that adopts block 6 ends at the placeholder and crosses none
    either; a hit of 8 reads the image's first positions and crosses."""
    contents = BlockContents([4], [True], null_block_id=0)
    contents.namespaces.update({"r0": namespace_of(None, None, None, [("image-a", 6)]), "r1": ""})
    contents.tables["r0"] = [[5, 6]]
    contents.write("r0", 0, 8, 1, list(range(8)))
    assert contents.foreign_blocks("r1", [[5]], hit=4) == []
    assert contents.foreign_blocks("r1", [[5, 6]], hit=6) == []
    assert contents.foreign_blocks("r1", [[5, 6]], hit=8) == [(0, 6, "mm:image-a@6")]
    # Whole blocks when the hit is not known.
    assert contents.foreign_blocks("r1", [[5, 6]]) == [(0, 6, "mm:image-a@6")]


def test_a_block_a_same_step_load_refills_is_judged_by_its_new_writer() -> None:
    """Pinned from a 300 s machine campaign on unmodified vLLM: block 3,
    last written for tenant a, is allocated to unsalted r3 whose sync load
    fills it; vLLM caches it in that schedule(), and unsalted r4 adopts it
    in the same step. Judged after the step's loads (as the harness does),
    r4's hit is within its namespace; judged before, it would be blamed on
    the block's previous tenant."""
    contents = BlockContents([3], [True], null_block_id=0)
    contents.namespaces.update({"r3": "", "r4": ""})
    contents.written_under[3] = "tenant-a"
    assert contents.foreign_blocks("r4", [[3]], [[3, 1]]) == [(0, 3, "tenant-a")]
    contents.load([[3, 4]], [0], 3, 6, list(range(4)), request_id="r3")
    assert contents.written_under[3] == ""
    assert contents.foreign_blocks("r4", [[3]], [[3, 1]]) == []


def test_a_hit_after_a_reset_is_judged_on_the_offsets_it_reads() -> None:
    """Shrunk from a scheduler-machine campaign (a harness misfit of
    hits-after-reset, fixed): block 7 held 12 positions for a 12-token group
    before a reset; reused by a 4-token group after it, it keeps the old
    offsets past 3. A hit adopting it at table index 11 reads positions
    44-47 only, all written after the reset; the stale offset 4 is not read."""
    c = _contents(4, 12)
    c.take_tables(_out(new=[("a", ([1], [6, 7]))]))
    c.write("a", 0, 17, step=1, tokens=list(range(17)))  # block 7 (group 1) holds 12..16 at offsets 0..4
    c.forget(["a"])
    c.take_tables(_out(new=[("b", ([9] * 11 + [7], [8, 9, 10, 11]))]))
    c.write("b", 44, 48, step=16, tokens=list(range(48)))  # block 7 (group 0) now holds 44..47 at 0..3
    adopted = ([2] * 11 + [7], [])
    assert c.written_before(adopted, 48, step=8) == [], "a stale offset past the group's block was judged"
    # A reset after the write: every position the hit reads predates it.
    assert c.written_before(adopted, 48, step=17) == [(0, 7, p, 16) for p in range(44, 48)]
    # A hit of 46 tokens reads 44 and 45 only.
    assert c.written_before(adopted, 46, step=17) == [(0, 7, 44, 16), (0, 7, 45, 16)]


def test_a_recurrent_state_lands_at_its_chunk_end_and_is_read_at_the_next_start() -> None:
    """A Mamba group of 4-token blocks: a chunk [0, 6) leaves the state at 6
    in the table's block 1 (cdiv(6, 4) - 1) and none in block 0; the next
    chunk reads the state at 6 there; a request resuming at 4 from block 0
    reads nothing; a copy carries the state, a failed load is left out."""
    contents = BlockContents([4], [False], null_block_id=0, whole_state=[True])
    contents.tables["r"] = [[0, 7]]
    tokens = list(range(20))
    contents.write("r", 0, 6, step=1, tokens=tokens)
    assert contents.states == {7: (6, 1, tuple(range(6)))}
    assert contents.unread_states("r", 6, tokens) == []
    assert contents.unread_states("r", 4, tokens) == [(0, 0, 4, None)]
    # Another request's tokens: the state there is not its state.
    other = [99, *range(1, 20)]
    assert contents.unread_states("r", 6, other) == [(0, 7, 6, (6, 1, None))]
    # A state at another position than the reader's start.
    contents.write("r", 6, 7, step=2, tokens=tokens)
    assert contents.unread_states("r", 6, tokens) == [(0, 7, 6, (7, 2, None))]
    # The index: an entry for 8 tokens naming block 7 lacks its state.
    assert contents.unbacked_entries([(0, 7, 8)]) == [(0, 7, 8, [(8, (7, 2, None))])]
    assert contents.unbacked_entries([(0, 7, 7)]) == []
    # A load into blocks the worker fails holds nothing it can name: left out.
    contents.load([[0, 0, 9]], [8], 12, step=3, tokens=tokens, failed={9})
    contents.tables["s"] = [[0, 0, 9]]
    assert contents.states[9][0] == FAILED_LOAD and contents.unread_states("s", 12, tokens) == []


def test_a_state_is_recorded_only_where_the_model_follows_the_runner() -> None:
    """Align mode, no speculation, no speculative or checkpoint blocks, and
    the Mamba block is cache_config.block_size (as the engine builds it)."""
    spec = SimpleNamespace(block_size=4, mamba_cache_mode="align", num_speculative_blocks=0,
                           num_prefill_checkpoint_blocks=0)
    assert records_state(("state", 0), spec, False, 4)
    assert not records_state(("full", 0), spec, False, 4)
    assert not records_state(("state", 0), spec, True, 4)
    assert not records_state(("state", 0), spec, False, 1)
    assert not records_state(("state", 0), SimpleNamespace(**{**vars(spec), "num_speculative_blocks": 2}), False, 4)


def test_a_prefill_checkpoint_lands_where_the_worker_puts_it() -> None:
    """Mamba2 exports a state from inside a prefill chunk: for a chunk
    [0, 10) of 4-token blocks (checkpoint alignment 1, hash and hit
    alignment 4) the state at 8 (the last boundary that leaves a token to
    compute) lands in column cdiv(10, 4) - 2 = 1, beside the state at 10 in
    column 2. A chunk the boundary is not inside exports none."""
    assert prefill_checkpoint(0, 10, 4, 1, 4, 4) == (8, 1)
    assert prefill_checkpoint(8, 10, 4, 1, 4, 4) is None  # 8 is not inside (8, 10)
    assert prefill_checkpoint(0, 8, 4, 1, 4, 4) == (4, 0)  # the last boundary before 8 is 4, in column 0
    assert prefill_checkpoint(1, 8, 4, 1, 4, 4) is None  # a chunk starting off a hash boundary
    spec = SimpleNamespace(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
    contents = BlockContents([4], [False], null_block_id=0, whole_state=[True],
                             checkpoints=[checkpoint_params(spec, 4, None)])
    contents.tables["r"] = [[0, 6, 7]]
    tokens = list(range(12))
    contents.write("r", 0, 10, step=1, tokens=tokens)
    assert contents.states == {6: (8, 1, tuple(range(8))), 7: (10, 1, tuple(range(10)))}
    assert contents.unread_states("r", 8, tokens) == [] and contents.unbacked_entries([(0, 6, 8)]) == []



def test_a_failed_state_block_stays_failed_until_its_recompute_reaches_the_block_end() -> None:
    """A sync load of 9 tokens fails into the Mamba group's block of column
    2 (3-token blocks); under the recompute policy vLLM keeps it cached under
    the 9-token key. Recompute chunks ending at 7 and 8 leave it failed (the
    failed-load claims judge it), the one ending at 9 fills it."""
    contents = BlockContents([3], [False], null_block_id=0, whole_state=[True])
    contents.tables["r"] = [[0, 0, 5]]
    tokens = list(range(12))
    contents.load([[0, 0, 5]], [0], 9, step=1, tokens=tokens, failed={5})
    for end in (7, 8):
        contents.write("r", end - 1, end, step=end - 5, tokens=tokens)
        assert contents.states[5][0] == FAILED_LOAD and contents.unbacked_entries([(0, 5, 9)]) == []
    contents.write("r", 8, 9, step=4, tokens=tokens)
    assert contents.states[5] == (9, 4, tuple(range(9))) and contents.unbacked_entries([(0, 5, 9)]) == []
