"""A decoder's shape for the native layers, read from its transformers config object; why not, when it cannot run there.

Only what the Llama, Mistral, Qwen2 and Qwen3 decoders use in released checkpoints is implemented;
anything else (another family, another activation, a RoPE kind that depends on the sequence length,
quantized weights, remote code) keeps transformers' modeling code, and `native_refusal` says why.
The config object is transformers' own (AutoConfig): its defaults, `layer_types` and `rope_parameters` are the
ones transformers' modeling code uses.
"""

from __future__ import annotations

from dataclasses import dataclass

NATIVE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
NATIVE_ARCHITECTURE_SUFFIXES = ("ForCausalLM", "ForSequenceClassification")
# RoPE kinds whose frequencies are fixed per model; "dynamic" and "longrope" change them with each
# sequence's length, which a packed batch of many sequences cannot reproduce.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class DecoderSpec:
    """The shape and options of one decoder, everything the native layers need besides the weights."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool  # q/k/v projections carry a bias (Qwen2 always; Llama/Qwen3 with attention_bias)
    o_bias: bool  # the output projection carries a bias (Llama/Qwen3 attention_bias)
    mlp_bias: bool  # Llama mlp_bias
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before RoPE
    sliding_windows: tuple[int | None, ...]  # per layer: the window, or None for full attention
    rope_type: str
    tie_word_embeddings: bool

    @property
    def scaling(self) -> float:
        """The attention scale of every family here: 1/sqrt(head_dim)."""
        return self.head_dim**-0.5


def _rope_parameters(config) -> dict:
    """transformers' standardized RoPE parameters (rope_type, rope_theta, factor, …)."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(rope) if isinstance(rope, dict) else {}


def rope_type(config) -> str:
    """The config's RoPE kind, 'default' when unscaled."""
    rope = _rope_parameters(config)
    return rope.get("rope_type") or rope.get("type") or "default"


def _sliding_windows(config, model_type: str, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's window as transformers' attention modules of this family apply it."""
    window = getattr(config, "sliding_window", None)
    if model_type == "mistral":  # MistralAttention passes config.sliding_window to every layer
        return (window,) * num_layers
    if model_type == "llama":
        return (None,) * num_layers
    layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * num_layers)
    return tuple(window if kind == "sliding_attention" else None for kind in layer_types)


def native_refusal(config, architecture: str, trust_remote_code: bool) -> str | None:
    """Why this config cannot run on the native layers (None when it can)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in NATIVE_MODEL_TYPES:
        return f"model type {model_type!r} has no native layers (they cover {', '.join(NATIVE_MODEL_TYPES)})"
    if not architecture.endswith(NATIVE_ARCHITECTURE_SUFFIXES):
        return f"architecture {architecture} is not a *ForCausalLM or *ForSequenceClassification"
    if trust_remote_code and getattr(config, "auto_map", None):
        return "the model directory brings its own code (auto_map with trust_remote_code)"
    if getattr(config, "quantization_config", None):
        return "quantized weights (quantization_config)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (native layers implement silu)"
    kind = rope_type(config)
    if kind not in STATIC_ROPE_TYPES:
        return f"RoPE type {kind!r} (native layers implement {', '.join(STATIC_ROPE_TYPES)})"
    if _rope_parameters(config).get("partial_rotary_factor", 1.0) != 1.0:
        return "partial rotary embeddings (partial_rotary_factor)"
    layer_types = set(getattr(config, "layer_types", None) or ())
    if layer_types - {"full_attention", "sliding_attention"}:
        return f"layer types {sorted(layer_types)}"
    if getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None):
        return "mixture-of-experts layers"
    return None


def decoder_spec(config) -> DecoderSpec:
    """The DecoderSpec of a config that native_refusal accepts."""
    model_type = config.model_type
    heads = config.num_attention_heads
    num_layers = config.num_hidden_layers
    attention_bias = bool(getattr(config, "attention_bias", False))
    return DecoderSpec(
        model_type=model_type,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        rms_norm_eps=config.rms_norm_eps,
        qkv_bias=model_type == "qwen2" or (model_type in ("llama", "qwen3") and attention_bias),
        o_bias=model_type in ("llama", "qwen3") and attention_bias,
        mlp_bias=model_type == "llama" and bool(getattr(config, "mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        sliding_windows=_sliding_windows(config, model_type, num_layers),
        rope_type=rope_type(config),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )
