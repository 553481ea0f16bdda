"""FlashInfer multi-item metadata, built on the CPU, reproduces the reference mask exactly."""

import numpy as np
from score_batch.engine.attention.flashinfer_plan import build_metadata, kernel_mask, pack_item_positions
from score_batch.engine.batching import collate
from score_batch.engine.packing import ItemRef, attention_mask, mis_pack, single_pack


def _pack(query_len, item_lens):
    items = [[7] * n for n in item_lens]
    return mis_pack([3] * query_len, items, [ItemRef(0, i) for i in range(len(items))], 99)


def test_item_positions_restart_at_every_delimiter():
    assert pack_item_positions(_pack(3, [2, 0, 3])).tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 0]


def test_kernel_mask_equals_reference_on_rows_that_matter():
    for query_len, item_lens in [(1, [1]), (3, [2, 0, 3]), (5, [4, 4, 1, 7]), (2, [])]:
        pack = _pack(query_len, item_lens)
        reference = attention_mask(pack.segments, pack.positions)
        kernel = kernel_mask(pack.prefix_len, pack_item_positions(pack), len(pack))
        # Delimiter rows are never read: compare query and item rows, and every column they may see.
        rows = pack.segments != -2
        assert (kernel[rows] == reference[rows]).all(), (query_len, item_lens)


def test_metadata_of_a_batch():
    packs = [_pack(3, [2, 1]), _pack(2, [4])]
    meta = build_metadata(collate(packs))
    assert meta.qo_indptr.tolist() == [0, len(packs[0]), len(packs[0]) + len(packs[1])]
    assert meta.kv_indices.tolist() == list(range(len(packs[0]) + len(packs[1])))
    assert meta.prefix_len.tolist() == [3, 2]
    assert meta.max_item_len.tolist() == [2, 4]
    width = meta.token_pos_in_items_len
    assert width == 6
    rows = meta.token_pos_in_items.reshape(2, width)
    assert rows[0].tolist() == [0, 1, 2, 0, 1, 0] and rows[1].tolist() == [0, 1, 2, 3, 4, 0]
    assert meta.token_pos_in_items.dtype == np.uint16 and meta.prefix_len.dtype == np.uint32


def test_vectorized_metadata_equals_a_per_token_count_on_random_batches():
    rng = np.random.default_rng(0)
    for _ in range(20):
        packs = [
            _pack(int(rng.integers(1, 9)), [int(n) for n in rng.integers(0, 6, size=rng.integers(0, 5))])
            if rng.random() < 0.8
            else single_pack([3] * int(rng.integers(1, 7)), ItemRef(1, 0))
            for _ in range(int(rng.integers(1, 6)))
        ]
        meta = build_metadata(collate(packs))
        rows = meta.token_pos_in_items.reshape(len(packs), meta.token_pos_in_items_len)
        for i, (row, pack) in enumerate(zip(rows, packs)):
            expected, count = [], 0
            for segment in pack.segments[pack.prefix_len :]:  # the plain loop the kernel's rule describes
                count = 0 if segment == -2 else count + 1
                expected.append(count)
            assert row.tolist() == expected + [0] * (len(row) - len(expected))
            assert row.max(initial=0) == meta.max_item_len[i]
