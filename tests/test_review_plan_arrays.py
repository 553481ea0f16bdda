"""The planner's array path (engine/plan/planner._as_encoded: a group scoring its tokenizer call's ids as they are)
plans what the per-item list path plans under every config: truncate policies, chunk, item_first, single
packing, cache_query with empty items, pad-id tails on queries and items, token-id and mixed groups, failed items,
empty groups; and it is taken only where the group's items are the encodings' own list."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest

from score_batch.engine.config import ScoringConfig
from score_batch.engine.errors import SettingError
from score_batch.engine.model.loading import load_tokenizer
from score_batch.engine.plan import planner as planner_module
from score_batch.engine.plan.packing import mis_pack
from score_batch.engine.plan.planner import PackedPlanner, PlanLimits, duplicate_sequences
from score_batch.engine.text.encode import EncodedTexts, encode_texts
from score_batch.engine.text.tokenize import without_unscored_tail
from score_batch.engine.types import FlatItems, Group, TokenizedGroup
from tests.test_plan_arrays import WORDS, as_lists, plan_arrays
from tests.tiny_models import build_tokenizer

PAD = "<|endoftext|>"  # id 0 in the tiny tokenizer: the unscored tail id below


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out)
    return load_tokenizer(out)


class OwnCall:
    """The tokenizer as a class of its own: is_fast (its __call__ gives the offsets) or slow (ids only)."""

    def __init__(self, tokenizer, fast: bool) -> None:
        self._tokenizer, self.is_fast = tokenizer, fast

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)


def text(rng: random.Random, most: int, least: int = 0) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(least, most)))
    return words + PAD * rng.choice([0, 0, 0, 1, 2]) if rng.random() < 0.3 else words


def hostile_groups(rng: random.Random, vocab: int) -> list[Group]:
    """Text groups whose queries and items repeat, with pad-id tails, empty and all-pad items and queries,
    long items and no items; token-id groups with pad tails and ids out of the vocabulary; mixed groups."""
    pool = [text(rng, 12) for _ in range(10)] + ["", PAD, PAD * 3, " ".join(WORDS[:40])]
    queries = [text(rng, 10, 1) for _ in range(3)] + [PAD, "x" + PAD * 2]
    groups = []
    for _ in range(rng.randint(1, 8)):
        kind = rng.random()
        if kind < 0.7:
            groups.append(Group(rng.choice(queries), [rng.choice(pool) for _ in range(rng.randint(0, 14))]))
        elif kind < 0.9:
            ids = [[rng.randrange(vocab) for _ in range(rng.randint(0, 6))] + [0] * rng.randint(0, 2)]
            ids += [[vocab + 5], [-1], [5, 0, 0], []]
            groups.append(Group([7, 8, 0], [list(rng.choice(ids)) for _ in range(rng.randint(0, 6))]))
        else:
            groups.append(Group("a query", ["an item", [1, 2]]))  # mixed: the group's error
    return groups


def configs(rng: random.Random):
    """A random valid (ScoringConfig, PlanLimits) pair."""
    while True:
        truncate = rng.choice(["error", "item-tail", "query-head", "longest-first", "chunk"])
        cfg_args = dict(
            truncate=truncate,
            item_first=rng.random() < 0.2,
            packing=rng.choice(["auto", "auto", "single"]),
            max_item_tokens=rng.choice([None, 6, 30]) if truncate != "chunk" else rng.choice([4, 9]),
            max_query_tokens=rng.choice([None, None, 5]),
            chunk_overlap=rng.choice([0, 1]) if truncate == "chunk" else 0,
            query_template=rng.choice([None, "Q: {query}"]),
            item_template=rng.choice([None, "{item} ."]),
        )
        try:
            cfg = ScoringConfig(**cfg_args)
            limits = PlanLimits(
                max_pack_tokens=rng.choice([20, 40, 400]),
                max_batch_tokens=rng.choice([50, 500]),
                delimiter_token_id=3,
                vocab_size=0,  # set by the caller
                cache_query=rng.random() < 0.5,
                dedupe=rng.random() < 0.8,
                unscored_tail_id=rng.choice([None, 0, 0]),
                isolate_sequences=rng.random() < 0.1,
                max_positions=rng.choice([None, 64]),
            )
            return cfg, limits
        except SettingError:
            continue


def full(plan) -> tuple:
    """Everything a plan decides, lists made plain (ids lists compared by value)."""
    groups = [(g.query_ids, g.item_ids, g.errors, g.item_first, g.chunks) for g in plan.tokenized]
    scored = [(g.query_ids, g.item_ids, g.errors) for g in plan.scored]
    chunked = None if plan.chunked is None else [(c.owners, c.firsts, c.counts) for c in plan.chunked]
    return groups, scored, chunked, plan_arrays(plan)


KINDS = [(seed, "backend") for seed in range(30)] + [
    (s, k) for s in range(0, 30, 3) for k in ("own call", "slow")
]


@pytest.mark.parametrize(("seed", "kind"), KINDS)
def test_every_config_plans_alike_through_arrays_and_lists(tokenizer, seed, kind, monkeypatch):
    rng = random.Random(seed)
    tokenizer = tokenizer if kind == "backend" else OwnCall(tokenizer, kind == "own call")
    cfg, limits = configs(rng)
    limits = PlanLimits(**{**limits.__dict__, "vocab_size": len(tokenizer)})
    planner = PackedPlanner(tokenizer, cfg, limits)
    groups = hostile_groups(rng, len(tokenizer))
    taken = []
    as_encoded = planner_module._as_encoded
    monkeypatch.setattr(
        planner_module, "_as_encoded", lambda g, e: taken.append(as_encoded(g, e)) or taken[-1]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow (or any) warning from the hashes
        arrays = planner.plan(groups, planner.encode(groups))
        whole = planner.plan(groups)
    lists = planner.plan(groups, as_lists(planner.encode(groups)))
    assert full(arrays) == full(lists) == full(whole)
    assert list(arrays.copies) == list(lists.copies)  # the dict's order too
    for group, got in zip(arrays.scored, taken):  # arrays only where the group's ids are the encodings' own
        if got is not None:
            flat, lens = got
            assert lens.tolist() == [len(ids) for ids in group.item_ids]
            assert flat.tolist() == [t for ids in group.item_ids for t in ids]


def test_configs_reach_the_array_path_and_the_hostile_cases(tokenizer):
    """The fuzz above takes the array path, pad tails, copies, failed items and chunks in some seeds."""
    seen = set()
    for seed in range(40):
        rng = random.Random(seed)
        cfg, limits = configs(rng)
        limits = PlanLimits(**{**limits.__dict__, "vocab_size": len(tokenizer)})
        planner = PackedPlanner(tokenizer, cfg, limits)
        groups = hostile_groups(rng, len(tokenizer))
        encoded = planner.encode(groups)
        plan = planner.plan(groups, encoded)
        arrays = [planner_module._as_encoded(g, e) for g, e in zip(plan.scored, encoded)]
        seen.add("arrays" if any(a is not None for a in arrays) else "")
        seen.add("all arrays" if arrays and all(a is not None for a in arrays) and plan.copies else "")
        seen.add(
            "tail" if any(g.query_ids != s.query_ids for g, s in zip(plan.tokenized, plan.scored)) else ""
        )
        seen.add("failed" if any(e is not None for g in plan.tokenized for e in g.errors) else "")
        seen.add("chunks" if plan.chunked and plan.stats.sequences > plan.stats.items else "")
        seen.add("cached" if any(p.query_cached for b in plan.batches for p in b.packs) else "")
    assert seen >= {"arrays", "all arrays", "tail", "failed", "chunks", "cached"}


@pytest.mark.parametrize("fast", [True, False])
def test_a_tokenizer_class_of_its_own_takes_the_array_path(tokenizer, fast):
    planner = PackedPlanner(OwnCall(tokenizer, fast), ScoringConfig(), PlanLimits(40, 500, 3, len(tokenizer)))
    groups = [Group("the query", ["the city", "", "Tokyo is a city"] * 5), Group("the query", ["the city"])]
    encoded = planner.encode(groups)
    plan = planner.plan(groups, encoded)
    assert all(planner_module._as_encoded(g, e) is not None for g, e in zip(plan.scored, encoded))
    assert full(plan) == full(planner.plan(groups, as_lists(planner.encode(groups)))) and plan.copies


def test_a_pad_tail_changes_the_items_so_the_array_path_is_left(tokenizer):
    """An item ending in the pad id loses it (the list changes): the group's ids are no longer the encodings'."""
    limits = PlanLimits(400, 500, 3, len(tokenizer), unscored_tail_id=0)
    planner = PackedPlanner(tokenizer, ScoringConfig(), limits)
    for items in (["the city", "the city" + PAD], ["the city", "Tokyo"]):
        groups = [Group("the query" + PAD, items), Group("the query", items)]
        encoded = planner.encode(groups)
        plan = planner.plan(groups, encoded)
        lists = planner.plan(groups, as_lists(planner.encode(groups)))
        assert full(plan) == full(lists)
        # a query tail moves in front of every non-empty item: the first group's items change
        assert planner_module._as_encoded(plan.scored[0], encoded[0]) is None
        unchanged = PAD not in items[1]
        assert (planner_module._as_encoded(plan.scored[1], encoded[1]) is not None) == unchanged


def test_all_empty_items_behind_a_query_tail_keep_the_same_list(tokenizer):
    """Empty items stay empty when a query's pad tail moves: the list is kept and its arrays are still right."""
    group = TokenizedGroup([5, 6, 0, 0], [[], []], [None, None])
    read = without_unscored_tail(group, 0)
    assert read.query_ids == [5, 6] and read.item_ids is group.item_ids and read.item_ids == [[], []]
    limits = PlanLimits(400, 500, 3, len(tokenizer), unscored_tail_id=0, cache_query=True)
    planner = PackedPlanner(tokenizer, ScoringConfig(), limits)
    groups = [Group("the query" + PAD, ["", ""]), Group("the query" + PAD, ["", "the"])]
    assert full(planner.plan(groups)) == full(planner.plan(groups, as_lists(planner.encode(groups))))


def test_hash_collisions_leave_the_exact_comparison_to_decide(monkeypatch):
    """Every item hashing alike, or none alike but equal ones: the copies are the exact ones, in order."""
    rng = random.Random(3)
    pool = [[rng.randrange(5) for _ in range(rng.randint(0, 3))] for _ in range(6)]
    groups = [
        TokenizedGroup(rng.choice([[1], [1, 2]]), [list(rng.choice(pool)) for _ in range(9)], [None] * 9)
        for _ in range(6)
    ]
    arrays = [
        FlatItems(
            np.array([t for ids in g.item_ids for t in ids], np.int64), np.array([len(i) for i in g.item_ids])
        )
        for g in groups
    ]
    exact = list(duplicate_sequences(groups).items())
    assert exact and list(duplicate_sequences(groups, arrays).items()) == exact
    real = planner_module._hash_candidates
    monkeypatch.setattr(
        planner_module, "_hash_candidates", lambda codes, a: [list(range(len(x[1]))) for x in a]
    )
    assert list(duplicate_sequences(groups, arrays).items()) == exact
    # tokens that wrap the uint64 hash (ids up to 2**62) still hash equal sequences alike
    big = [TokenizedGroup([1], [[2**62, 2**62 - 1, 7], [2**62, 2**62 - 1, 7], [7]], [None] * 3)]
    big_arrays = [
        FlatItems(np.array([2**62, 2**62 - 1, 7, 2**62, 2**62 - 1, 7, 7], np.int64), np.array([3, 3, 1]))
    ]
    monkeypatch.setattr(planner_module, "_hash_candidates", real)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert duplicate_sequences(big, big_arrays) == duplicate_sequences(big) == {(0, 0): ((0, 1),)}


def test_no_items_anywhere(tokenizer):
    """Groups without items (and a call without texts) plan nothing, through arrays as through lists."""
    limits = PlanLimits(40, 500, 3, len(tokenizer), cache_query=True, unscored_tail_id=0)
    planner = PackedPlanner(tokenizer, ScoringConfig(), limits)
    for groups in ([Group("q", [])], [Group("q", []), Group("r", [])], []):
        plan = planner.plan(groups)
        assert full(plan) == full(planner.plan(groups, as_lists(planner.encode(groups))))
        assert plan.stats.sequences == 0 and not plan.batches


def test_mis_pack_takes_arrays_as_lists():
    items = [[4, 5], [], [6], [7, 8, 9]]
    arrays = FlatItems(np.array([4, 5, 6, 7, 8, 9], np.int64), np.array([2, 0, 1, 3], np.int64))
    refs = [(0, k) for k in range(4)]
    a, b = mis_pack([1, 2], items, refs, 3), mis_pack([1, 2], arrays, refs, 3)
    for name in ("token_ids", "positions", "segments", "score_rows"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist()
    # a plain tuple of two items' lists is two items, not arrays
    two = mis_pack([1, 2], ([4, 5], [6]), refs[:2], 3)
    assert two.token_ids.tolist() == mis_pack([1, 2], [[4, 5], [6]], refs[:2], 3).token_ids.tolist()


def test_encoded_texts_slices_of_slices_and_the_whole_call(tokenizer):
    """Slices of slices, empty slices and the whole call: ids the same list object on every read, tokens and
    ids the encodings' own; a slice covering the whole call is the call's list."""
    texts = ["the city", "", "Tokyo is a city", PAD, "the"]
    whole = encode_texts(tokenizer, None, "{item}", texts, False)
    lists = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    for part, want in ((whole, lists), (whole[1:], lists[1:]), (whole[1:][1:3], lists[2:4]), (whole[5:], [])):
        assert isinstance(part, EncodedTexts) and part.ids == want and part.ids is part.ids
        flat, lens = part.tokens()
        assert lens.tolist() == [len(i) for i in want] and flat.tolist() == [t for i in want for t in i]
        assert [e.ids for e in part] == want and [part[k].ids for k in range(-len(want), 0)] == want
    assert whole[0:5].ids == whole.ids
    with pytest.raises(ValueError):
        whole[::2]
    empty = encode_texts(tokenizer, None, "{item}", [], False)
    assert empty.ids == [] and [a.tolist() for a in empty.tokens()] == [[], []]
