"""Model directory checks: kinds, refusals with clear messages, remote code and missing files."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from score_batch.engine import EngineConfig, Scorer, ScoringConfig, ScoringInputError
from score_batch.engine.model.loading import read_model_info
from score_batch.engine.model.setup import load_planner


def _config_dir(tmp_path, model_type: str, architecture: str, **extra):
    config = AutoConfig.for_model(model_type, architectures=[architecture], **extra)
    config.save_pretrained(tmp_path)
    return tmp_path


def test_kinds_of_tiny_models(qwen3_causal, qwen3_classifier):
    assert read_model_info(qwen3_causal).kind == "causal"
    info = read_model_info(qwen3_classifier)
    assert info.kind == "classifier" and info.num_labels == 3 and info.mis_refusal is None


def test_recurrent_model_refuses_mis_and_points_to_single(tmp_path):
    info = read_model_info(_config_dir(tmp_path, "mamba", "MambaForCausalLM"))
    assert "packing single" in info.mis_refusal and info.isolate_sequences


def test_linear_attention_layers_refuse_mis(tmp_path):
    path = _config_dir(tmp_path, "qwen3", "Qwen3ForCausalLM", num_hidden_layers=2)
    raw = json.loads((path / "config.json").read_text())
    raw["layer_types"] = ["linear_attention", "full_attention"]
    raw["num_hidden_layers"] = 2
    (path / "config.json").write_text(json.dumps(raw))
    assert "packing single" in read_model_info(path).mis_refusal


def test_mis_refusal_reaches_the_scorer(tmp_path, qwen3_causal):
    import shutil

    path = tmp_path / "m"
    shutil.copytree(qwen3_causal, path)
    raw = json.loads((path / "config.json").read_text())
    raw["layer_types"] = ["linear_attention", "full_attention"]
    raw["num_hidden_layers"] = 2
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ScoringInputError, match="packing single"):
        Scorer.from_pretrained(
            path, EngineConfig(scoring=ScoringConfig(label_tokens=(" to",), packing="mis"))
        )
    _, setup = load_planner(path, EngineConfig(scoring=ScoringConfig(label_tokens=(" to",))))
    assert setup.packing == "single" and setup.limits.isolate_sequences


def test_other_heads_are_refused(tmp_path):
    with pytest.raises(ScoringInputError, match="ForCausalLM and \\*ForSequenceClassification"):
        read_model_info(_config_dir(tmp_path, "qwen3", "Qwen3ForTokenClassification"))


def test_remote_code_needs_flag(tmp_path):
    path = _config_dir(tmp_path, "qwen3", "Qwen3ForCausalLM")
    raw = json.loads((path / "config.json").read_text())
    raw["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ScoringInputError, match="EngineConfig.trust_remote_code=False"):
        read_model_info(path)


def test_not_a_model_directory(tmp_path):
    with pytest.raises(ScoringInputError, match="config.json"):
        read_model_info(tmp_path)


@pytest.mark.parametrize(
    "family, kind",
    [("qwen3", "causal"), ("qwen3", "classifier"), ("bert", "classifier"), ("gemma2", "causal")],
)
def test_torch_free_model_kind_equals_read_model_info(zoo, family, kind):
    from score_batch.engine.model.kind import read_model_kind

    path = zoo.get(family, kind)
    info, shape = read_model_info(path), read_model_kind(path)
    assert (shape.architecture, shape.model_type, shape.kind, shape.encoder) == (
        info.architecture,
        info.model_type,
        info.kind,
        info.encoder,
    )
    assert (shape.mis_refusal, shape.isolate_sequences, shape.packings) == (
        info.mis_refusal,
        info.isolate_sequences,
        info.packings,
    )
