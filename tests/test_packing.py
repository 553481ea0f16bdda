"""Packing layout, split runs and the multi-item mask: pure functions, no model."""

import numpy as np
import pytest

from score_batch.engine.plan.packing import (
    ItemRef,
    attention_mask,
    mis_pack,
    single_pack,
    split_items,
)

D = 99


def mis_pack_length(query_len: int, item_lens: list[int]) -> int:
    """Length of the MIS pack of a query and items (docs/semantics.md): q + sum(items) + a delimiter per item + 1."""
    return query_len + sum(item_lens) + len(item_lens) + 1


def test_mis_pack_layout_matches_semantics():
    pack = mis_pack([1, 2, 3], [[10, 11], [], [20]], [ItemRef(0, i) for i in range(3)], D)
    assert pack.token_ids.tolist() == [1, 2, 3, D, 10, 11, D, D, 20, D]
    assert pack.positions.tolist() == [0, 1, 2, 2, 3, 4, 2, 2, 3, 2]
    assert pack.segments.tolist() == [-1, -1, -1, -2, 0, 0, -2, -2, 2, -2]
    # item 0 ends at row 5; the empty item scores at the query's last token; item 2 at row 8
    assert pack.score_rows.tolist() == [5, 2, 8]
    assert pack.prefix_len == 3
    assert len(pack) == mis_pack_length(3, [2, 0, 1])


def test_mis_pack_needs_a_query():
    with pytest.raises(ValueError):
        mis_pack([], [[1]], [ItemRef(0, 0)], D)


def test_single_pack_is_plain_causal():
    pack = single_pack([5, 6, 7], ItemRef(0, 0))
    assert pack.positions.tolist() == [0, 1, 2]
    assert pack.score_rows.tolist() == [2]
    mask = attention_mask(pack.segments, pack.positions)
    assert (mask == np.tril(np.ones((3, 3), dtype=bool))).all()


def test_mask_items_see_query_and_own_past_only():
    pack = mis_pack([1, 2], [[10, 11], [20, 21]], [ItemRef(0, 0), ItemRef(0, 1)], D)
    mask = attention_mask(pack.segments, pack.positions)
    # rows: 0 q0, 1 q1, 2 D, 3 a0, 4 a1, 5 D, 6 b0, 7 b1, 8 D
    expected_visible = {
        0: [0],
        1: [0, 1],
        2: [0, 1],
        3: [0, 1, 3],
        4: [0, 1, 3, 4],
        5: [0, 1],
        6: [0, 1, 6],
        7: [0, 1, 6, 7],
        8: [0, 1],
    }
    for row, cols in expected_visible.items():
        assert np.flatnonzero(mask[row]).tolist() == cols, row


def test_mask_sliding_window_uses_reference_positions():
    pack = mis_pack([1, 2, 3, 4], [[10, 11, 12]], [ItemRef(0, 0)], D)
    mask = attention_mask(pack.segments, pack.positions, sliding_window=3)
    # item token at position 6 (row 7) sees positions 4..6 of its reference sequence: none of the query
    assert np.flatnonzero(mask[7]).tolist() == [5, 6, 7]
    # item token at position 4 (row 5) sees positions 2, 3 (query rows 2, 3) and itself
    assert np.flatnonzero(mask[5]).tolist() == [2, 3, 5]


def test_split_items_respects_limit_and_order():
    runs = split_items(10, [5, 5, 5, 5], max_pack_tokens=24)
    assert runs == [[0, 1], [2, 3]]
    for run in runs:
        assert mis_pack_length(10, [5] * len(run)) <= 24
    assert split_items(10, [], 24) == []


def test_split_items_is_the_greedy_split_on_random_lengths():
    """Each run takes items in order while its pack fits (a plain loop as the reference), zero-length items
    and exact fits included."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        query, limit = int(rng.integers(1, 40)), int(rng.integers(45, 120))
        lens = rng.integers(0, limit - query - 1, int(rng.integers(0, 25))).tolist()
        want, run, length = [], [], query + 1
        for index, n in enumerate(lens):
            if run and length + n + 1 > limit:
                want.append(run)
                run, length = [], query + 1
            run.append(index)
            length += n + 1
        want += [run] if run else []
        assert split_items(query, lens, limit) == want
        assert all(mis_pack_length(query, [lens[i] for i in r]) <= limit for r in want)


def test_split_items_rejects_item_that_cannot_fit():
    with pytest.raises(ValueError):
        split_items(10, [20], max_pack_tokens=24)
