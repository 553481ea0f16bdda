"""The planner's array path (a group scoring its encodings' ids as they are: packs sliced from one flattening of
the tokenizer call, repeats found by hashing) gives the packs, copies and counts of the per-item list path."""

from __future__ import annotations

import random

import numpy as np
import pytest

from score_batch.engine.config import ScoringConfig
from score_batch.engine.model.loading import load_tokenizer
from score_batch.engine.plan import planner as planner_module
from score_batch.engine.plan.planner import PackedPlanner, PlanLimits, duplicate_sequences
from score_batch.engine.text.encode import EncodedTexts, encode_texts
from score_batch.engine.types import FlatItems, Group, TokenizedGroup
from tests.tiny_models import BASE_CORPUS, build_tokenizer

WORDS = sorted({w for line in BASE_CORPUS for w in line.split()})


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out)
    return load_tokenizer(out)


def repeating_groups(rng: random.Random) -> list[Group]:
    """Groups whose queries and items repeat within and across groups (copies), some items empty."""
    items = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 9))) for _ in range(12)]
    queries = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(3)]
    return [
        Group(rng.choice(queries), [rng.choice(items) for _ in range(rng.randint(1, 15))])
        for _ in range(rng.randint(1, 7))
    ]


def as_lists(encoded):
    """The same encodings as the list path takes them: each group's items a list of Encoded."""
    return [None if e is None else (e[0], list(e[1])) for e in encoded]


def plan_arrays(plan):
    batches = [
        (b.token_ids.tolist(), b.positions.tolist(), b.segments.tolist(), b.score_rows.tolist(), b.item_refs)
        for b in plan.batches
    ]
    packs = [(p.query_key, p.query_cached, p.prefix_len) for b in plan.batches for p in b.packs]
    return batches, packs, list(plan.copies.items()), plan.stats


@pytest.mark.parametrize("cache_query", [False, True])
@pytest.mark.parametrize("tail", [None, 0])
@pytest.mark.parametrize("seed", range(6))
def test_array_path_plans_what_the_list_path_plans(tokenizer, seed, tail, cache_query):
    rng = random.Random(seed)
    limits = PlanLimits(
        max_pack_tokens=rng.choice([24, 40, 400]),
        max_batch_tokens=80,
        delimiter_token_id=3,
        vocab_size=len(tokenizer),
        cache_query=cache_query,
        unscored_tail_id=tail,
    )
    planner = PackedPlanner(tokenizer, ScoringConfig(), limits)
    groups = repeating_groups(rng)
    encoded = planner.encode(groups)
    arrays = planner.plan(groups, encoded)
    assert any(g.item_ids is e[1].ids for g, e in zip(arrays.scored, encoded))  # the array path was taken
    lists = planner.plan(groups, as_lists(planner.encode(groups)))
    assert all(not isinstance(e[1], EncodedTexts) for e in as_lists(encoded))
    assert plan_arrays(arrays) == plan_arrays(lists)
    assert lists.copies  # the groups repeat items: there are copies to find


def random_tokenized(rng: random.Random) -> list[TokenizedGroup]:
    pool = [[rng.randrange(50) for _ in range(rng.randint(0, 5))] for _ in range(8)]
    queries = [[1, 2], [1, 2, 3], [7]]
    return [
        TokenizedGroup(
            rng.choice(queries),
            [None if rng.random() < 0.1 else list(rng.choice(pool)) for _ in range(rng.randint(1, 12))],
            [],
            rng.random() < 0.2,
        )
        for _ in range(rng.randint(1, 8))
    ]


def arrays_of(groups):
    out = []
    for g in groups:
        lens = np.array([len(ids or []) for ids in g.item_ids], np.int64)
        out.append(FlatItems(np.array([t for ids in g.item_ids for t in ids or []], np.int64), lens))
    return out


def repeats_by_lists(groups) -> list:
    """The reference: every (query, item tokens) sequence keyed as a tuple, first one found → later ones."""
    first, copies = {}, {}
    for g, group in enumerate(groups):
        for i, ids in enumerate(group.item_ids):
            if ids is not None:
                original = first.setdefault((group.item_first, tuple(group.query_ids), tuple(ids)), (g, i))
                if original != (g, i):
                    copies.setdefault(original, []).append((g, i))
    return [(original, tuple(refs)) for original, refs in copies.items()]


def test_a_call_without_groups_plans_nothing(tokenizer):
    limits = PlanLimits(
        max_pack_tokens=40, max_batch_tokens=80, delimiter_token_id=3, vocab_size=len(tokenizer)
    )
    planner = PackedPlanner(tokenizer, ScoringConfig(), limits)
    plan = planner.plan([], planner.encode([]))
    assert plan.batches == [] and plan.copies == {} and duplicate_sequences([]) == {}


@pytest.mark.parametrize("seed", range(20))
def test_hashed_repeats_equal_the_exact_ones_in_order(seed, monkeypatch):
    groups = random_tokenized(random.Random(seed))
    exact = repeats_by_lists(groups)
    assert exact  # the pool repeats
    assert list(duplicate_sequences(groups, arrays_of(groups)).items()) == exact
    assert list(duplicate_sequences(groups).items()) == exact  # arrays made from the lists
    # a hash that collides everywhere: every item a candidate, still only true repeats are copies
    every = lambda codes, arrays: [list(range(len(a[1]))) for a in arrays]  # noqa: E731
    monkeypatch.setattr(planner_module, "_hash_candidates", every)
    assert list(duplicate_sequences(groups, arrays_of(groups)).items()) == exact


def test_encoded_texts_slices_agree_with_lists(tokenizer):
    texts = [
        " ".join(WORDS[k : k + n]) for k, n in zip(range(0, 40, 3), [0, 1, 5, 2, 7, 3, 0, 4, 6, 1, 2, 3, 9])
    ]
    whole = encode_texts(tokenizer, None, "{item}", texts, False)
    lists = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert whole.ids == lists
    for lo, hi in [(0, 13), (2, 9), (5, 5), (12, 13)]:
        part = whole[lo:hi]
        flat, lens = part.tokens()
        assert part.ids == lists[lo:hi] and len(part) == hi - lo
        assert flat.tolist() == [t for ids in lists[lo:hi] for t in ids] and lens.tolist() == list(
            map(len, lists[lo:hi])
        )
        inner = part[1:-1]
        assert inner.ids == lists[lo:hi][1:-1] and inner.tokens()[0].tolist() == [
            t for ids in lists[lo:hi][1:-1] for t in ids
        ]
        assert [e.ids for e in part] == lists[lo:hi]
        assert part.ids is part.ids  # one list object: the planner knows a group scores it as it is
