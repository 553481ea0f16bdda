"""Model coverage: decoder reward models / classifiers of every listed family, and encoder cross-encoders."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from score_batch.engine import EngineConfig, Group, ScoringConfig, ScoringInputError
from tests.reference import max_abs_diff, tokenizer
from tests.test_scorer import GROUPS, assert_matches_reference, make_scorer

DECODER_FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi3"]


@pytest.mark.parametrize("family", DECODER_FAMILIES)
@pytest.mark.parametrize("num_labels", [1, 3])
def test_decoder_classifiers_match_plain_hf(zoo, family, num_labels):
    model_dir = zoo.get(
        family, "classifier", add_bos=family in ("llama", "gemma", "gemma2"), num_labels=num_labels
    )
    results = make_scorer(model_dir, "classifier", backend="split", pooled_hidden_states=True).score(GROUPS)
    assert_matches_reference(model_dir, "classifier", GROUPS, results)
    assert results[0].scores.shape == (4, num_labels)


@pytest.mark.parametrize("family", ["gemma", "gemma2", "phi3"])
def test_new_decoder_families_causal_match_plain_hf(zoo, family):
    model_dir = zoo.get(family, "causal", add_bos=family != "phi3")
    results = make_scorer(model_dir, backend="split", pooled_hidden_states=True).score(GROUPS[:3])
    assert_matches_reference(model_dir, "causal", GROUPS[:3], results)


@pytest.mark.parametrize("backend", ["sdpa", "split", "flex"])
def test_gemma2_soft_capping_and_windows_are_exact_on_every_backend(zoo, backend):
    # A strong cap (2.0) and a 4-token window change the logits visibly: the backend must apply both.
    model_dir = zoo.get(
        "gemma2", "causal", add_bos=True, attn_logit_softcapping=2.0, final_logit_softcapping=3.0
    )
    for packing in ("mis", "single"):
        results = make_scorer(model_dir, backend=backend, packing=packing).score(GROUPS[:3])
        assert_matches_reference(model_dir, "causal", GROUPS[:3], results)


def _encoder_reference(model_dir, query: str, item: str):
    """Plain HF: the pair alone (no padding), logits and the CLS / mean hidden state of its backbone."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    encoding = tokenizer(str(model_dir))([[query, item]], return_tensors="pt")  # a batch: "" stays a pair
    with torch.no_grad():
        logits = model(**encoding).logits[0]
        hidden = getattr(model, model.base_model_prefix)(**encoding).last_hidden_state[0]  # [len, hidden]
    pooled = hidden.mean(0) if getattr(model.config, "classifier_pooling", "cls") == "mean" else hidden[0]
    return logits.numpy(), pooled.numpy()


ENCODERS = [
    ("bert", {}),
    ("xlm-roberta", {}),
    ("modernbert", {}),
    ("modernbert", {"classifier_pooling": "mean"}),
]


@pytest.mark.parametrize(("family", "overrides"), ENCODERS)
def test_encoder_cross_encoders_match_plain_hf_pairs(zoo, family, overrides):
    model_dir = zoo.get(family, "classifier", **overrides)
    groups = [g for g in GROUPS if g.query]
    scorer = make_scorer(
        model_dir, "classifier", backend="auto", pooled_hidden_states=True, max_batch_tokens=64
    )
    assert scorer.setup.packing == "single" and scorer.setup.backend == "hf"
    plan = scorer.plan(groups)
    assert len({b.input_ids.shape[1] for b in plan.batches}) > 1  # several padded widths were run
    results = scorer.run(plan)
    worst = 0.0
    for group, result in zip(groups, results):
        for i, item in enumerate(group.items):
            logits, pooled = _encoder_reference(model_dir, group.query, item)
            worst = max(worst, max_abs_diff(logits, result.scores[i]), max_abs_diff(pooled, result.pooled[i]))
    assert worst <= 1e-4, worst
    if family == "bert":
        assert plan.batches[0].token_type_ids is not None and plan.batches[0].token_type_ids.max() == 1


def test_encoder_scores_equal_sentence_transformers_cross_encoder(zoo):
    st = pytest.importorskip("sentence_transformers")
    model_dir = zoo.get("bert", "classifier", num_labels=1)
    # Empty items are left out here: tests/test_st_parity.py compares them with CrossEncoder 6.2.
    groups = [Group(g.query, [item for item in g.items if item]) for g in GROUPS if g.items]
    results = make_scorer(model_dir, "classifier", backend="auto").score(groups)
    pairs = [(g.query, item) for g in groups for item in g.items]
    expected = st.CrossEncoder(str(model_dir), device="cpu").predict(pairs, activation_fn=torch.nn.Identity())
    ours = np.concatenate(
        [r.scores[:, 0] for r in results]
    )  # the raw logit: `scores` keeps the Score-API contract
    assert max_abs_diff(expected, ours) <= 1e-4


def test_mis_on_an_encoder_is_refused(zoo):
    model_dir = zoo.get("bert", "classifier")
    with pytest.raises(ScoringInputError, match="bidirectional encoder"):
        make_scorer(model_dir, "classifier", backend="auto", packing="mis")


def test_encoder_pair_limits(zoo):
    model_dir = zoo.get("bert", "classifier", max_position_embeddings=24)
    long_item = " the quick brown fox jumps over the lazy dog" * 3
    group = Group("Tokyo is a city in", [" Japan", long_item])
    failed = make_scorer(model_dir, "classifier", backend="auto").score([group])[0]
    assert failed.errors[0] is None and "over the model's limit of 24" in failed.errors[1]
    cut = make_scorer(model_dir, "classifier", backend="auto", truncate="item-tail").score([group])[0]
    assert cut.errors == [None, None] and np.isfinite(cut.scores).all()
    encoding = tokenizer(str(model_dir))(group.query, long_item, truncation="only_second", max_length=24)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        expected = model(
            torch.tensor([encoding["input_ids"]]), token_type_ids=torch.tensor([encoding["token_type_ids"]])
        ).logits[0]
    assert max_abs_diff(expected.numpy(), cut.scores[1]) <= 1e-4
    with pytest.raises(ScoringInputError, match="do not apply"):
        make_scorer(model_dir, "classifier", backend="auto", max_item_tokens=8)


def test_encoder_token_id_input_is_a_row_error(zoo):
    model_dir = zoo.get("bert", "classifier")
    result = make_scorer(model_dir, "classifier", backend="auto").score([Group([5, 6, 7], [[8, 9]])])[0]
    assert "takes text" in result.errors[0] and np.isnan(result.score[0])


def test_encoder_decoder_models_are_refused(tmp_path):
    from transformers import AutoConfig

    from score_batch.engine.model.loading import read_model_info

    AutoConfig.for_model("t5", architectures=["T5ForSequenceClassification"]).save_pretrained(tmp_path)
    with pytest.raises(ScoringInputError, match="encoder-decoder"):
        read_model_info(tmp_path)
    assert EngineConfig().scoring.packing == "auto" and ScoringConfig().packing == "auto"
