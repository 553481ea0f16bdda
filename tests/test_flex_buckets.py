"""Compiled flex: bucketed token counts bound the compilations; padded batches equal the sdpa reference."""

from __future__ import annotations

import random

import pytest
import torch
from torch._dynamo.utils import counters

from score_batch.engine.attention.flex import FLEX_BLOCK_SIZE, FlexBackend, bucket_tokens
from score_batch.engine.attention.sdpa import SdpaBackend
from score_batch.engine.plan.batching import collate
from score_batch.engine.plan.packing import ItemRef, mis_pack, single_pack


def test_buckets_are_block_multiples_with_bounded_padding():
    buckets = {bucket_tokens(n) for n in range(1, 65_537)}
    for n in range(1, 65_537, 7):
        bucket = bucket_tokens(n)
        assert bucket >= n and bucket % FLEX_BLOCK_SIZE == 0
        assert bucket - n < max(FLEX_BLOCK_SIZE, n / 4)
    assert len(buckets) == 32  # every batch up to 65,536 tokens compiles for at most 32 lengths
    assert sorted(buckets)[:4] == [128, 256, 384, 512]


def _batch(rng: random.Random, num_tokens: int):
    """Random MIS packs (plus a single-item pack) adding up to about num_tokens tokens."""
    packs = [single_pack([5] * rng.randint(1, 6), ItemRef(0, 0))]
    while sum(len(p) for p in packs) < num_tokens - 12:
        items = [[7] * rng.randint(0, 5) for _ in range(rng.randint(1, 4))]
        packs.append(mis_pack([3] * rng.randint(1, 8), items, [ItemRef(1, i) for i in range(len(items))], 9))
    return collate(packs)


@pytest.mark.slow
@pytest.mark.usefixtures("compiling")
def test_compiled_flex_over_20_batch_sizes_compiles_per_bucket_at_most():
    rng = random.Random(0)
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    flex, sdpa = FlexBackend(cpu, compile=True), SdpaBackend(cpu)
    batches = [_batch(rng, 20 + 23 * i) for i in range(20)]
    sizes = {b.num_tokens for b in batches}
    buckets = {bucket_tokens(n) for n in sizes}
    assert len(sizes) == 20 and buckets == {128, 256, 384, 512}
    before = counters["stats"]["unique_graphs"]
    for batch in batches:
        n = batch.num_tokens
        query = torch.randn(1, 4, n, 16)  # [1, heads, tokens, head_dim]
        key, value = torch.randn(2, 1, 2, n, 16).unbind(0)  # [1, kv_heads, tokens, head_dim]: GQA
        expected = sdpa.plan(batch, cpu).attend(query, key, value, None, None)
        output = flex.plan(batch, cpu).attend(query, key, value, None, None)
        rows = torch.from_numpy(batch.segments != -2)  # delimiter rows are never read
        assert output.shape == expected.shape == (1, n, 4, 16)
        assert (output - expected)[:, rows].abs().max() <= 1e-5
    compiles = counters["stats"]["unique_graphs"] - before
    # Two compiled functions (block-mask construction and attention), each compiled at most once per bucket.
    assert compiles <= 2 * len(buckets), compiles
