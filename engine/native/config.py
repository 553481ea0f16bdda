"""A native family's config read from config.json alone, with transformers' defaults: no transformers import.

Only configs whose every value the engine reads is plain are read here (one *ForCausalLM or
*ForSequenceClassification architecture of a family in FAMILY_DEFAULTS, default RoPE, no quantization, no
custom code, no sub-configs); anything else returns None and is read by transformers' AutoConfig.
tests/test_native_config.py checks the result against AutoConfig's attribute by attribute.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from score_batch.engine.errors import ScoringInputError
from score_batch.engine.native.spec import NATIVE_ARCHITECTURE_SUFFIXES

# transformers' class defaults (configuration_<family>.py) of the fields the engine reads
_COMMON = dict(
    hidden_act="silu",
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    pad_token_id=None,
    is_encoder_decoder=False,
    num_hidden_layers=32,
    num_attention_heads=32,
    hidden_size=4096,
)
FAMILY_DEFAULTS: dict[str, dict] = {
    "llama": dict(
        vocab_size=32000,
        intermediate_size=11008,
        num_key_value_heads=None,
        max_position_embeddings=2048,
        attention_bias=False,
        mlp_bias=False,
        head_dim=None,
    ),
    "mistral": dict(
        vocab_size=32000,
        intermediate_size=14336,
        num_key_value_heads=8,
        head_dim=None,
        max_position_embeddings=131072,
        sliding_window=4096,
    ),
    "qwen2": dict(
        vocab_size=151936,
        intermediate_size=22016,
        num_key_value_heads=32,
        max_position_embeddings=32768,
        use_sliding_window=False,
        sliding_window=4096,
        max_window_layers=28,
        layer_types=None,
    ),
}
FAMILY_DEFAULTS["qwen3"] = dict(FAMILY_DEFAULTS["qwen2"], head_dim=128, attention_bias=False)
DEFAULT_ROPE_THETA = 10000.0
INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)
OPTIONAL_INT_FIELDS = (
    "num_key_value_heads",
    "head_dim",
    "sliding_window",
    "max_window_layers",
    "pad_token_id",
)
BOOL_FIELDS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
LAYER_TYPES = ("full_attention", "sliding_attention")


class JsonConfig(SimpleNamespace):
    """config.json's values over the family's defaults, as transformers' config object holds them."""

    def get_text_config(self) -> JsonConfig:
        """The config itself (these families have no sub-configs)."""
        return self


def model_config(path: Path, raw: dict, trust_remote_code: bool):
    """A model directory's config: native_config of its config.json (raw), else transformers' AutoConfig."""
    config = native_config(raw)
    if config is not None:
        return config
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except (ValueError, KeyError, OSError) as error:
        raise ScoringInputError(f"cannot read the config of {str(path)!r}: {error}") from error


def native_config(raw: dict) -> JsonConfig | None:
    """The config of a plain Llama, Mistral, Qwen2 or Qwen3 decoder read from its config.json dict, or None
    where transformers' AutoConfig must read it."""
    model_type = raw.get("model_type")
    architectures = raw.get("architectures")
    if (
        model_type not in FAMILY_DEFAULTS
        or not isinstance(architectures, list)
        or len(architectures) != 1
        or not str(architectures[0]).endswith(NATIVE_ARCHITECTURE_SUFFIXES)
        or any(raw.get(key) for key in ("auto_map", "quantization_config", "text_config", "attribute_map"))
        or not _plain_values(raw)
    ):
        return None
    theta = _default_rope_theta(raw)
    if theta is None:
        return None
    values = {**_COMMON, **FAMILY_DEFAULTS[model_type], **raw}
    values["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    values.pop("rope_scaling", None)
    values.pop("rope_theta", None)
    values["num_labels"] = _num_labels(raw)
    if values.get("num_key_value_heads") is None:
        values["num_key_value_heads"] = values["num_attention_heads"]
    if model_type in ("llama", "mistral") and values.get("head_dim") is None:
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    if model_type in ("qwen2", "qwen3"):
        if not values["use_sliding_window"]:
            values["sliding_window"] = None
        if values.get("layer_types") is None:
            values["layer_types"] = [
                "sliding_attention"
                if values["sliding_window"] is not None and i >= values["max_window_layers"]
                else "full_attention"
                for i in range(values["num_hidden_layers"])
            ]
    return JsonConfig(**values)


def _plain_values(raw: dict) -> bool:
    """Whether every value the engine reads has the type transformers' strict config checks for (a config that
    fails them is left to AutoConfig, which names the problem)."""
    layers, heads, hidden = (
        raw.get("num_hidden_layers", 32),
        raw.get("num_attention_heads"),
        raw.get("hidden_size"),
    )
    layer_types = raw.get("layer_types")
    return (
        all(_is_int(raw.get(key, 1)) for key in INT_FIELDS)
        and all(raw.get(key) is None or _is_int(raw[key]) for key in OPTIONAL_INT_FIELDS)
        and all(isinstance(raw.get(key, False), bool) for key in BOOL_FIELDS)
        and isinstance(raw.get("rms_norm_eps", 1e-6), float)
        and isinstance(raw.get("hidden_act", "silu"), str)
        and (
            layer_types is None
            or isinstance(layer_types, list)
            and len(layer_types) == layers
            and all(kind in LAYER_TYPES for kind in layer_types)
        )
        and not (raw.get("model_type") == "llama" and heads and hidden and hidden % heads)
        and (heads is None or heads > 0)
    )


def _is_int(value) -> bool:
    """A JSON integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _default_rope_theta(raw: dict) -> float | None:
    """The base of an unscaled RoPE (rope_parameters, a legacy top-level rope_theta, or the default); None for
    any other RoPE (scaled kinds are read by transformers, whose functions compute their frequencies)."""
    if raw.get("rope_scaling") is not None:
        return None
    rope = raw.get("rope_parameters")
    if rope is None:
        theta = raw.get("rope_theta", DEFAULT_ROPE_THETA)
    elif (
        isinstance(rope, dict)
        and set(rope) <= {"rope_type", "rope_theta"}
        and rope.get("rope_type") == "default"
    ):
        theta = rope.get("rope_theta", raw.get("rope_theta", DEFAULT_ROPE_THETA))
    else:
        return None
    return float(theta) if isinstance(theta, int | float) and not isinstance(theta, bool) else None


def _num_labels(raw: dict) -> int:
    """transformers' num_labels: id2label's length, else num_labels, else 2."""
    if isinstance(raw.get("id2label"), dict):
        return len(raw["id2label"])
    return raw["num_labels"] if _is_int(raw.get("num_labels")) else 2
