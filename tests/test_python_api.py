"""The pair-level Python API: profiles resolved as the CLI does, predict / rank / rank_many, rankings, refusals."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random

import numpy as np
import pytest
import torch

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig, ScoringInputError, SettingError
from score_batch.engine.model.profiles import builtin_profiles
from score_batch.engine.run.ranking import ranks, top_k_order
from score_batch.engine.types import GroupResult
from tests.reference import max_abs_diff, reference_scores, reference_sequence, tokenizer
from tests.test_cli import run_cli, write_jsonl

LABELS = (" to", " the")
ROWS = [  # two queries interleaved (grouped by query inside predict), an empty item, a repeated item
    {"query_id": "a", "query": "I pledge allegiance", "item_id": "a1", "item": " to"},
    {"query_id": "b", "query": "Tokyo is a city in", "item_id": "b1", "item": " Japan"},
    {"query_id": "a", "query": "I pledge allegiance", "item_id": "a2", "item": " the flag of"},
    {"query_id": "b", "query": "Tokyo is a city in", "item_id": "b2", "item": " the country"},
    {"query_id": "a", "query": "I pledge allegiance", "item_id": "a3", "item": ""},
    {"query_id": "c", "query": "What is the capital of California?", "item_id": "c1", "item": " Sacramento"},
    {"query_id": "a", "query": "I pledge allegiance", "item_id": "a4", "item": " to the United States"},
]
PAIRS = [(r["query"], r["item"]) for r in ROWS]
PROFILE = {  # a score_batch.json for a tiny model: templates, two labels, softmax
    "query_template": "Query: {query}\n",
    "item_template": "Doc: {item}\nAnswer:",
    "label_tokens": list(LABELS),
    "apply_softmax": True,
}


def cli_scores(tmp_path, *flags) -> np.ndarray:
    """The CLI's `score` column for ROWS, in input order."""
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "cli.jsonl"
    result = run_cli(src, "-o", out, "--overwrite", "--quiet", *map(str, flags))
    assert result.returncode == 0, result.stderr
    return np.array([json.loads(line)["score"] for line in out.read_text().splitlines()], np.float32)


@pytest.fixture(scope="module")
def labelled(qwen3_causal) -> Scorer:
    """A tiny CausalLM with labels given as keyword overrides (no profile applies to its directory)."""
    return Scorer.from_pretrained(qwen3_causal, label_tokens=LABELS)


@pytest.fixture
def profiled_dir(qwen3_causal, copy_model):
    """A copy of the tiny CausalLM carrying score_batch.json."""
    model_dir = copy_model(qwen3_causal)
    (model_dir / "score_batch.json").write_text(json.dumps(PROFILE))
    return model_dir


# --- engine/run/ranking.py -----------------------------------------------------------------------------


def plain_order(scores) -> list[int]:
    """Best first by a plain sort: descending score, then input order; failed items dropped."""
    scored = [i for i, s in enumerate(scores) if s is not None and not math.isnan(s)]
    return sorted(scored, key=lambda i: (-scores[i], i))


@pytest.mark.parametrize("seed", range(20))
def test_ranks_and_top_k_equal_a_plain_sort_with_ties_and_failed_items(seed):
    rng = random.Random(seed)
    choices = [0.0, 0.5, 1.0, -2.0, float("inf"), None, float("nan"), np.float32(0.5)]
    scores = [rng.choice(choices) for _ in range(rng.randint(0, 30))]
    expected = plain_order(scores)
    assert top_k_order(scores, None) == expected
    for k in (0, 1, 3, len(scores), len(scores) + 5):
        assert top_k_order(scores, k) == expected[:k]
    got = ranks(scores)
    assert [got[i] for i in expected] == list(range(1, len(expected) + 1))
    assert all(got[i] is None for i in range(len(scores)) if i not in expected)


def test_ranking_ties_keep_input_order_and_bad_k_is_refused():
    assert ranks([0.2, 0.9, 0.2, None, 0.9]) == [3, 1, 4, None, 2]
    assert top_k_order([0.2, 0.9, 0.2, float("nan"), 0.9], 3) == [1, 4, 0]
    assert ranks([]) == [] and top_k_order([], 2) == []
    with pytest.raises(ValueError):
        top_k_order([1.0], -1)


# --- Scorer.from_pretrained: profiles as the CLI resolves them ---------------------------------------


def test_predict_equals_the_cli_for_a_builtin_profile_with_an_override(qwen3_causal, tmp_path):
    scorer = Scorer.from_pretrained(qwen3_causal, profile="yes-no-judge", apply_softmax=False)
    assert scorer.profile.name == "yes-no-judge" and scorer.scoring.apply_softmax is False
    assert scorer.scoring.query_template == builtin_profiles()["yes-no-judge"].settings["query_template"]
    expected = cli_scores(
        tmp_path, "--model", qwen3_causal, "--profile", "yes-no-judge", "--no-apply-softmax"
    )
    assert max_abs_diff(scorer.predict(PAIRS), expected) <= 1e-6


def test_a_model_dir_with_score_batch_json_needs_no_arguments(profiled_dir, tmp_path):
    scorer = Scorer.from_pretrained(profiled_dir)
    assert scorer.profile.name == "score_batch.json"
    assert scorer.scoring == ScoringConfig(
        query_template=PROFILE["query_template"],
        item_template=PROFILE["item_template"],
        label_tokens=LABELS,
        apply_softmax=True,
        truncate="longest-first",  # the Python API's default: CrossEncoder truncates
    )
    scores = scorer.predict(PAIRS)  # a CausalLM label scorer: its `score` (the last label's probability)
    assert scores.dtype == np.float32 and scores.shape == (len(PAIRS),)
    # activation_fn runs on the labels' log-odds, CrossEncoder's LogitScore logit: (n,) as CrossEncoder returns
    log_odds = scorer.predict(PAIRS, activation_fn=torch.nn.Identity())
    assert log_odds.shape == (len(PAIRS),)
    assert max_abs_diff(torch.sigmoid(torch.from_numpy(log_odds)).numpy(), scores) <= 1e-6
    assert max_abs_diff(scorer.predict(PAIRS, activation_fn=torch.nn.Sigmoid()), scores) <= 1e-6
    assert max_abs_diff(scorer.predict(PAIRS, apply_softmax=True), scores) <= 1e-6  # (n,): nothing to softmax
    groups = scorer.score([Group(q, [d]) for q, d in PAIRS])  # every label's probability stays in `scores`
    assert max_abs_diff(np.concatenate([g.scores[:, -1] for g in groups]), scores) <= 1e-6
    assert max_abs_diff(scores, cli_scores(tmp_path, "--model", profiled_dir)) <= 1e-6
    # An EngineConfig with the default ScoringConfig still gets the profile.
    again = Scorer.from_pretrained(profiled_dir, EngineConfig(device="cpu", backend="sdpa"))
    assert again.scoring == dataclasses.replace(scorer.scoring, truncate="error")  # the config's own default
    assert max_abs_diff(again.predict(PAIRS), scores) <= 1e-5


def test_overrides_and_an_explicit_scoring_config(profiled_dir, tmp_path):
    overridden = Scorer.from_pretrained(profiled_dir, apply_softmax=False, label_token_ids=(5, 7))
    cfg = overridden.scoring
    assert cfg.apply_softmax is False and cfg.label_token_ids == (5, 7) and cfg.label_tokens == ()
    assert cfg.query_template == PROFILE["query_template"]  # the rest still comes from the profile
    expected = cli_scores(tmp_path, "--model", profiled_dir, "--no-apply-softmax", "--label-token-ids", "5,7")
    assert max_abs_diff(overridden.predict(PAIRS), expected) <= 1e-6
    # A non-default ScoringConfig is taken as given: no profile; keyword overrides still apply to it.
    explicit = ScoringConfig(label_tokens=(" the",))
    plain = Scorer.from_pretrained(profiled_dir, EngineConfig(scoring=explicit))
    assert plain.profile is None and plain.scoring == explicit
    widened = Scorer.from_pretrained(profiled_dir, EngineConfig(scoring=explicit), label_tokens=list(LABELS))
    assert widened.scoring == ScoringConfig(label_tokens=LABELS)  # as given: truncate stays "error"
    with pytest.raises(ScoringInputError, match="profile='yes-no-judge' was given together"):
        Scorer.from_pretrained(profiled_dir, EngineConfig(scoring=explicit), profile="yes-no-judge")


def test_bad_overrides_name_the_field(qwen3_causal):
    with pytest.raises(ScoringInputError, match="unknown scoring setting 'label_token'"):
        Scorer.from_pretrained(qwen3_causal, label_token=" yes")
    with pytest.raises(
        SettingError, match="ScoringConfig.label_tokens=' yes' must be a list or tuple of str"
    ):
        Scorer.from_pretrained(qwen3_causal, label_tokens=" yes")
    with pytest.raises(SettingError, match="ScoringConfig.apply_softmax='false' must be True/False"):
        Scorer.from_pretrained(qwen3_causal, label_tokens=LABELS, apply_softmax="false")
    with pytest.raises(SettingError, match="ScoringConfig.packing='pairs' is not one of"):
        Scorer.from_pretrained(qwen3_causal, label_tokens=LABELS, packing="pairs")
    with pytest.raises(ScoringInputError, match="neither a file nor a built-in profile"):
        Scorer.from_pretrained(qwen3_causal, profile="nope")


# --- predict -----------------------------------------------------------------------------------------


def test_predict_equals_plain_hf_in_input_order(labelled, qwen3_causal):
    tok = tokenizer(str(qwen3_causal))
    label_ids = [tok.encode(t, add_special_tokens=False)[0] for t in LABELS]
    scores = labelled.predict(PAIRS)
    for (query, item), got in zip(PAIRS, scores):
        expected, _ = reference_scores(
            qwen3_causal, "causal", reference_sequence(qwen3_causal, query, item), label_ids
        )
        assert abs(float(expected[-1]) - float(got)) <= 1e-4


def test_predict_groups_by_query_and_chunks_without_changing_scores(labelled):
    scores = labelled.predict(PAIRS)
    one_by_one = np.array([labelled.predict(pair) for pair in PAIRS])  # one pair: a scalar
    assert max_abs_diff(scores, one_by_one) <= 1e-5
    assert max_abs_diff(labelled.predict(PAIRS, batch_size_hint=2), scores) <= 1e-5
    assert labelled.predict([]).shape == (0,) and labelled.rank("q", []) == []


def test_predict_failed_items_are_nan_with_errors(qwen3_causal, labelled, caplog):
    strict = Scorer.from_pretrained(qwen3_causal, label_tokens=LABELS, truncate="error")
    pairs = [("I pledge allegiance", " to"), ("", " orphan"), ("I pledge allegiance", "x" * 20000)]
    with caplog.at_level(logging.WARNING, logger="score_batch.engine"):
        scores, errors = strict.predict(pairs, return_errors=True)
    assert np.isfinite(scores[0]) and errors[0] is None
    assert np.isnan(scores[1]) and errors[1].startswith("pairs[1]: query is empty")
    assert (
        np.isnan(scores[2])
        and errors[2].startswith("pairs[2]: item has")
        and "set truncate to item-tail" in errors[2]
    )
    assert "2 of 3 items could not be scored" in caplog.text
    assert np.isnan(strict.predict(pairs)[1])
    truncated = labelled.predict(pairs)  # the default, longest-first, cuts the long item to fit
    assert np.isnan(truncated[1]) and np.isfinite(truncated[2])


def test_predict_refuses_malformed_pairs(labelled):
    with pytest.raises(ScoringInputError, match=r"pairs\[1\] must be a \(query, item\) pair"):
        labelled.predict([("q", "i"), ("only one",)])
    with pytest.raises(ScoringInputError, match=r"pairs\[0\]\[1\] \(the item\) must be a str"):
        labelled.predict([("q", None)])


# --- rank / rank_many --------------------------------------------------------------------------------


def test_rank_sorts_predict_scores_with_top_k_and_items(labelled):
    query = "I pledge allegiance"
    items = [" to", " the flag of", "", " to the United States", " of"]
    scores = labelled.predict([(query, item) for item in items])  # the score column: score_index -1
    ranked = labelled.rank(query, items)
    assert [r["corpus_id"] for r in ranked] == plain_order(scores.tolist())
    assert all(abs(r["score"] - float(scores[r["corpus_id"]])) <= 1e-6 for r in ranked)
    assert all(set(r) == {"corpus_id", "score"} for r in ranked)
    top = labelled.rank(query, items, top_k=2, return_documents=True)
    assert [(r["corpus_id"], r["text"]) for r in top] == [
        (i, items[i]) for i in plain_order(scores.tolist())[:2]
    ]
    assert len(labelled.rank(query, items, top_k=50)) == len(items)


def test_rank_many_equals_rank_per_query(labelled):
    requests = [
        ("I pledge allegiance", [" to", " the flag of", ""]),
        ("Tokyo is a city in", [" Japan", " the country"]),
        ("nobody asked", []),
    ]
    batched = labelled.rank_many(requests, top_k=2, return_documents=True)
    assert len(batched) == 3 and batched[2] == []
    for (query, items), got in zip(requests, batched):
        alone = labelled.rank(query, items, top_k=2, return_documents=True)
        assert [r["corpus_id"] for r in got] == [r["corpus_id"] for r in alone]
        assert all(abs(a["score"] - b["score"]) <= 1e-5 for a, b in zip(got, alone))
        assert all(r["text"] == items[r["corpus_id"]] for r in got)


def test_rank_ties_keep_input_order_and_failed_items_are_left_out(labelled, monkeypatch):
    def fake_score(groups, on_items=None):  # fixed scores: ties and a failed item
        values = np.array([0.5, 0.9, np.nan, 0.5, 0.9], np.float32)[: len(groups[0].items)]
        errors = [None if np.isfinite(v) else "failed" for v in values]
        return [GroupResult(values[:, None], values, None, errors)]

    monkeypatch.setattr(labelled, "score", fake_score)
    ranked = labelled.rank("q", ["a", "b", "c", "d", "e"])
    assert [r["corpus_id"] for r in ranked] == [1, 4, 0, 3]
    assert [r["corpus_id"] for r in labelled.rank("q", list("abcde"), top_k=3)] == [1, 4, 0]


def test_rank_refuses_bad_arguments(labelled):
    with pytest.raises(ScoringInputError, match="documents must be a list of documents, got str"):
        labelled.rank("q", "a single string")
    with pytest.raises(ScoringInputError, match="top_k must be a non-negative integer"):
        labelled.rank("q", ["a"], top_k=-1)
    with pytest.raises(
        ScoringInputError, match=r"queries_and_documents\[0\] must be a \(query, documents\) pair"
    ):
        labelled.rank_many(["q"])


# --- issue 14: a softmax over a single score is always 1.0 ---------------------------------------------


def test_one_label_with_softmax_is_refused(qwen3_causal, zoo, tmp_path):
    with pytest.raises(
        SettingError, match="ScoringConfig.apply_softmax=True makes every score 1.0"
    ) as caught:
        Scorer.from_pretrained(qwen3_causal, label_tokens=(" yes",), apply_softmax=True)
    assert caught.value.setting == "ScoringConfig.apply_softmax"
    Scorer.from_pretrained(qwen3_causal, label_tokens=(" yes",))  # the label's probability is fine
    single_logit = zoo.get("qwen3", "classifier", num_labels=1)
    with pytest.raises(SettingError, match="num_labels=1"):
        Scorer.from_pretrained(single_logit, apply_softmax=True)
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    cli = run_cli(
        src, "-o", tmp_path / "o.jsonl", "--model", qwen3_causal, "--label-tokens", " yes", "--apply-softmax"
    )
    assert cli.returncode == 2 and "--apply-softmax" in cli.stderr and "every score 1.0" in cli.stderr


@pytest.mark.parametrize("name", sorted(builtin_profiles()))
def test_no_builtin_profile_softmaxes_a_single_label(name):
    settings = builtin_profiles()[name].settings
    labels = settings.get("label_tokens") or settings.get("label_token_ids") or ()
    assert not (settings.get("apply_softmax") and len(labels) == 1)
