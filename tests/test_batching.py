"""Ragged batching under a token budget: no padding, every pack exactly once, rows shifted."""

import numpy as np

from score_batch.engine.plan.batching import collate, make_batches
from score_batch.engine.plan.packing import ItemRef, mis_pack


def _packs():
    return [
        mis_pack([1] * q, [[2] * n for n in items], [ItemRef(g, i) for i in range(len(items))], 9)
        for g, (q, items) in enumerate([(3, [2, 2]), (5, [1]), (2, [4, 4, 4]), (7, [])])
    ]


def test_batches_respect_budget_and_keep_every_pack():
    packs = _packs()
    for budget in (1, 8, 16, 1000):
        batches = make_batches(packs, budget)
        seen = sorted(ref for b in batches for ref in b.item_refs)
        assert seen == sorted(ref for p in packs for ref in p.item_refs)
        for batch in batches:
            assert batch.num_tokens <= budget or len(batch.packs) == 1
            assert batch.num_tokens == sum(len(p) for p in batch.packs)


def test_collate_shifts_score_rows_and_marks_packs():
    packs = _packs()[:2]
    batch = collate(packs)
    assert batch.cu_seqlens.tolist() == [0, len(packs[0]), len(packs[0]) + len(packs[1])]
    expected = np.concatenate([packs[0].score_rows, packs[1].score_rows + len(packs[0])])
    assert batch.score_rows.tolist() == expected.tolist()
    assert batch.pack_index.tolist() == [0] * len(packs[0]) + [1] * len(packs[1])
