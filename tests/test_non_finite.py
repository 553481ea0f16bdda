"""A NaN embedding row: items holding that token become item errors; every other item keeps its clean score."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig
from score_batch.engine.run.results import non_finite_message
from tests.reference import max_abs_diff, reference_scores, reference_sequence, tokenizer

LABELS = (" yes", " no")
POISON = " Japan"  # its last token's embedding row becomes NaN
GROUPS = [
    Group(
        "Tokyo is a city in", [" the country", " Japan", " the flag of", " Japan and the capital", " yes no"]
    ),
    Group("What is the capital of California?", [" Sacramento", " San Jose", " the lazy dog"]),
]


def poison(src, dst, key_suffix: str, token: int):
    """Copy a model directory with the embedding row of token set to NaN."""
    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    key = next(k for k in weights if k.endswith(key_suffix))
    weights[key][token] = float("nan")
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def poisoned_items(model_dir, groups, token: int) -> set[tuple[int, int]]:
    """(group, item) of the items whose text holds the poisoned token."""
    tok = tokenizer(str(model_dir))
    return {
        (g, i)
        for g, group in enumerate(groups)
        for i, item in enumerate(group.items)
        if token in tok(item, add_special_tokens=False)["input_ids"]
    }


@pytest.fixture(scope="module")
def decoder(qwen3_causal, tmp_path_factory):
    """(clean dir, poisoned dir, poisoned token) of the tiny CausalLM."""
    token = tokenizer(str(qwen3_causal))(POISON, add_special_tokens=False)["input_ids"][-1]
    bad = poison(qwen3_causal, tmp_path_factory.mktemp("nan") / "qwen3", "embed_tokens.weight", token)
    return qwen3_causal, bad, token


@pytest.mark.parametrize(
    "backend, packing",
    [("sdpa", "mis"), ("split", "mis"), ("sdpa", "single"), ("flex", "mis")],
)
def test_poisoned_items_fail_and_pack_neighbours_keep_their_clean_scores(decoder, backend, packing):
    clean, bad, token = decoder
    poisoned = poisoned_items(clean, GROUPS, token)
    assert poisoned and len(poisoned) < sum(len(g.items) for g in GROUPS)
    scoring = ScoringConfig(label_tokens=LABELS, packing=packing)
    scorer = Scorer.load(bad, EngineConfig(device="cpu", backend=backend, scoring=scoring))
    plan = scorer.plan(GROUPS)
    if packing == "mis":
        assert plan.stats.packs == len(GROUPS)  # every item of a group shares the poisoned items' pack
    label_ids = [tokenizer(str(clean)).encode(t, add_special_tokens=False)[0] for t in LABELS]
    for g, (group, result) in enumerate(zip(GROUPS, scorer.run(plan))):
        assert len(result.item_errors) == len(group.items)
        for i, item in enumerate(group.items):
            if (g, i) in poisoned:
                assert result.item_errors[i] == f"non-finite score (nan) for item {i}"
                assert np.isnan(result.score[i]) and np.isnan(result.scores[i]).all()
                assert result.failures[i] == result.item_errors[i]
            else:
                expected, _ = reference_scores(
                    clean, "causal", reference_sequence(clean, group.query, item), label_ids
                )
                assert result.item_errors[i] is None and result.errors[i] is None
                assert max_abs_diff(result.scores[i], expected) <= 1e-5, (backend, g, i)


def test_encoder_pairs_poisoned_rows_fail_and_the_rest_equal_plain_hf(zoo, tmp_path):
    from transformers import AutoModelForSequenceClassification

    clean = zoo.get("bert", "classifier")
    tok = tokenizer(str(clean))
    token = tok(POISON, add_special_tokens=False)["input_ids"][-1]
    bad = poison(clean, tmp_path / "bert", "word_embeddings.weight", token)
    scorer = Scorer.load(bad, EngineConfig(device="cpu", scoring=ScoringConfig(activation="none")))
    results = scorer.score(GROUPS)
    poisoned = poisoned_items(clean, GROUPS, token)
    model = AutoModelForSequenceClassification.from_pretrained(str(clean)).eval()
    for g, (group, result) in enumerate(zip(GROUPS, results)):
        for i, item in enumerate(group.items):
            if (g, i) in poisoned:
                assert result.item_errors[i] == f"non-finite score (nan) for item {i}"
                assert np.isnan(result.score[i])
                continue
            with torch.no_grad():
                logits = model(**tok(group.query, item, return_tensors="pt")).logits[0].numpy()
            assert result.item_errors[i] is None
            assert max_abs_diff(result.scores[i], logits) <= 1e-5


def test_the_message_names_the_value():
    assert non_finite_message(np.array([1.0, np.inf], np.float32), 3) == "non-finite score (inf) for item 3"
    assert non_finite_message(np.array([-np.inf], np.float32), 0) == "non-finite score (-inf) for item 0"


def test_the_cli_writes_non_finite_items_as_row_errors_never_as_scores(decoder, tmp_path):
    """Through the whole job: default --on-error fail exits 2 naming the item; record writes null + error."""
    import json

    from tests.test_cli import run_cli

    clean, bad, token = decoder
    rows = [
        {"query_id": f"q{g}", "query": group.query, "item": item}
        for g, group in enumerate(GROUPS)
        for item in group.items
    ]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    labels = ["--label-tokens", LABELS[0], "--label-tokens", LABELS[1]]
    failed = run_cli(data, "-o", tmp_path / "f.jsonl", "--model", bad, *labels)
    assert failed.returncode == 2 and "non-finite score (nan)" in failed.stderr
    assert not (tmp_path / "f.jsonl").exists()
    recorded = run_cli(data, "-o", tmp_path / "r.jsonl", "--model", bad, *labels, "--on-error", "record")
    assert recorded.returncode == 0, recorded.stderr
    out = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    poisoned = poisoned_items(clean, GROUPS, token)
    flat = [(g, i) for g, group in enumerate(GROUPS) for i in range(len(group.items))]
    assert len(out) == len(rows)
    for (g, i), line in zip(flat, out):
        if (g, i) in poisoned:
            assert line["score"] is None and "non-finite score (nan)" in line["error"], line
        else:
            assert line["error"] is None and np.isfinite(line["score"]), line
