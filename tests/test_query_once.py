"""The query computed once per group: cached packs (layout, planning, batching, the cache) and exact scores."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig
from score_batch.engine.attention.flex import FlexBackend
from score_batch.engine.attention.query_cache import QueryCache
from score_batch.engine.attention.sdpa import SdpaBackend
from score_batch.engine.attention.split import SplitBackend
from score_batch.engine.plan.batching import collate, make_batches
from score_batch.engine.plan.packing import ItemRef, cached_mis_pack, mis_pack, pack_mask, split_items
from score_batch.engine.plan.planner import PackedPlanner, PlanLimits
from tests.reference import max_abs_diff
from tests.test_scorer import LABELS, assert_matches_reference, make_scorer

D = 99
CPU = torch.device("cpu")
QUERY = "What is the capital of California? Answer yes or no for each option about the quick brown fox"
ITEMS = [
    " Sacramento",
    "",
    " San Jose",
    " San Francisco",
    " Los Angeles",
    " the lazy dog",
    " Tokyo is a city in Japan",
    "",
    " yes",
    " no",
    " maybe yes no",
    " red running shoes for women",
]
QUERY_ONCE_GROUPS = [
    Group(QUERY, ITEMS),
    Group("Tokyo is a city in", [" Japan", " the country"]),  # one pack: nothing cached
    Group("the quick brown fox jumps over the lazy dog to get to the other side", ITEMS[::-1]),
]


def _planner(cache_query: bool, max_pack_tokens: int = 24, max_batch_tokens: int = 1000) -> PackedPlanner:
    """A token-id planner (no tokenizer needed) under small pack limits; repeated items stay (layouts studied)."""
    limits = PlanLimits(max_pack_tokens, max_batch_tokens, D, 1000, cache_query=cache_query, dedupe=False)
    return PackedPlanner(None, ScoringConfig(packing="mis"), limits)


def _id_groups() -> list[Group]:
    """Token-id groups: a long query with many items (two empty), a one-pack group, and a third."""
    rng = np.random.default_rng(0)
    items = [list(map(int, rng.integers(1, 90, int(n)))) for n in (3, 0, 2, 4, 1, 5, 0, 2, 3, 1, 4)]
    return [
        Group(list(range(1, 11)), items),
        Group([5, 6], [[7], [8, 9]]),
        Group(list(range(20, 28)), items[::-1]),
    ]


def _all_packs(plan):
    return [p for b in plan.batches for p in b.packs]


def test_later_packs_of_a_group_are_the_tail_of_the_inline_layout():
    plan = _planner(True).plan(_id_groups())
    first = [p for p in _all_packs(plan) if p.item_refs[0].group == 0]
    assert first[0].stores_query and first[0].query_key == 0 and not first[0].query_cached
    cached = [p for p in first if p.query_cached]
    assert len(cached) >= 2 and all(p.query_key == 0 and not p.stores_query for p in cached)
    query = plan.tokenized[0].query_ids
    for pack in cached:
        items = [plan.tokenized[0].item_ids[ref.item] for ref in pack.item_refs]
        inline = mis_pack(query, items, list(pack.item_refs), D)
        q = len(query)
        assert pack.prefix_len == q and len(pack) == len(inline) - q
        assert pack.token_ids.tolist() == inline.token_ids[q:].tolist()
        assert pack.positions.tolist() == inline.positions[q:].tolist()
        assert pack.segments.tolist() == inline.segments[q:].tolist()
        assert pack.score_rows.tolist() == (inline.score_rows - q).tolist()
        assert len(pack) + q <= 24  # every pack attends over at most max_pack_tokens keys
        mask = pack_mask(pack, sliding_window=3)
        assert (mask == pack_mask(inline, sliding_window=3)[q:]).all()  # [len, q + len]
    # Group 1 fits one pack: it neither stores nor reads a query.
    assert all(p.query_key is None for p in _all_packs(plan) if p.item_refs[0].group == 1)


def test_empty_items_land_in_the_inline_pack():
    plan = _planner(True).plan(_id_groups())
    for group_index in (0, 2):
        packs = [p for p in _all_packs(plan) if p.item_refs[0].group == group_index]
        empty = {i for i, ids in enumerate(plan.tokenized[group_index].item_ids) if not ids}
        stored = next(p for p in packs if p.stores_query)
        assert empty and empty <= {ref.item for ref in stored.item_refs}
        for pack in packs:
            if pack.query_cached:
                assert not empty & {ref.item for ref in pack.item_refs}


def test_a_run_with_an_empty_item_past_the_first_pack_stays_inline():
    group = Group(list(range(1, 9)), [[]] * 20 + [[5, 6]] * 4)  # more empty items than one pack holds
    plan = _planner(True).plan([group])
    packs = _all_packs(plan)
    item_ids = plan.tokenized[0].item_ids
    recomputed = [p for p in packs if not p.query_cached and not p.stores_query]
    assert len(recomputed) == 1 and recomputed[0].query_key is None
    assert any(not item_ids[ref.item] for ref in recomputed[0].item_refs)
    assert sum(p.stores_query for p in packs) == 1 and any(p.query_cached for p in packs)
    assert all(item_ids[ref.item] for p in packs if p.query_cached for ref in p.item_refs)


def test_cached_mis_pack_refuses_an_empty_item():
    with pytest.raises(ValueError, match="empty item"):
        cached_mis_pack(3, [[1], []], [ItemRef(0, 0), ItemRef(0, 1)], D, 0)


def test_without_cache_query_packs_are_unchanged():
    groups = _id_groups()
    plain = _planner(False).plan(groups)
    today = [
        mis_pack(g.query, [g.items[i] for i in run], [ItemRef(n, i) for i in run], D)
        for n, g in enumerate(groups)
        for run in split_items(len(g.query), [len(i) for i in g.items], 24)
    ]
    packs = _all_packs(plain)
    assert len(packs) == len(today) and all(p.query_key is None and not p.query_cached for p in packs)
    by_refs = {p.item_refs: p for p in packs}
    for pack in today:
        assert by_refs[pack.item_refs].token_ids.tolist() == pack.token_ids.tolist()
    cached = _planner(True).plan(groups)
    assert cached.stats.packed_tokens == sum(len(p) for p in _all_packs(cached)) < plain.stats.packed_tokens
    # The same items are scored, each exactly once.
    refs = sorted(r for b in plain.batches for r in b.item_refs)
    assert refs == sorted(r for b in cached.batches for r in b.item_refs)


@pytest.mark.parametrize("budget", [1, 20, 40, 1000])
def test_batches_run_cached_packs_with_or_after_their_storing_pack(budget):
    plan = _planner(True, max_batch_tokens=budget).plan(_id_groups())
    stored_in: dict[int, int] = {}
    for index, batch in enumerate(plan.batches):
        assert batch.num_tokens <= budget or len(batch.packs) == 1
        for pack in batch.packs:
            if pack.stores_query:
                stored_in[pack.query_key] = index
        for pack in batch.packs:
            if pack.query_cached:
                assert stored_in[pack.query_key] <= index


def test_batch_order_keeps_groups_together_longest_first():
    packs = [
        mis_pack([1] * 6, [[2] * 3, [2] * 3], [ItemRef(0, 0), ItemRef(0, 1)], D, query_key=0),
        cached_mis_pack(6, [[3] * 16], [ItemRef(0, 2)], D, 0),  # longer than its storing pack
        mis_pack([1] * 2, [[4] * 20], [ItemRef(1, 0)], D),
        mis_pack([1] * 2, [[4]], [ItemRef(2, 0)], D),
    ]
    order = [b.packs[0].item_refs[0] for b in make_batches(packs, 1)]
    assert order == [ItemRef(1, 0), ItemRef(0, 0), ItemRef(0, 2), ItemRef(2, 0)]
    with pytest.raises(ValueError, match="storing"):
        make_batches(packs[1:], 100)


def test_query_cache_holds_nothing_after_the_last_batch():
    plan = _planner(True, max_batch_tokens=20).plan(_id_groups())
    cache = QueryCache(plan.batches)
    for index, batch in enumerate(plan.batches):
        for pack in batch.packs:
            if pack.stores_query:
                for layer in range(2):
                    cache.put(pack.query_key, layer, object())
            if pack.query_cached:
                assert cache.get(pack.query_key, 1) is not None
        cache.release(batch)
        alive = {p.query_key for b in plan.batches[index + 1 :] for p in b.packs if p.query_cached}
        assert cache.keys <= alive
    assert len(cache) == 0
    with pytest.raises(KeyError, match="storing pack"):
        cache.get(0, 0)


def _random_qkv(batch, heads=4, kv_heads=2, d=8, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(1, heads, batch.num_tokens, d)  # [1, heads, tokens, head_dim]
    k, v = torch.randn(2, 1, kv_heads, batch.num_tokens, d).unbind(0)  # [1, kv_heads, tokens, head_dim]
    return q, k, v


@pytest.mark.parametrize("backend", [SdpaBackend, SplitBackend])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (3, None), (None, 5.0), (4, 5.0)])
def test_cached_pack_rows_equal_the_inline_pack_rows(backend, window, softcap):
    """One storing pack and one cached pack in separate batches equal the same items packed inline (GQA)."""
    query, items = list(range(1, 7)), [[10, 11, 12], [13], [14, 15]]
    refs = [ItemRef(0, i) for i in range(3)]
    storing = collate([mis_pack(query, [[20, 21]], [ItemRef(0, 3)], D, query_key=0)])
    cached = collate([cached_mis_pack(len(query), items, refs, D, 0)])
    inline = collate([mis_pack(query, items, refs, D)])
    q_in, k_in, v_in = _random_qkv(inline)
    q_st, k_st, v_st = _random_qkv(storing, seed=1)
    k_st[:, :, : len(query)], v_st[:, :, : len(query)] = k_in[:, :, : len(query)], v_in[:, :, : len(query)]
    tail = slice(len(query), None)
    cache = QueryCache([storing, cached])
    backend(CPU).plan(storing, CPU, cache).attend(q_st, k_st, v_st, 0.3, window, softcap, layer=1)
    cache.release(storing)
    out = (
        backend(CPU)
        .plan(cached, CPU, cache)
        .attend(q_in[:, :, tail], k_in[:, :, tail], v_in[:, :, tail], 0.3, window, softcap, layer=1)
    )  # [1, tokens, heads, head_dim]
    cache.release(cached)
    expected = SdpaBackend(CPU).plan(inline, CPU).attend(q_in, k_in, v_in, 0.3, window, softcap)[:, tail]
    rows = torch.from_numpy(cached.segments >= 0)  # item rows (delimiter rows are never read)
    assert (out - expected)[:, rows].abs().max() <= 1e-6
    assert len(cache) == 0


def test_cached_packs_need_a_cache_and_flex_refuses_them():
    batch = collate([cached_mis_pack(3, [[1, 2]], [ItemRef(0, 0)], D, 0)])
    for backend in (SdpaBackend(CPU), SplitBackend(CPU)):
        with pytest.raises(ValueError, match="QueryCache"):
            backend.plan(batch, CPU)
    with pytest.raises(ValueError, match="cached_query is False"):
        FlexBackend(CPU, compile=False).plan(batch, CPU, QueryCache([batch]))
    assert SdpaBackend.capabilities.cached_query and SplitBackend.capabilities.cached_query
    assert not FlexBackend.capabilities.cached_query


class CacheDriver:
    """The runner integration, stood in for: one QueryCache per plan, passed to each batch, released after it.

    When the runner passes its own cache (the integration landed), this passes it through unchanged.
    """

    def __init__(self, backend, batches) -> None:
        self.backend = backend
        self.cache = QueryCache(batches)
        self.cached_packs_run = 0
        self._previous = None

    def plan(self, batch, device, query_cache=None):
        self.finish()
        self._previous = batch
        self.cached_packs_run += sum(p.query_cached for p in batch.packs)
        return self.backend.plan(batch, device, self.cache if query_cache is None else query_cache)

    def finish(self) -> None:
        """Release the batch that ran last (a batch runs until the next one is planned)."""
        if self._previous is not None:
            self.cache.release(self._previous)
            self._previous = None


def _set_cache_query(scorer, on: bool):
    """The scorer, its planner's PlanLimits.cache_query set (setup may later pick it per backend)."""
    limits = dataclasses.replace(scorer.planner.limits, cache_query=on)
    scorer.planner = dataclasses.replace(scorer.planner, limits=limits)
    return scorer


def _score_with_cached_queries(scorer, groups):
    """(results, plan) with the planner's cache_query on, run the way the runner integration runs it."""
    plan = _set_cache_query(scorer, True).plan(groups)
    runner = scorer._runner
    backend = runner.backend
    driver = CacheDriver(backend, plan.batches)
    runner.backend = driver
    try:
        results = scorer.run(plan)
    finally:
        runner.backend = backend
    driver.finish()
    assert driver.cached_packs_run == sum(p.query_cached for b in plan.batches for p in b.packs) > 0
    assert len(driver.cache) == 0
    return results, plan


CASES = [
    ("qwen3", "causal", {}),
    ("llama", "classifier", {}),  # GQA: 4 query heads, 2 K/V heads
    ("mistral", "causal", {"sliding_window": 4}),
    ("qwen2", "causal", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),
]


@pytest.mark.parametrize("backend", ["split", "sdpa"])
@pytest.mark.parametrize(("family", "kind", "overrides"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("max_batch_tokens", [40, 4096])
def test_cached_queries_match_plain_hf_and_the_inline_packs(
    zoo, backend, family, kind, overrides, max_batch_tokens
):
    model_dir = zoo.get(family, kind, add_bos=family == "llama", **overrides)
    settings = dict(
        backend=backend, pooled_hidden_states=True, max_pack_tokens=40, max_batch_tokens=max_batch_tokens
    )
    inline_scorer = _set_cache_query(make_scorer(model_dir, kind, **settings), False)
    inline_plan = inline_scorer.plan(QUERY_ONCE_GROUPS)
    inline = inline_scorer.run(inline_plan)
    cached, plan = _score_with_cached_queries(make_scorer(model_dir, kind, **settings), QUERY_ONCE_GROUPS)
    assert plan.stats.packed_tokens < inline_plan.stats.packed_tokens
    assert assert_matches_reference(model_dir, kind, QUERY_ONCE_GROUPS, cached) <= 1e-5
    for a, b in zip(inline, cached):
        assert max_abs_diff(a.scores, b.scores) <= 1e-5
        assert max_abs_diff(a.pooled, b.pooled) <= 1e-5


@pytest.mark.parametrize(("family", "kind"), [("qwen3", "causal"), ("llama", "classifier")])
def test_cached_queries_through_transformers_attention_modules(zoo, family, kind):
    """transformers' own decoder layers pass their layer_idx to the plan (the attention interface hook)."""
    model_dir = zoo.get(family, kind, add_bos=family == "llama")
    scoring = ScoringConfig(label_tokens=LABELS if kind == "causal" else (), pooled_hidden_states=True)
    config = EngineConfig(
        backend="split", layers="transformers", max_pack_tokens=40, max_batch_tokens=40, scoring=scoring
    )
    inline = _set_cache_query(Scorer.from_pretrained(model_dir, config), False).score(QUERY_ONCE_GROUPS)
    cached, _ = _score_with_cached_queries(Scorer.from_pretrained(model_dir, config), QUERY_ONCE_GROUPS)
    assert assert_matches_reference(model_dir, kind, QUERY_ONCE_GROUPS, cached) <= 1e-5
    for a, b in zip(inline, cached):
        assert max_abs_diff(a.scores, b.scores) <= 1e-5
        assert max_abs_diff(a.pooled, b.pooled) <= 1e-5


def _flashinfer_on_cpu(scorer):
    """The scorer with FlashInfer's backend whose kernel is the multi-item rule in torch (test_flashinfer_plan.py),
    cached packs on: the plan's pages, the QueryCache puts and copies all run as on the GPU."""
    from score_batch.engine.attention import flashinfer as fi
    from tests.test_flashinfer_plan import _KernelRuleWrapper

    backend = object.__new__(fi.FlashInferBackend)  # no flashinfer import: the wrapper is the fake
    backend._wrapper, backend._split_kv, backend._cache_query = _KernelRuleWrapper(), fi.SplitKv(), True
    scorer._runner.backend = backend
    return scorer


@pytest.mark.parametrize("backend", ["sdpa", "split", "flashinfer"])
@pytest.mark.parametrize("changed", [5, 1], ids=["neighbour-in-a-cached-pack", "item-of-the-storing-pack"])
@pytest.mark.parametrize("max_batch_tokens", [40, 4096], ids=["later-batches", "one-batch"])
def test_items_of_cached_packs_cannot_see_each_other(qwen3_causal, backend, changed, max_batch_tokens):
    """As test_scorer's items_cannot_see_each_other, in a group whose later packs read the query's cached K/V: an
    item changed (same length, so the same layout) moves its own score and no other item's beyond float rounding
    of equal-shaped arithmetic — a leaked key among a cached pack's few dozen would move them by ~1e-2."""
    query = list(range(5, 25))  # 20 tokens: 4 items of 3 tokens per 40-token pack, 3 packs for 12 items
    items = [[30 + i, 50 + i, 70 + i] for i in range(12)]
    other = [list(item) for item in items]
    other[changed] = [90, 91, 92]
    scores = []
    for group_items in (items, other):
        scorer = make_scorer(qwen3_causal, backend="sdpa" if backend == "flashinfer" else backend,
                             max_pack_tokens=40, max_batch_tokens=max_batch_tokens)  # fmt: skip
        scorer = _flashinfer_on_cpu(scorer) if backend == "flashinfer" else scorer
        plan = _set_cache_query(scorer, True).plan([Group(query, group_items)])
        packs = [p for b in plan.batches for p in b.packs]
        (storing,) = [p for p in packs if p.stores_query]
        assert sum(p.query_cached for p in packs) == 2 and (len(plan.batches) > 1) == (max_batch_tokens == 40)
        in_cached = ItemRef(0, changed) not in storing.item_refs
        assert in_cached == (changed == 5)
        scores.append(scorer.run(plan)[0].scores)
    base, moved = scores
    assert max_abs_diff(base[changed], moved[changed]) > 1e-4  # the changed item's own score moves
    others = [i for i in range(len(items)) if i != changed]
    assert max_abs_diff(base[others], moved[others]) <= 1e-6
