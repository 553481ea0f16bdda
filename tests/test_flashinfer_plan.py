"""FlashInfer multi-item metadata, built on the CPU, reproduces the reference mask exactly."""

import numpy as np
import pytest

from score_batch.engine.attention.flashinfer_plan import build_metadata, kernel_mask, pack_item_positions
from score_batch.engine.plan.batching import collate
from score_batch.engine.plan.packing import ItemRef, attention_mask, mis_pack, single_pack


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


# Cached packs (the query computed once per group): the metadata FlashInferBackend(cache_query=True) plans.
# packing's cached_mis_pack / pack_mask come with the query-once work; these tests skip without them.


def _cached_api():
    packing = pytest.importorskip("score_batch.engine.plan.packing")
    if not hasattr(packing, "cached_mis_pack"):
        pytest.skip("engine.plan.packing has no cached packs yet")
    return packing


def _group(query_len, item_lens, key=0, seed=0):
    """(storing pack, cached pack, inline pack of the cached pack's items) of one group."""
    packing = _cached_api()
    rng = np.random.default_rng(seed)
    query = [int(t) for t in rng.integers(1, 50, size=query_len)]
    first = [[7] * 2]
    items = [[int(t) for t in rng.integers(1, 50, size=n)] for n in item_lens]
    refs = [ItemRef(key, i) for i in range(len(items))]
    storing = packing.mis_pack(query, first, [ItemRef(key, 99)], 99, query_key=key)
    cached = packing.cached_mis_pack(query_len, items, refs, 99, key)
    return storing, cached, packing.mis_pack(query, items, refs, 99)


def _request(meta, i):
    """(prefix_len, token_pos_in_items row, qo_len, kv pages) of request i."""
    width = meta.token_pos_in_items_len
    qo = meta.qo_indptr[i + 1] - meta.qo_indptr[i]
    pages = meta.kv_indices[meta.kv_indptr[i] : meta.kv_indptr[i + 1]]
    return int(meta.prefix_len[i]), meta.token_pos_in_items[i * width : (i + 1) * width], int(qo), pages


def test_cached_pack_kernel_mask_equals_the_reference_mask():
    packing = _cached_api()
    for query_len, item_lens in [(1, [1]), (3, [2, 1, 3]), (5, [4, 4, 1, 7]), (9, [1])]:
        storing, cached, _ = _group(query_len, item_lens)
        for batch_packs, index in (([storing, cached], 1), ([cached], 0)):  # same batch, a later batch
            meta = build_metadata(collate(batch_packs))
            prefix, positions, qo, pages = _request(meta, index)
            assert prefix == query_len and qo == len(cached) and len(pages) == query_len + len(cached)
            kernel = kernel_mask(prefix, positions, qo, len(pages))  # [len, q + len]
            reference = packing.pack_mask(cached)  # [len, q + len]
            rows = cached.segments != -2
            assert (kernel[rows] == reference[rows]).all(), (query_len, item_lens)


def test_cached_pack_pages_point_at_the_storing_pack_or_at_appended_cache_pages():
    storing, cached, _ = _group(4, [2, 3])
    other_storing, other_cached, _ = _group(3, [1], key=1)
    same = build_metadata(collate([storing, cached]))
    assert same.cached == () and same.pages == len(storing) + len(cached)
    assert same.kv_indices[len(storing) :][:4].tolist() == [0, 1, 2, 3]  # the storing pack's query rows
    assert [(s.key, s.start, s.length) for s in same.stored] == [(0, 0, 4)]
    later = build_metadata(collate([cached, other_cached, cached]))
    tokens = 2 * len(cached) + len(other_cached)
    assert [(c.key, c.first_page, c.length) for c in later.cached] == [(0, tokens, 4), (1, tokens + 4, 3)]
    assert later.pages == tokens + 7 and later.stored == ()
    first, third = later.kv_indices[: 4 + len(cached)], later.kv_indices[-(4 + len(cached)) :]
    assert first[:4].tolist() == third[:4].tolist() == list(range(tokens, tokens + 4))  # one copy per key
    assert later.kv_indptr.tolist() == [
        0,
        4 + len(cached),
        7 + len(cached) + len(other_cached),
        len(later.kv_indices),
    ]


def _masked_attention(q, k, v, mask):
    scores = q @ k.T / np.sqrt(q.shape[-1])
    scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def test_cached_pages_under_the_kernel_rule_give_the_inline_packs_attention():
    """A numpy model of the kernel (gather pages, kernel_mask, softmax) on a batch with cached packs equals
    the inline pack's attention under the reference mask on every non-delimiter row."""
    packing = _cached_api()
    rng = np.random.default_rng(1)
    storing, cached, inline = _group(6, [3, 1, 4], seed=2)
    for batch_packs, index in (([storing, cached], 1), ([cached], 0)):
        batch = collate(batch_packs)
        meta = build_metadata(batch)
        d = 8
        q_rows, k_rows, v_rows = (rng.standard_normal((batch.num_tokens, d)) for _ in range(3))
        query_kv = rng.standard_normal((2, 6, d))  # the group's query K/V (the storing pack's rows)
        if index == 1:
            k_rows[:6], v_rows[:6] = query_kv
        k_pages, v_pages = (np.zeros((meta.pages, d)) for _ in range(2))
        k_pages[: batch.num_tokens], v_pages[: batch.num_tokens] = k_rows, v_rows
        for entry in meta.cached:  # what the plan copies from the QueryCache in every layer
            k_pages[entry.first_page : entry.first_page + entry.length] = query_kv[0]
            v_pages[entry.first_page : entry.first_page + entry.length] = query_kv[1]
        prefix, positions, qo, pages = _request(meta, index)
        start = meta.qo_indptr[index]
        got = _masked_attention(
            q_rows[start : start + qo],
            k_pages[pages],
            v_pages[pages],
            kernel_mask(prefix, positions, qo, len(pages)),
        )
        # The inline pack: the same query K/V in front of the cached pack's own rows.
        inline_k = np.concatenate([query_kv[0], k_rows[start : start + qo]])
        inline_v = np.concatenate([query_kv[1], v_rows[start : start + qo]])
        inline_q = np.concatenate([np.zeros((6, d)), q_rows[start : start + qo]])
        mask = packing.attention_mask(inline.segments, inline.positions)
        expected = _masked_attention(inline_q, inline_k, inline_v, mask)[6:]
        rows = cached.segments != -2
        assert np.allclose(got[rows], expected[rows]), index


class _RecordingWrapper:
    """plan/run of BatchPrefillWithPagedKVCacheWrapper that records the paged K/V each layer runs with."""

    def __init__(self):
        self.plans, self.pages = [], []

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, *args, **kwargs):
        self.plans.append((qo_indptr.tolist(), kv_indptr.tolist(), kv_indices.tolist()))

    def run(self, q, paged_kv_cache, out=None):
        self.pages.append(tuple(t.clone() for t in paged_kv_cache))
        return out


class _DictCache:
    """QueryCache's put/get (engine/attention/query_cache.py)."""

    def __init__(self):
        self.entries = {}

    def put(self, key, layer, value):
        self.entries[(key, layer)] = value

    def get(self, key, layer):
        return self.entries[(key, layer)]


def test_plan_puts_the_storing_packs_query_and_copies_it_into_a_later_batchs_pages():
    import torch

    from score_batch.engine.attention.flashinfer import FlashInferPlan

    storing, cached, _ = _group(4, [2, 3])
    cache, cpu = _DictCache(), torch.device("cpu")
    first, second = collate([storing]), collate([cached])
    wrapper = _RecordingWrapper()
    kv = {}
    for batch in (first, second):
        plan = FlashInferPlan(wrapper, build_metadata(batch), cpu, query_cache=cache)
        n = batch.num_tokens
        for layer in range(2):
            q = torch.randn(1, 4, n, 8)  # [1, heads, tokens, head_dim]
            k, v = torch.randn(2, 1, 2, n, 8).unbind(0)  # [1, kv_heads, tokens, head_dim]
            kv[(batch is first, layer)] = (k, v)
            plan.attend(q, k, v, None, None, layer=layer)
    assert sorted(cache.entries) == [(0, 0), (0, 1)]
    for layer in range(2):
        stored_k, stored_v = cache.get(0, layer)  # [q, 1, kv_heads, head_dim] copies
        k, v = kv[(True, layer)]
        assert torch.equal(stored_k[:, 0], k[0, :, :4].transpose(0, 1))
        assert torch.equal(stored_v[:, 0], v[0, :, :4].transpose(0, 1))
        pages_k, pages_v = wrapper.pages[2 + layer]  # the cached batch: own pages, then the query's
        own_k, own_v = kv[(False, layer)]
        assert pages_k.shape[0] == len(cached) + 4
        assert torch.equal(pages_k[: len(cached), 0], own_k[0].transpose(0, 1))
        assert torch.equal(pages_v[: len(cached), 0], own_v[0].transpose(0, 1))
        assert torch.equal(pages_k[len(cached) :], stored_k) and torch.equal(pages_v[len(cached) :], stored_v)
    assert wrapper.plans[1][2][:4] == list(range(len(cached), len(cached) + 4))  # query pages first


def test_backend_refuses_cached_packs_unless_turned_on():
    import torch

    from score_batch.engine.attention import flashinfer as fi

    _, cached, _ = _group(3, [1])
    backend = object.__new__(fi.FlashInferBackend)  # no flashinfer import: plan() needs none
    backend._wrapper, backend._split_kv, backend._cache_query = None, fi.SplitKv(), False
    with pytest.raises(ValueError, match="cache_query=True"):
        backend.plan(collate([cached]), torch.device("cpu"), _DictCache())
    backend._cache_query = True
    with pytest.raises(ValueError, match="QueryCache"):
        backend.plan(collate([cached]), torch.device("cpu"))
    assert backend.plan(collate([cached]), torch.device("cpu"), _DictCache())._meta.cached
    assert fi.FlashInferBackend.capabilities.cached_query is False  # what setup reads: off by default


def test_fa3_refuses_split_kv_settings_and_unknown_kernels():
    import torch

    from score_batch.engine.attention.flashinfer import SplitKv, check_kernel

    with pytest.raises(ValueError, match="one of fa2, fa3"):
        check_kernel("fa4", SplitKv(), torch.device("cpu"))
    with pytest.raises(ValueError, match="split-KV"):
        check_kernel("fa3", SplitKv(disable=True), torch.device("cpu"))
    with pytest.raises(ValueError, match="Hopper"):
        check_kernel("fa3", SplitKv(), torch.device("cpu"))
    check_kernel("fa2", SplitKv(fixed_size=512), torch.device("cpu"))


def _fa3_tile_schedule_mask(prefix, positions, qo, kv, max_item, cta_q, cta_kv):
    """The [qo, kv] mask FA3's paged multi-item mainloop applies, tile by tile (FlashInfer 0.6.6,
    hopper/prefill_sm90.cuh and mainloop_mma.cuh): KV tiles walked down from the causal end, the last
    ceil(CTA_Q / CTA_KV) + 2 with the full rule, the others with the in-bound rule (a query row whole masked)
    from tile prefix_tiles - 2 on or with none below it, and tiles between the query and
    q_tile_start - max_item_len skipped."""
    p = np.arange(qo)[:, None] + (kv - qo)  # KV position of each Q row
    k = np.arange(kv)[None, :]
    t = np.zeros((qo, 1), dtype=np.int64)
    suffix = (p >= prefix)[:, 0]
    t[suffix, 0] = positions[p[suffix, 0] - prefix]
    rule = (k < prefix) | (p < k + t)
    full = (k <= p) & ((p < prefix) | rule)
    in_bound = (p >= prefix) & rule
    got = np.zeros((qo, kv), dtype=bool)
    prefix_tiles = -(-prefix // cta_kv)
    for q_tile in range(-(-qo // cta_q)):
        rows = slice(q_tile * cta_q, min(qo, (q_tile + 1) * cta_q))
        tiles = min(-(-kv // cta_kv), -(-((q_tile + 1) * cta_q + kv - qo) // cta_kv))
        outside = max(0, q_tile * cta_q + kv - qo - max_item) // cta_kv

        def down(i, outside=outside):
            return prefix_tiles - 1 if i == outside and i >= prefix_tiles else i - 1

        modes = {tiles - 1: full}
        i, step = tiles - 1, 0
        while step < -(-cta_q // cta_kv) + 1 and i > 0:
            modes[down(i)], i, step = full, down(i), step + 1
        while i > 0:
            modes[down(i)] = in_bound if i >= prefix_tiles - 1 else np.ones_like(full)
            i = down(i)
        for tile, mode in modes.items():
            cols = slice(tile * cta_kv, min(kv, (tile + 1) * cta_kv))
            got[rows, cols] = mode[rows, cols]
    return got


def test_fa3_tile_schedule_applies_the_kernel_rule_to_our_metadata():
    """FA3's tile walk (skipped tiles, whole-row query masking in unmasked tiles) on the metadata we build,
    inline, single and cached packs, gives exactly kernel_mask for FA3's tile shapes at head_dim 128/64/256."""
    packing = _cached_api()
    rng = np.random.default_rng(3)
    for _ in range(12):  # up to 12 items of up to 120 tokens: items far past the query, so FA3 skips tiles
        q_len = int(rng.integers(1, 400))
        items = [[5] * int(n) for n in rng.integers(1, 120, size=int(rng.integers(1, 13)))]
        refs = [ItemRef(0, i) for i in range(len(items))]
        packs = [
            packing.mis_pack([3] * q_len, items, refs, 99, query_key=0),
            packing.cached_mis_pack(q_len, items, refs, 99, 0),
            single_pack([3] * int(rng.integers(1, 300)), ItemRef(1, 0)),
        ]
        meta = build_metadata(collate(packs))
        for i in range(len(packs)):
            prefix, positions, qo, pages = _request(meta, i)
            want = kernel_mask(prefix, positions, qo, len(pages))
            for cta_q, cta_kv in ((128, 96), (192, 96), (128, 32)):
                got = _fa3_tile_schedule_mask(
                    prefix, positions, qo, len(pages), int(meta.max_item_len[i]), cta_q, cta_kv
                )
                assert (got == want).all(), (q_len, [len(x) for x in items], i, cta_q, cta_kv)


class _KernelRuleWrapper:
    """BatchPrefillWithPagedKVCacheWrapper on the CPU: plan() keeps the metadata, run() attends over the gathered
    pages under kernel_mask (FlashInfer's multi-item rule), GQA heads repeated: the kernel's contract in torch."""

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, sm_scale=None, prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, **kwargs):  # fmt: skip
        assert page_size == 1 and kwargs["causal"] and kwargs["pos_encoding_mode"] == "NONE"
        self.qo, self.kv = qo_indptr.tolist(), kv_indptr.tolist()
        self.indices = kv_indices.long()
        self.scale = sm_scale if sm_scale is not None else head_dim**-0.5
        self.prefix = None if prefix_len_ptr is None else prefix_len_ptr.long().tolist()
        self.positions, self.width = token_pos_in_items_ptr, token_pos_in_items_len

    def run(self, q, paged_kv_cache, out=None):
        import torch

        k_pages, v_pages = (t[:, 0] for t in paged_kv_cache)  # [pages, kv_heads, d]
        group = q.shape[1] // k_pages.shape[1]
        for i in range(len(self.qo) - 1):
            rows = slice(self.qo[i], self.qo[i + 1])
            pages = self.indices[self.kv[i] : self.kv[i + 1]]
            qo, kv = rows.stop - rows.start, len(pages)
            if self.prefix is None:  # no multi-item arguments: plain causal
                mask = kernel_mask(kv, np.zeros(0, dtype=np.int64), qo, kv)
            else:
                positions = self.positions[i * self.width : (i + 1) * self.width].long().numpy()
                mask = kernel_mask(self.prefix[i], positions, qo, kv)
            k = k_pages[pages].repeat_interleave(group, dim=1)  # [kv, heads, d]
            v = v_pages[pages].repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q[rows].float(), k.float()) * self.scale
            scores = scores.masked_fill(~torch.from_numpy(mask)[None], float("-inf"))
            out[rows] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float()).to(out.dtype)
        return out


@pytest.mark.parametrize("batch_tokens", [65536, 130], ids=["one-batch", "later-batches"])
def test_cached_query_runs_through_the_plan_as_the_inline_packs_do(qwen3_causal, batch_tokens):
    """The whole FlashInfer path on the CPU with the kernel's rule in torch (_KernelRuleWrapper): a runner's
    plan with cached packs (the query once per group), the QueryCache puts/gets per layer, pages shared within
    a batch or copied into later ones — scores equal the same path with every query inline, and sdpa's."""
    import dataclasses

    import torch

    from score_batch.engine import EngineConfig, Scorer, ScoringConfig
    from score_batch.engine.attention import flashinfer as fi
    from tests.gpu.common import token_groups

    _cached_api()
    groups = token_groups(11, groups=2, query=(60, 90), items=12, item=(5, 20))
    scoring = ScoringConfig(label_tokens=(" to", " the"), apply_softmax=True)
    config = EngineConfig(device="cpu", dtype="float32", backend="sdpa", max_pack_tokens=128, max_batch_tokens=batch_tokens, scoring=scoring)  # fmt: skip
    reference = Scorer.from_pretrained(qwen3_causal, dataclasses.replace(config, backend="split")).score(
        groups
    )
    results = {}
    for cache_query in (False, True):
        run = Scorer.from_pretrained(qwen3_causal, config)
        backend = object.__new__(fi.FlashInferBackend)  # no flashinfer import: the wrapper is the fake
        backend._wrapper, backend._split_kv, backend._cache_query = (
            _KernelRuleWrapper(),
            fi.SplitKv(),
            cache_query,
        )
        run._runner.backend = backend
        run.planner = dataclasses.replace(run.planner, limits=dataclasses.replace(run.planner.limits, cache_query=cache_query))  # fmt: skip
        plan = run.plan(groups)
        assert any(p.query_cached for b in plan.batches for p in b.packs) is cache_query
        assert (len(plan.batches) == 1) is (batch_tokens == 65536)
        with torch.inference_mode():
            results[cache_query] = run.run(plan)
    for inline, cached, ref in zip(results[False], results[True], reference):
        assert np.abs(inline.scores - ref.scores).max() <= 1e-5  # the fake kernel is the reference mask
        assert np.abs(cached.scores - inline.scores).max() <= 1e-5
