"""Models by hub id from a local cache, scoring profiles (built-in, beside the model, explicit) and flag precedence."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from score_batch.engine import ScoringInputError
from score_batch.engine.model.profiles import builtin_profiles, choose_profile, merge_profile
from score_batch.engine.model.source import resolve_model_dir
from tests.reference import max_abs_diff, reference_scores, reference_sequence, tokenizer
from tests.test_cli import run_cli, write_jsonl

REPO_ID = "Qwen/Qwen3-Reranker-0.6B"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
ROWS = [
    {"query_id": "a", "query": "capital of Japan", "item_id": "a1", "item": "Tokyo is a city in Japan"},
    {"query_id": "a", "query": "capital of Japan", "item_id": "a2", "item": "red running shoes"},
    {"query_id": "b", "query": "headphones", "item_id": "b1", "item": "wireless noise cancelling headphones"},
]


def fake_hub_cache(root, model_dir, repo_id=REPO_ID):
    """Lay a model out like huggingface_hub's cache: blobs by hash, snapshot symlinks, refs/main."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for file in model_dir.iterdir():
        if file.name == "score_batch.json":
            continue
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copy(file, repo / "blobs" / digest)
        (snapshot / file.name).symlink_to(f"../../blobs/{digest}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_hub_id_resolves_from_hf_hub_cache_and_hf_home(tmp_path, qwen3_causal, monkeypatch):
    snapshot = fake_hub_cache(tmp_path / "home" / "hub", qwen3_causal)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert resolve_model_dir(REPO_ID) == snapshot
    assert resolve_model_dir(f"{REPO_ID}@main") == snapshot
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(ScoringInputError, match="hf download Qwen/Qwen3-Reranker-0.6B") as error:
        resolve_model_dir(REPO_ID)
    assert str(tmp_path / "empty") in str(error.value)
    assert resolve_model_dir(qwen3_causal) == qwen3_causal
    with pytest.raises(ScoringInputError, match="does not exist"):
        resolve_model_dir("./no/such/dir")


def test_qwen3_reranker_by_name_needs_no_other_flag(tmp_path, qwen3_causal):
    fake_hub_cache(tmp_path / "cache", qwen3_causal)
    out = tmp_path / "out.parquet"
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    result = run_cli(src, "-o", out, "--model", REPO_ID, env={"HF_HUB_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    assert "scoring profile: qwen3-reranker" in result.stderr
    profile = builtin_profiles()["qwen3-reranker"].settings
    tok = tokenizer(str(qwen3_causal))
    labels = [tok.encode(t, add_special_tokens=False)[0] for t in profile["label_tokens"]]
    expected = []
    for row in ROWS:
        query = profile["query_template"].replace("{query}", row["query"])
        item = profile["item_template"].replace("{item}", row["item"])
        scores, _ = reference_scores(
            qwen3_causal, "causal", reference_sequence(qwen3_causal, query, item), labels, True
        )
        expected.append(scores[-1])
    assert max_abs_diff(expected, pq.read_table(out).column("score").to_numpy()) <= 1e-4


def test_uncached_hub_id_exits_2_and_says_where_it_looked(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    result = run_cli(
        src, "-o", tmp_path / "o.parquet", "--model", "BAAI/none", env={"HF_HUB_CACHE": str(tmp_path)}
    )
    assert result.returncode == 2
    assert str(tmp_path) in result.stderr and "hf download BAAI/none" in result.stderr
    assert "Traceback" not in result.stderr


def test_profile_precedence(tmp_path, qwen3_causal, copy_model):
    builtins = builtin_profiles()
    assert {"qwen3-reranker", "bge-reranker-v2-gemma", "yes-no-judge"} <= set(builtins)
    # Built-in by hub id or by a local directory named like the model; none for an unknown name.
    assert choose_profile(None, REPO_ID, qwen3_causal).name == "qwen3-reranker"
    named = tmp_path / "Qwen3-Reranker-4B"
    shutil.copytree(qwen3_causal, named)
    assert choose_profile(None, str(named), named).name == "qwen3-reranker"
    assert choose_profile(None, str(qwen3_causal), qwen3_causal) is None
    # score_batch.json beside the model wins over a built-in match; --profile wins over both.
    (named / "score_batch.json").write_text(json.dumps({"label_tokens": [" yes"]}))
    assert choose_profile(None, str(named), named).settings == {"label_tokens": (" yes",)}
    assert choose_profile("yes-no-judge", str(named), named).name == "yes-no-judge"
    custom = tmp_path / "mine.json"
    custom.write_text(json.dumps({"label_token_ids": [5], "apply_softmax": False}))
    assert choose_profile(str(custom), REPO_ID, named).settings == {
        "label_token_ids": (5,),
        "apply_softmax": False,
    }
    with pytest.raises(ScoringInputError, match="yes-no-judge"):
        choose_profile("nope", REPO_ID, named)
    custom.write_text(json.dumps({"label_tokenz": ["x"]}))
    with pytest.raises(ScoringInputError, match="unknown keys"):
        choose_profile(str(custom), REPO_ID, named)
    # Flags override profile values; a flag's label ids replace the profile's label tokens.
    merged = merge_profile(
        builtins["yes-no-judge"].settings, {"apply_softmax": False, "label_token_ids": (1, 2)}
    )
    assert (
        merged["apply_softmax"] is False
        and "label_tokens" not in merged
        and merged["label_token_ids"] == (1, 2)
    )
    assert merged["query_template"] == builtins["yes-no-judge"].settings["query_template"]


def test_explicit_profile_and_flag_override_on_the_command_line(tmp_path, qwen3_causal):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.parquet"
    result = run_cli(
        src, "-o", out, "--model", qwen3_causal, "--profile", "yes-no-judge", "--no-apply-softmax"
    )
    assert result.returncode == 0, result.stderr
    profile = builtin_profiles()["yes-no-judge"].settings
    tok = tokenizer(str(qwen3_causal))
    labels = [tok.encode(t, add_special_tokens=False)[0] for t in profile["label_tokens"]]
    scores = pq.read_table(out).column("scores").to_pylist()
    for row, got in zip(ROWS, scores):
        query = profile["query_template"].replace("{query}", row["query"])
        item = profile["item_template"].replace("{item}", row["item"])
        expected, _ = reference_scores(
            qwen3_causal, "causal", reference_sequence(qwen3_causal, query, item), labels
        )
        assert max_abs_diff(expected, got) <= 1e-4
        assert not np.isclose(sum(got), 1.0)  # the flag turned the profile's softmax off
    bad = run_cli(src, "-o", out, "--model", qwen3_causal, "--profile", "nope", "--overwrite")
    assert bad.returncode == 2 and "yes-no-judge" in bad.stderr


def test_models_command_lists_families_profiles_and_describes_a_model(zoo):
    listing = run_cli("models")
    assert listing.returncode == 0, listing.stderr
    for text in ("Gemma2", "ModernBERT", "qwen3-reranker", "bge-reranker-v2-gemma", "single (pairs)"):
        assert text in listing.stdout
    described = run_cli("models", "--model", zoo.get("bert", "classifier"))
    assert described.returncode == 0 and "auto picks single" in described.stdout
    assert "bidirectional encoder" in described.stdout
    assert "decoder layers: transformers' (an encoder" in described.stdout
    native = run_cli("models", "--model", zoo.get("qwen3", "causal"))
    assert "decoder layers: native" in native.stdout
    gemma = run_cli("models", "--model", zoo.get("gemma", "causal", add_bos=True))
    assert "decoder layers: transformers' (model type 'gemma' has no native layers" in gemma.stdout


def test_encoder_on_the_command_line(tmp_path, zoo):
    model_dir = zoo.get("xlm-roberta", "classifier", num_labels=1)
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    refused = run_cli(src, "-o", tmp_path / "o.parquet", "--model", model_dir, "--packing", "mis")
    assert refused.returncode == 2 and "bidirectional encoder" in refused.stderr
    out = tmp_path / "out.parquet"
    result = run_cli(src, "-o", out, "--model", model_dir, "--pooled-hidden-states")
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out)
    assert table.column_names[:4] == ["query_id", "item_id", "score", "scores"]
    assert table.schema.field("pooled_hidden_state").type.list_size == 64
    assert np.isfinite(table.column("score").to_numpy()).all()


def test_a_profile_may_set_the_activation_and_a_bad_one_is_named():
    from score_batch.engine.errors import ScoringInputError
    from score_batch.engine.model.profiles import parse_profile, scoring_config

    profile = parse_profile("p", "p.json", '{"activation": "none", "apply_softmax": false}')
    assert scoring_config(profile, {}).activation == "none"
    assert scoring_config(profile, {"activation": "sigmoid"}).activation == "sigmoid"
    with pytest.raises(
        ScoringInputError, match='\'activation\' must be one of "auto", "none", "sigmoid", "softmax"'
    ):
        parse_profile("p", "p.json", '{"activation": "tanh"}')


def test_a_profiles_activation_reaches_the_scorer(zoo, copy_model):
    import json

    from score_batch import Scorer

    model_dir = copy_model(zoo.get("qwen3", "classifier", num_labels=1))
    (model_dir / "score_batch.json").write_text(json.dumps({"activation": "none"}))
    scorer = Scorer(model_dir, device="cpu")
    assert scorer.activation.name == "none" and scorer.activation.reason == "set explicitly"
    from score_batch.engine import Group

    result = scorer.score([Group("Tokyo", [" Japan"])])[0]
    assert result.score[0] == result.scores[0, 0] == result.raw[0, 0]
