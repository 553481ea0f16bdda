"""Scorer parity with plain HF forwards, invariances and the SGLang behaviours of docs/semantics.md."""

from __future__ import annotations

import random

import numpy as np
import pytest

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig, ScoringInputError
from tests.reference import max_abs_diff, reference_scores, reference_sequence, tokenizer

LABELS = (" to", " the")
GROUPS = [
    Group("I pledge allegiance", ["", " to", " the flag of", " to the United States of America"]),
    Group("Tokyo is a city in", [" Japan", " the country", " yes", " no"]),
    Group("What is the capital of California?", [" Sacramento", " San Jose", " San Francisco"]),
    Group("the quick brown fox", []),
    Group("héllo wörld 日本 ✓", [" ünïcödé 東京", " plain"]),
]


def make_scorer(model_dir, kind="causal", backend="sdpa", **scoring) -> Scorer:
    if kind == "causal" and "label_token_ids" not in scoring:
        scoring.setdefault("label_tokens", LABELS)
    engine_keys = {"max_batch_tokens", "max_pack_tokens"}
    engine = {k: scoring.pop(k) for k in list(scoring) if k in engine_keys}
    return Scorer.from_pretrained(
        model_dir, EngineConfig(backend=backend, scoring=ScoringConfig(**scoring), **engine)
    )


def label_ids(model_dir):
    return [tokenizer(str(model_dir)).encode(t, add_special_tokens=False)[0] for t in LABELS]


def assert_matches_reference(model_dir, kind, groups, results, apply_softmax=False, item_first=False):
    worst = 0.0
    for group, result in zip(groups, results):
        assert result.scores.shape[0] == len(group.items)
        for i, item in enumerate(group.items):
            seq = reference_sequence(model_dir, group.query, item, item_first)
            scores, pooled = reference_scores(model_dir, kind, seq, label_ids(model_dir), apply_softmax)
            worst = max(worst, max_abs_diff(scores, result.scores[i]))
            if result.pooled is not None:
                worst = max(worst, max_abs_diff(pooled, result.pooled[i]))
    assert worst <= 1e-4, worst
    return worst


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("kind", ["causal", "classifier"])
def test_scores_and_pooled_match_plain_hf(zoo, family, kind):
    model_dir = zoo.get(family, kind, add_bos=family == "llama")
    results = make_scorer(model_dir, kind, pooled_hidden_states=True).score(GROUPS)
    assert_matches_reference(model_dir, kind, GROUPS, results)
    assert results[0].pooled.shape == (4, 64)
    assert results[3].scores.shape[0] == 0  # an empty item list gives no rows


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_other_families_match_plain_hf(zoo, family):
    model_dir = zoo.get(family, "causal")
    assert_matches_reference(model_dir, "causal", GROUPS[:3], make_scorer(model_dir).score(GROUPS[:3]))


def test_sliding_window_model_matches_plain_hf(zoo):
    # A window shorter than the reference sequences: the mask must apply it on reference positions.
    model_dir = zoo.get("mistral", "causal", sliding_window=4)
    for packing in ("mis", "single"):
        results = make_scorer(model_dir, packing=packing).score(GROUPS[:3])
        assert_matches_reference(model_dir, "causal", GROUPS[:3], results)


def test_apply_softmax_matches_reference_and_sums_to_one(qwen3_causal):
    results = make_scorer(qwen3_causal, apply_softmax=True).score(GROUPS[:2])
    assert_matches_reference(qwen3_causal, "causal", GROUPS[:2], results, apply_softmax=True)
    assert np.allclose(results[0].scores.sum(-1), 1.0, atol=1e-6)


def test_classifier_softmax_and_labels_ignored(qwen3_classifier, caplog):
    plain = make_scorer(qwen3_classifier, "classifier").score(GROUPS[:2])
    with_labels = make_scorer(qwen3_classifier, "classifier", label_token_ids=(1, 2)).score(GROUPS[:2])
    assert "ignored" in caplog.text
    assert np.array_equal(plain[0].scores, with_labels[0].scores)
    soft = make_scorer(qwen3_classifier, "classifier", apply_softmax=True).score(GROUPS[:2])
    assert_matches_reference(qwen3_classifier, "classifier", GROUPS[:2], soft, apply_softmax=True)


def test_item_first_matches_reference(qwen3_causal):
    groups = [Group(" is a city", ["Tokyo", "Japan"])]
    results = make_scorer(qwen3_causal, item_first=True).score(groups)
    assert_matches_reference(qwen3_causal, "causal", groups, results, item_first=True)
    assert results[0].scores[0, 0] != results[0].scores[1, 0]


@pytest.mark.parametrize("n_items", [1, 2, 4, 6, 10, 15])
def test_mis_gives_one_distinct_score_per_item_equal_to_single(qwen3_causal, n_items):
    words = [
        "apple",
        "banana",
        "cherry",
        "dog",
        "fox",
        "lazy",
        "quick",
        "brown",
        "city",
        "flag",
        "Tokyo",
        "Japan",
        "yes",
        "no",
        "capital",
    ]
    group = [Group("the quick brown fox jumps over", [" " + w for w in words[:n_items]])]
    mis = make_scorer(qwen3_causal).score(group)[0]
    single = make_scorer(qwen3_causal, packing="single").score(group)[0]
    assert max_abs_diff(mis.scores, single.scores) <= 1e-5
    assert len(set(np.round(mis.scores[:, 0], 7).tolist())) == n_items


@pytest.mark.parametrize("backend", ["sdpa", "split", "flex"])
def test_items_cannot_see_each_other(qwen3_causal, backend):
    scorer = make_scorer(qwen3_causal, backend=backend, pooled_hidden_states=True)
    base = scorer.score([Group("the capital of", [" Tokyo", " Japan and", " the flag"])])[0]
    changed = scorer.score([Group("the capital of", [" lazy dog over there", " Japan and", " the flag"])])[0]
    assert max_abs_diff(base.scores[0], changed.scores[0]) > 1e-4  # the changed item itself moves
    # Other items may differ only by float rounding of differently shaped matmuls, never by leakage.
    assert max_abs_diff(base.scores[1:], changed.scores[1:]) <= 1e-6
    assert max_abs_diff(base.pooled[1:], changed.pooled[1:]) <= 1e-5


def test_invariant_to_batch_budget_split_order_and_packing(qwen3_causal):
    baseline = make_scorer(qwen3_causal).score(GROUPS)
    split_plan = make_scorer(qwen3_causal, max_pack_tokens=48).plan(GROUPS)
    assert split_plan.stats.packs > make_scorer(qwen3_causal).plan(GROUPS).stats.packs  # really split
    assert all(error is None for group in split_plan.tokenized for error in group.errors)
    variants = [
        make_scorer(qwen3_causal, max_batch_tokens=16).score(GROUPS),
        make_scorer(qwen3_causal, max_batch_tokens=1_000_000).score(GROUPS),
        make_scorer(qwen3_causal, max_pack_tokens=48).score(GROUPS),
        make_scorer(qwen3_causal, packing="single").score(GROUPS),
    ]
    for variant in variants:
        for a, b in zip(baseline, variant):
            assert max_abs_diff(a.scores, b.scores) <= 1e-5
    order = list(range(len(GROUPS)))
    random.Random(0).shuffle(order)
    shuffled = make_scorer(qwen3_causal).score([GROUPS[i] for i in order])
    for position, index in enumerate(order):
        assert max_abs_diff(shuffled[position].scores, baseline[index].scores) <= 1e-5


@pytest.mark.parametrize("batch_size", [1, 2, 4, 8])
def test_group_batch_sizes_give_same_scores(qwen3_causal, batch_size):
    groups = [Group(f"query number {i} about the flag", [" to", " the", f" item {i}"]) for i in range(8)]
    scorer = make_scorer(qwen3_causal)
    together = scorer.score(groups)
    for start in range(0, 8, batch_size):
        part = scorer.score(groups[start : start + batch_size])
        for a, b in zip(part, together[start : start + batch_size]):
            assert max_abs_diff(a.scores, b.scores) <= 1e-5


def test_identical_bits_when_run_twice(qwen3_causal):
    scorer = make_scorer(qwen3_causal, pooled_hidden_states=True)
    first, second = scorer.score(GROUPS), scorer.score(GROUPS)
    for a, b in zip(first, second):
        assert a.scores.tobytes() == b.scores.tobytes()
        assert a.pooled.tobytes() == b.pooled.tobytes()


@pytest.mark.parametrize("backend", ["flex", "split"])
def test_fast_backends_match_sdpa(zoo, backend):
    cases = [
        (zoo.get("qwen3", "causal"), "causal"),
        (zoo.get("qwen3", "classifier"), "classifier"),
        (zoo.get("mistral", "causal", sliding_window=4), "causal"),
    ]
    for model_dir, kind in cases:
        sdpa = make_scorer(model_dir, kind, pooled_hidden_states=True).score(GROUPS)
        fast = make_scorer(model_dir, kind, backend, pooled_hidden_states=True, max_batch_tokens=64).score(
            GROUPS
        )
        for a, b in zip(sdpa, fast):
            assert max_abs_diff(a.scores, b.scores) <= 1e-5
            assert max_abs_diff(a.pooled, b.pooled) <= 1e-5


def test_token_ids_equal_text(qwen3_causal):
    tok = tokenizer(str(qwen3_causal))
    text = [GROUPS[0], GROUPS[4]]
    ids = [
        Group(tok(g.query)["input_ids"], [tok(i, add_special_tokens=False)["input_ids"] for i in g.items])
        for g in text
    ]
    scorer = make_scorer(qwen3_causal)
    for a, b in zip(scorer.score(text), scorer.score(ids)):
        assert a.scores.tobytes() == b.scores.tobytes()


def test_pooled_request_never_changes_scores(qwen3_causal):
    plain = make_scorer(qwen3_causal).score(GROUPS)
    pooled = make_scorer(qwen3_causal, pooled_hidden_states=True, normalize=True).score(GROUPS)
    for a, b in zip(plain, pooled):
        assert a.scores.tobytes() == b.scores.tobytes()
    assert plain[0].pooled is None
    assert np.allclose(np.linalg.norm(pooled[0].pooled, axis=1), 1.0, atol=1e-5)


def test_score_index_picks_column(qwen3_causal):
    results = make_scorer(qwen3_causal, score_index=0).score(GROUPS[:1])
    assert np.array_equal(results[0].score, results[0].scores[:, 0])
    default = make_scorer(qwen3_causal).score(GROUPS[:1])
    assert np.array_equal(default[0].score, default[0].scores[:, -1])


@pytest.mark.parametrize(
    "scoring, message",
    [
        ({"label_tokens": (" to the",)}, "exactly one token"),
        ({"label_tokens": (), "label_score": "logit"}, "label_score='logit' applies to label tokens"),
        ({"label_token_ids": (5, 5)}, "duplicates"),
        ({"label_token_ids": (10**7,)}, "outside the vocabulary"),
        ({"score_index": 5}, "ScoringConfig.score_index=5 is out of range for 2 scores"),
        ({"delimiter_token_id": 10**7}, "delimiter"),
    ],
)
def test_bad_scoring_settings_are_clear_errors(qwen3_causal, scoring, message):
    with pytest.raises(ScoringInputError, match=message):
        make_scorer(qwen3_causal, **scoring)


def test_bad_rows_become_item_errors_not_crashes(qwen3_causal):
    groups = [
        Group([1, 2, 3], [[4, 5], [10**7], []]),
        Group("", [" to"]),
        Group("the flag", [" " + "flag " * 100]),
    ]
    results = make_scorer(qwen3_causal, max_item_tokens=20).score(groups)
    assert results[0].errors[0] is None and not np.isnan(results[0].scores[0]).any()
    assert "outside the vocabulary" in results[0].errors[1] and np.isnan(results[0].scores[1]).all()
    assert results[0].errors[2] is None
    assert "empty" in results[1].errors[0]
    assert "over the limit" in results[2].errors[0]
