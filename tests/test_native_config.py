"""A native family's config.json read without transformers equals transformers' AutoConfig on everything the
engine reads: the ModelInfo, the native DecoderSpec and the RoPE frequencies (defaults included)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import score_batch.engine.native.config as native_config_module
from score_batch.engine.model.loading import read_model_info
from score_batch.engine.native.config import model_config, native_config
from score_batch.engine.native.rope import inverse_frequencies
from score_batch.engine.native.spec import decoder_spec, native_refusal

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, vocab_size=300)
CONFIGS = {
    # family defaults: only the type and the architecture given
    **{
        f"{family}-bare": dict(model_type=family, architectures=[f"{name}ForCausalLM"])
        for family, name in (
            ("llama", "Llama"),
            ("mistral", "Mistral"),
            ("qwen2", "Qwen2"),
            ("qwen3", "Qwen3"),
        )
    },
    "llama-gqa-bias": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        num_key_value_heads=2,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        **SMALL,
    ),
    "llama-classifier-id2label": dict(
        model_type="llama",
        architectures=["LlamaForSequenceClassification"],
        id2label={"0": "a", "1": "b", "2": "c"},
        pad_token_id=0,
        head_dim=32,
        **SMALL,
    ),
    "llama-rope-parameters": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
        **SMALL,
    ),
    "mistral-window": dict(
        model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=16, **SMALL
    ),
    "mistral-no-window": dict(
        model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None, **SMALL
    ),
    "qwen2-windows": dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
        num_key_value_heads=None,
        **SMALL,
    ),
    "qwen2-classifier-num-labels": dict(
        model_type="qwen2",
        architectures=["Qwen2ForSequenceClassification"],
        num_labels=1,
        pad_token_id=5,
        **SMALL,
    ),
    "qwen3-layer-types": dict(
        model_type="qwen3",
        architectures=["Qwen3ForCausalLM"],
        head_dim=8,
        sliding_window=4,
        use_sliding_window=True,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"rope_theta": 1000000, "rope_type": "default"},
        **SMALL,
    ),
    "qwen3-gelu": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="gelu", **SMALL),
}
# configs left to AutoConfig: a scaled RoPE, quantized weights, another family, two architectures
NOT_READ = {
    "yarn": dict(
        model_type="qwen3",
        architectures=["Qwen3ForCausalLM"],
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
        **SMALL,
    ),
    "llama3-rope": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        **SMALL,
    ),
    "quantized": dict(
        model_type="llama", architectures=["LlamaForCausalLM"], quantization_config={"bits": 4}
    ),
    "gemma": dict(model_type="gemma", architectures=["GemmaForCausalLM"]),
    "two-architectures": dict(model_type="llama", architectures=["LlamaForCausalLM", "LlamaModel"]),
    "bad-layer-types": dict(
        model_type="qwen3", architectures=["Qwen3ForCausalLM"], layer_types=["full_attention"]
    ),
}


def _model_dir(tmp_path, raw: dict):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").write_bytes(b"")  # only its presence is read
    return tmp_path


def _auto(path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, local_files_only=True)


@pytest.mark.parametrize("name", CONFIGS)
def test_model_info_spec_and_rope_equal_autoconfig(tmp_path, monkeypatch, name):
    path = _model_dir(tmp_path, CONFIGS[name])
    json_config = native_config(CONFIGS[name])
    assert json_config is not None
    from_json = read_model_info(path)
    with monkeypatch.context() as patch:
        patch.setattr(native_config_module, "native_config", lambda raw: None)
        from_transformers = read_model_info(path)
    assert from_json == from_transformers
    reference = _auto(path)
    architecture = CONFIGS[name]["architectures"][0]
    assert native_refusal(json_config, architecture, False) == native_refusal(reference, architecture, False)
    if from_json.native_refusal is None:
        assert decoder_spec(json_config) == decoder_spec(reference)
        head_dim = decoder_spec(reference).head_dim
        ours, ours_scale = inverse_frequencies(json_config, head_dim)
        theirs, their_scale = inverse_frequencies(reference, head_dim)
        assert torch.equal(ours, theirs) and ours_scale == their_scale


@pytest.mark.parametrize("name", NOT_READ)
def test_other_configs_are_left_to_autoconfig(tmp_path, name):
    assert native_config(NOT_READ[name]) is None
    path = _model_dir(tmp_path, NOT_READ[name])
    try:
        expected = type(_auto(path))
    except Exception as error:  # AutoConfig's own refusal, raised as before
        with pytest.raises(type(error)):
            model_config(path, NOT_READ[name], False)
    else:
        assert type(model_config(path, NOT_READ[name], False)) is expected


def test_reading_a_native_config_imports_no_transformers(tmp_path):
    path = _model_dir(tmp_path, CONFIGS["qwen3-layer-types"])
    code = (
        "import sys; from score_batch.engine.model.loading import read_model_info; "
        f"info = read_model_info({str(path)!r}); assert info.native_refusal is None, info; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
