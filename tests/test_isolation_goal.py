"""The sharp isolation check at the goal shape on the CPU, over the reference mask (sdpa, float32): a 1,500-token
query with 100 items of 40 tokens; changing one item moves no other item's score or pooled vector (≤ 1e-6), and
a planted leak of one key fails the check. tests/gpu/test_isolation.py runs the same check on FlashInfer."""

from __future__ import annotations

import numpy as np

import score_batch.engine.attention.sdpa as sdpa
from score_batch.engine.attention.flashinfer_plan import build_metadata, kernel_mask
from score_batch.engine.plan.batching import collate
from score_batch.engine.plan.packing import DELIMITER_SEGMENT, ItemRef, mis_pack
from tests.isolation import BOUND, QUERY_TOKENS, goal_groups, isolation, leak_one_key, leaked_key, scorer

D = 99  # the delimiter token id


def test_one_item_changed_moves_no_other_and_a_planted_one_key_leak_fails_the_check(zoo, monkeypatch):
    # two layers: a key leaked into an item's first row reaches the item's last row (its score) in the next layer
    run = scorer(zoo.get("qwen3", "causal", num_hidden_layers=2), "cpu", "float32", "sdpa")
    changed = 49  # the middle item
    diffs = isolation(run, changed)
    assert diffs["own"] > 1e-4  # the changed item's own score moves
    assert diffs["scores"] <= BOUND and diffs["pooled"] <= BOUND, diffs
    row, key = leaked_key(changed)
    reference_mask = sdpa.pack_mask

    def leaky(pack, sliding_window=None):
        mask = reference_mask(pack, sliding_window).copy()
        assert pack.prefix_len == QUERY_TOKENS and not mask[row, key]  # the reference masks that key
        mask[row, key] = True
        return mask

    monkeypatch.setattr(sdpa, "pack_mask", leaky)
    leaked = isolation(run, changed)
    print(f"isolation at the goal shape: clean {diffs}, one key leaked {leaked}")
    assert leaked["scores"] > BOUND and leaked["pooled"] > BOUND, leaked  # the check catches one key


def test_the_leak_the_gpu_test_plants_is_one_item_key_under_flashinfers_kernel_rule():
    """tests/gpu/test_isolation.py plants its leak in the plan's token_pos_in_items: under the kernel's rule that
    adds exactly the leaked key of the changed item (and the delimiter before the row, which sees the query only)."""
    changed = 49
    groups = goal_groups()
    pack = mis_pack(
        list(groups[0].query), [list(i) for i in groups[0].items], [ItemRef(0, i) for i in range(100)], D
    )
    meta = build_metadata(collate([pack]))
    clean = kernel_mask(int(meta.prefix_len[0]), meta.token_pos_in_items, len(pack.token_ids))
    leaky_meta = leak_one_key(meta, changed)
    leaky = kernel_mask(int(meta.prefix_len[0]), leaky_meta.token_pos_in_items, len(pack.token_ids))
    row, key = leaked_key(changed)
    assert (
        sorted(zip(*np.nonzero(leaky & ~clean))) == [(row, key), (row, row - 1)]
        and not (clean & ~leaky).any()
    )
    assert (
        pack.segments[key] == 49 and pack.segments[row] == 50 and pack.segments[row - 1] == DELIMITER_SEGMENT
    )
