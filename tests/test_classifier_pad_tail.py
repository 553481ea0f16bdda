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


@pytest.mark.parametrize(
    ("packing", "max_pack_tokens"),
    [("mis", 8192), ("mis", 16), ("single", 8192)],
    ids=["mis", "packs", "single"],
)
@pytest.mark.parametrize("query", [[11, 12, 13, PAD], [PAD, PAD]], ids=["query-tail", "query-all-pad"])
def test_a_query_ending_in_the_pad_id_is_read_where_transformers_reads_it(
    classifier, packing, max_pack_tokens, query
):
    # items left empty are read at the query's last non-pad token (the first when it has none); the others
    # still see the whole query, its pad-id tail included
    items = [[PAD, PAD], [], [20, 21], [22, PAD], [23], [24, 25, 26, 27, 28]]
    scorer = make_scorer(classifier, kind="classifier", packing=packing, max_pack_tokens=max_pack_tokens)
    (result,) = scorer.score([Group(query, items)])
    for k, item in enumerate(items):
        scores, _ = reference_scores(classifier, "classifier", query + item)
        assert np.abs(result.scores[k] - scores).max() <= 1e-5, (item, result.scores[k], scores)


def test_item_first_with_nothing_but_pad_ids_reads_the_first_token(classifier):
    query = [PAD]  # cut to nothing: every reference sequence ends with an item
    items = [[], [PAD, PAD], [20, PAD], [PAD, 21]]
    scorer = make_scorer(classifier, kind="classifier", item_first=True)
    (result,) = scorer.score([Group(query, items)])
    for k, item in enumerate(items):
        scores, _ = reference_scores(classifier, "classifier", item + query)
        assert np.abs(result.scores[k] - scores).max() <= 1e-5, (item, result.scores[k], scores)


def test_a_composite_config_gives_its_text_pad_id(tmp_path):
    # Gemma 3 keeps pad_token_id in text_config; transformers pools at config.get_text_config().pad_token_id
    from transformers import Gemma3Config

    from score_batch.engine.model.loading import read_model_info

    text = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16)
    Gemma3Config(
        text_config={**text, "num_key_value_heads": 2, "pad_token_id": PAD},
        architectures=["Gemma3ForSequenceClassification"],
    ).save_pretrained(tmp_path)
    assert read_model_info(tmp_path).unscored_tail_id == PAD


def test_request_truncation_measures_whole_pairs_pad_ids_included(zoo):
    # truncate_prompt_tokens keeps the pair's last (left) or first (right) tokens, pad ids included, and the
    # kept tokens are then read as transformers reads them; a right cut of query tokens only stays refused
    from score_batch.engine.plan.pair_truncation import tei_truncated_pairs, truncated_pairs

    model_dir = zoo.get("qwen3", "classifier")  # pad_token_id 0: the tokenizer's <|endoftext|>
    scorer = make_scorer(model_dir, kind="classifier", max_pack_tokens=8)
    tok, eos = scorer.planner.tokenizer, "<|endoftext|>"
    assert tok.convert_tokens_to_ids(eos) == 0

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    for query, item, keep, side in [
        ("Tokyo city" + eos * 2, "", 3, "left"),
        ("Tokyo city", "Japan" + eos * 2, 3, "left"),
        ("Tokyo city" + eos * 2, "Japan", 3, "right"),
    ]:
        whole = ids(query) + ids(item)
        cut = truncated_pairs(query, [item], keep, side, scorer.planner)
        if side == "right":  # [Tokyo, city, eos]: nothing of the item is kept
            assert "keeps only tokens of the query" in cut[0]
            continue
        (result,) = scorer.score([cut[0]])
        expected, _ = reference_scores(model_dir, "classifier", whole[-keep:])
        assert np.abs(result.scores[0] - expected).max() <= 1e-5, (query, item, cut[0])
    # TEI's truncate cuts a pair over the model's limit (8 tokens here, less the packing's overhead), pads included
    query, item = "Tokyo city", "Japan" + eos * 6
    (group,) = tei_truncated_pairs(query, [item], "right", scorer.planner).values()
    assert group.query + group.items[0] == (ids(query) + ids(item))[: len(group.query + group.items[0])]
    (result,) = scorer.score([group])
    assert result.errors[0] is None
    expected, _ = reference_scores(model_dir, "classifier", group.query + group.items[0])
    assert np.abs(result.scores[0] - expected).max() <= 1e-5


@pytest.mark.parametrize("truncate", ["error", "chunk"])
def test_usage_counts_the_pad_ids_the_pairs_hold(classifier, truncate):
    # the report's input tokens (and a batch file's prompt_tokens) count whole pairs; the read cut is the engine's
    query, items = [11, 12, PAD, PAD], [[], [20], [21, PAD], [22, 23, 24, PAD]]
    scorer = make_scorer(
        classifier, kind="classifier", truncate=truncate, max_item_tokens=4 if truncate == "error" else 3
    )
    plan = scorer.plan([Group(query, items)])
    windows = [[i] for i in items]  # chunk: three tokens a window, no overlap
    if truncate == "chunk":
        windows[-1] = [[22, 23, 24], [PAD]]
    assert plan.stats.pairwise_tokens == sum(len(query + w) for ws in windows for w in ws)
    assert [len(ids) for ids in plan.tokenized[0].item_ids] == [len(i) for i in items]
