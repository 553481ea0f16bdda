"""Scorer.predict / rank against the real sentence-transformers CrossEncoder on tiny local BERT cross-encoders."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from score_batch import Scorer

st = pytest.importorskip("sentence_transformers")

QUERY = "What is the capital of California?"
DOCS = [
    " Sacramento",
    "San Jose is a city",
    " Los Angeles",
    "the quick brown fox",
    "Tokyo is a city in Japan",
]
PAIRS = [(QUERY, d) for d in DOCS] + [("Tokyo is a city", " in Japan"), ("red running shoes", "for women")]
SIGMOID = "torch.nn.modules.activation.Sigmoid"
IDENTITY = "torch.nn.modules.linear.Identity"


@pytest.fixture(scope="module", params=[(1, None), (2, None), (1, IDENTITY), (2, SIGMOID)], ids=str)
def models(request, zoo, tmp_path_factory):
    """(our Scorer, CrossEncoder) of one tiny BERT cross-encoder: num_labels, activation_fn in config.json."""
    num_labels, activation = request.param
    source = zoo.get("bert", "classifier", num_labels=num_labels)
    model_dir = tmp_path_factory.mktemp("ce") / source.name
    shutil.copytree(source, model_dir)
    if activation is not None:
        config = json.loads((model_dir / "config.json").read_text())
        config["sentence_transformers"] = {"activation_fn": activation}
        (model_dir / "config.json").write_text(json.dumps(config))
    ours = Scorer(str(model_dir), device="cpu")
    theirs = st.CrossEncoder(str(model_dir), device="cpu")
    return ours, theirs, num_labels, activation


def same(ours, theirs):
    """Same type, shape, dtype and values (<= 1e-5)."""
    assert type(ours) is type(theirs)
    if isinstance(theirs, list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            same(a, b)
        return
    if isinstance(theirs, torch.Tensor | np.ndarray | np.generic):
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        a = ours.cpu().numpy() if isinstance(ours, torch.Tensor) else np.asarray(ours)
        b = theirs.cpu().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
        assert np.abs(a.astype(np.float64) - b).max(initial=0) <= 1e-5
        return
    assert abs(ours - theirs) <= 1e-5


def test_activation_auto_is_what_the_model_says(models):
    ours, _, num_labels, activation = models
    expected = {None: "sigmoid" if num_labels == 1 else "softmax", IDENTITY: "none", SIGMOID: "sigmoid"}[
        activation
    ]
    assert ours.activation.name == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"convert_to_tensor": True},
        {"convert_to_numpy": False},
        {"activation_fn": torch.nn.Identity()},
        {"activation_fn": torch.nn.Sigmoid(), "apply_softmax": True},
        {"apply_softmax": True, "batch_size": 2, "show_progress_bar": False},
    ],
    ids=str,
)
def test_predict_equals_cross_encoder(models, kwargs):
    ours, theirs, num_labels, _ = models
    same(ours.predict(PAIRS, **kwargs), theirs.predict(PAIRS, **kwargs))
    same(ours.predict(PAIRS[2], **kwargs), theirs.predict(PAIRS[2], **kwargs))  # one pair: scalar or a row
    same(ours.predict([PAIRS[1]], **kwargs), theirs.predict([PAIRS[1]], **kwargs))
    if not kwargs:
        assert ours.predict(PAIRS).shape == ((len(PAIRS),) if num_labels == 1 else (len(PAIRS), num_labels))


def test_predict_of_nothing_equals_cross_encoder(models):
    ours, theirs, _, _ = models
    same(ours.predict([]), theirs.predict([]))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"top_k": 2},
        {"return_documents": True},
        {"top_k": 3, "return_documents": True},
        {"activation_fn": torch.nn.Identity()},
    ],
    ids=str,
)
def test_rank_equals_cross_encoder(models, kwargs):
    ours, theirs, num_labels, _ = models
    got = ours.rank(QUERY, DOCS, **kwargs)
    if num_labels != 1:  # CrossEncoder ranks only one-label models; ours ranks by the activated score column
        with pytest.raises(ValueError):
            theirs.rank(QUERY, DOCS, **kwargs)
        given = {"activation_fn": kwargs["activation_fn"]} if kwargs.get("activation_fn") else {}
        if not given and ours.activation.name == "softmax":
            given = {"apply_softmax": True}  # auto: the softmax probability of the score_index class
        scores = ours.predict([(QUERY, d) for d in DOCS], **given)
        expected_order = sorted(range(len(DOCS)), key=lambda i: -float(scores[i][-1]))[: kwargs.get("top_k")]
        assert [r["corpus_id"] for r in got] == expected_order
        return
    want = theirs.rank(QUERY, DOCS, **kwargs)
    assert [list(r) for r in got] == [list(r) for r in want]  # same keys in the same order
    assert [r["corpus_id"] for r in got] == [r["corpus_id"] for r in want]
    assert all(type(a["score"]) is float and abs(a["score"] - b["score"]) <= 1e-5 for a, b in zip(got, want))
    assert [r.get("text") for r in got] == [r.get("text") for r in want]


def test_rank_ties_keep_input_order_as_cross_encoder(models):
    ours, theirs, num_labels, _ = models
    if num_labels != 1:
        pytest.skip("CrossEncoder ranks one-label models only")
    docs = [" Sacramento", " Los Angeles", " Sacramento", " Los Angeles"]  # exact duplicates tie
    got, want = ours.rank(QUERY, docs), theirs.rank(QUERY, docs)
    assert [r["corpus_id"] for r in got] == [r["corpus_id"] for r in want]


def test_cli_score_column_equals_cross_encoder(models, tmp_path):
    """The CLI's `score` is CrossEncoder.predict's number for one-label heads (its default activation, or the
    model's activation_fn); for a two-label head, the softmax probability of the last class (our auto), the
    raw logits staying in `scores`."""
    from tests.test_cli import run_cli, write_jsonl

    ours, theirs, num_labels, activation = models
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": q, "item": d} for q, d in PAIRS])
    out = tmp_path / "out.jsonl"
    result = run_cli(data, "-o", out, "--model", ours.setup.info.path)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    got = np.array([line["score"] for line in lines])
    raw = np.array([line["scores"] for line in lines])
    logits = theirs.predict(PAIRS, activation_fn=torch.nn.Identity())
    assert np.abs(raw.reshape(logits.shape) - logits).max() <= 1e-5  # `scores`: the raw head
    if num_labels == 1:
        expected = theirs.predict(PAIRS)  # CrossEncoder's default activation for this model
    elif activation == SIGMOID:
        expected = torch.sigmoid(torch.from_numpy(logits)).numpy()[:, -1]
    else:
        expected = torch.softmax(torch.from_numpy(logits), -1).numpy()[:, -1]
    assert np.abs(got - expected).max() <= 1e-5
