"""A decoder classifier is read where transformers reads it: at the last token that is not its pad_token_id.

transformers' *ForSequenceClassification pools the logits of the rightmost token whose id is not
config.pad_token_id, so a reference sequence ending in that id (a reward model whose pad is its eos, and a
template ending in eos) is scored before it. Every score here is compared with a plain Hugging Face forward
pass of the reference sequence (tests/reference.py), whose pooling is transformers' own.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from score_batch.engine import Group

from tests.reference import _load, reference_scores
from tests.test_scorer import make_scorer

PAD = 7  # the tiny models' pad_token_id here: an ordinary token of their vocabulary
QUERY = [11, 12, 13, 14]
ITEMS = [[20, 21, PAD], [22, PAD, PAD], [PAD], [23, 24], [25, PAD, 26], [], [20, 21]]


@pytest.fixture(scope="module")
def classifier(zoo):
    return zoo.get("qwen3", "classifier", pad_token_id=PAD)


def hf_pooled(model_dir, sequence: list[int]) -> np.ndarray:
    """The final hidden state where transformers pools a classifier: the last token that is not PAD."""
    model = _load(str(model_dir), "classifier")
    with torch.no_grad():
        hidden = model.model(torch.tensor([sequence])).last_hidden_state[0]
    row = max((i for i, token in enumerate(sequence) if token != PAD), default=0)
    return hidden[row].numpy()


@pytest.mark.parametrize("packing", ["mis", "single"])
def test_items_ending_in_the_pad_id_score_as_transformers_reads_them(classifier, packing):
    scorer = make_scorer(classifier, kind="classifier", packing=packing, pooled_hidden_states=True)
    (result,) = scorer.score([Group(QUERY, ITEMS)])
    for k, item in enumerate(ITEMS):
        scores, _ = reference_scores(classifier, "classifier", QUERY + item)
        assert np.abs(result.scores[k] - scores).max() <= 1e-5, (item, result.scores[k], scores)
        assert np.abs(result.pooled[k] - hf_pooled(classifier, QUERY + item)).max() <= 1e-4
    # [20, 21, PAD] and [20, 21] are one sequence to the model: scored once, the same bits
    assert np.array_equal(result.scores[0], result.scores[-1])


def test_item_first_drops_the_query_tail(classifier):
    query = [11, 12, PAD]  # item + query: the reference ends with the query
    items = [[20, 21], [PAD, 22, PAD]]
    scorer = make_scorer(classifier, kind="classifier", item_first=True)
    (result,) = scorer.score([Group(query, items)])
    for k, item in enumerate(items):
        scores, _ = reference_scores(classifier, "classifier", item + query)
        assert np.abs(result.scores[k] - scores).max() <= 1e-5


def test_a_causal_model_still_reads_the_last_token(zoo):
    causal = zoo.get("qwen3", "causal", pad_token_id=PAD)
    labels = [20, 21]
    scorer = make_scorer(causal, label_token_ids=labels)
    items = [[20, 21, PAD], [PAD]]
    (result,) = scorer.score([Group(QUERY, items)])
    for k, item in enumerate(items):
        scores, _ = reference_scores(causal, "causal", QUERY + item, label_ids=labels)  # logits[-1]
        assert np.abs(result.scores[k] - scores).max() <= 1e-6


def test_chunk_windows_drop_the_tail_too(classifier):
    items = [[20, 21, PAD], [PAD] * 9]  # fits one window; pad-id tokens only, three windows
    scorer = make_scorer(classifier, kind="classifier", truncate="chunk", max_item_tokens=4)
    (result,) = scorer.score([Group(QUERY, items)])
    assert list(result.chunks) == [1, 3]
    for k, item in enumerate(items):
        scores, _ = reference_scores(classifier, "classifier", QUERY + item)  # read at 21, at the query's end
        assert np.abs(result.scores[k] - scores).max() <= 1e-5
