"""Load a local Hugging Face model directory and decide what the engine may do with it."""

from __future__ import annotations

import contextlib
import logging
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from score_batch.engine.errors import ScoringInputError, SettingError
from score_batch.engine.model.kind import (
    POSITION_OFFSET_MODEL_TYPES,
    ModelKind,
    model_kind,
    read_config_json,
    read_json_file,
)
from score_batch.engine.model.source import SAFETENSORS_INDEX, check_weight_files, weight_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo(ModelKind):
    """What the engine needs to know about a model directory, read from its config alone: its kind (ModelKind:
    architecture, model_type, kind, encoder, mis_refusal, isolate_sequences, packings) and its shapes."""

    path: Path
    vocab_size: int
    hidden_size: int
    head_dim: int
    num_labels: int
    attention_softcap: float | None = None  # Gemma 2 attention-logit soft-capping
    sliding_window: int | None = None  # window of the sliding-attention layers, if any
    max_length: int | None = None  # longest sequence the model's positions allow
    native_refusal: str | None = "not read"  # why the native decoder layers cannot run it; None: they can
    # A decoder classifier's pad_token_id: transformers' *ForSequenceClassification reads its logits at the
    # last token that is not this id, so trailing ones are never scored (None: every last token is)
    unscored_tail_id: int | None = None


def read_model_info(path: str | Path, trust_remote_code: bool = False) -> ModelInfo:
    """Read and check a model directory's config (transformers' AutoConfig) without loading weights."""
    from score_batch.engine.native.config import model_config

    path = Path(path)
    read_config_json(path, trust_remote_code)  # a damaged or remote-code config named first
    config = model_config(path, trust_remote_code)
    text_config = config.get_text_config()
    _check_rope_type(text_config, path)
    layer_types = set(getattr(text_config, "layer_types", None) or [])
    architecture = (config.architectures or ["?"])[0]
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    shape = model_kind(path, architecture, config.model_type, layer_types, encoder_decoder)
    model_type, encoder = shape.model_type, shape.encoder
    heads = getattr(text_config, "num_attention_heads", None)  # absent in purely recurrent models
    head_dim = getattr(text_config, "head_dim", None) or (text_config.hidden_size // heads if heads else 0)
    max_positions = getattr(text_config, "max_position_embeddings", None)
    if max_positions and model_type in POSITION_OFFSET_MODEL_TYPES:
        max_positions -= 2
    if max_positions and not encoder:
        max_positions = _scaled_position_limit(text_config, max_positions)
    native_refusal = "an encoder runs as padded pairs through its own modeling code" if encoder else None
    if native_refusal is None:
        native_refusal = _native_refusal(config, path, shape.architecture, trust_remote_code)
    uses_windows = "sliding_attention" in layer_types or (
        (not layer_types or model_type == "mistral")  # Mistral's attention windows every layer regardless
        and getattr(text_config, "use_sliding_window", True)
    )
    decoder_classifier = shape.kind == "classifier" and not encoder
    return ModelInfo(
        **vars(shape),
        path=path,
        vocab_size=text_config.vocab_size,
        hidden_size=text_config.hidden_size,
        head_dim=head_dim,
        num_labels=config.num_labels,
        attention_softcap=getattr(text_config, "attn_logit_softcapping", None),
        sliding_window=getattr(text_config, "sliding_window", None) if uses_windows and not encoder else None,
        max_length=max_positions,
        native_refusal=native_refusal,
        unscored_tail_id=getattr(text_config, "pad_token_id", None) if decoder_classifier else None,
    )


def _native_refusal(config, path: Path, architecture: str, trust_remote_code: bool) -> str | None:
    """Why the native layers cannot run this model: its config (engine/native/spec.py), or pickle-only weights."""
    from score_batch.engine.native.spec import native_refusal

    refusal = native_refusal(config, architecture, trust_remote_code)
    if refusal is None and not any(
        (path / name).exists() for name in ("model.safetensors", SAFETENSORS_INDEX)
    ):
        refusal = "its weights are not safetensors (pickle weights load through transformers)"
    return refusal


def _check_rope_type(text_config, path: Path) -> None:
    """A RoPE type transformers cannot build is the model directory's mistake, named before any weights load
    (per layer type where the config keeps one each, as Gemma 3's; a model's own code builds its own)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = getattr(text_config, "rope_parameters", None) or getattr(text_config, "rope_scaling", None)
    if not isinstance(rope, dict) or getattr(text_config, "auto_map", None):
        return
    nested = all(isinstance(value, dict) for value in rope.values()) and rope
    for parameters in rope.values() if nested else [rope]:
        kind = parameters.get("rope_type") or parameters.get("type")
        if kind not in (None, "default", *ROPE_INIT_FUNCTIONS):
            known = ", ".join(sorted({"default", *ROPE_INIT_FUNCTIONS}))
            raise ScoringInputError(
                f"{path / 'config.json'}: RoPE type {kind!r} is not one transformers knows ({known})"
            )


# RoPE scalings that extend a model's context past the max_position_embeddings it was trained with.
CONTEXT_EXTENDING_ROPE = {"yarn", "dynamic", "linear", "longrope"}


def _scaled_position_limit(text_config, max_positions: int) -> int:
    """max_position_embeddings, times the RoPE scaling factor when a config extends its original context. A
    YaRN config such as Qwen's keeps max_position_embeddings at the original length and sets rope_scaling
    {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}; the model then takes factor
    × that many positions. Configs that already raised max_position_embeddings (Llama 3.1: 131072 with an
    original of 8192; Gemma 3's linear scaling) keep their value."""
    rope = getattr(text_config, "rope_parameters", None) or getattr(text_config, "rope_scaling", None)
    if not isinstance(rope, dict):
        return max_positions
    kind = rope.get("rope_type") or rope.get("type")
    factor = rope.get("factor")
    original = rope.get("original_max_position_embeddings")
    if kind in CONTEXT_EXTENDING_ROPE and isinstance(factor, (int, float)) and factor > 1:
        if original is not None and original >= max_positions:
            return int(original * factor)
        if original is None and kind == "dynamic":  # dynamic NTK scales past max_position_embeddings itself
            return int(max_positions * factor)
    return max_positions


@dataclass
class LoadedModel:
    """A loaded model split into the parts the engine calls: backbone and score head."""

    info: ModelInfo
    model: torch.nn.Module  # the whole *ForCausalLM / *ForSequenceClassification module
    backbone: torch.nn.Module
    head: torch.nn.Module
    final_logit_softcap: float | None
    # the backbone is engine/native's decoder: (ids, positions, max_position, plan, rows) → rows
    native: bool = False

    def hidden_rows(self, input_ids, positions, max_position: int, plan, rows):
        """Final hidden states [rows, hidden] of a ragged batch: ids and positions [tokens], rows [rows]."""
        if self.native:
            return self.backbone(input_ids, positions, max_position, plan, rows)
        from score_batch.engine.attention import PLAN_KWARG

        output = self.backbone(
            input_ids=input_ids[None], position_ids=positions[None], use_cache=False, **{PLAN_KWARG: plan}
        )
        return output.last_hidden_state[0, rows]


# Files a Hugging Face tokenizer is built from; a directory with none of them has no tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model")
TOKENIZER_JSON_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """Load the tokenizer stored in a model directory (offline): transformers' AutoTokenizer."""
    path = Path(path)
    if not any((path / name).exists() for name in TOKENIZER_FILES) and not any(path.glob("*.model")):
        raise ScoringInputError(
            f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {str(path)!r}; copy the model's tokenizer "
            "files into that directory"
        )
    for name in TOKENIZER_JSON_FILES:  # name a damaged file instead of a bare parse error
        if (path / name).exists():
            read_json_file(path / name, "a tokenizer file (a JSON object)")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as error:
        # the tokenizers library raises a bare Exception for a malformed file
        if not isinstance(error, (ValueError, OSError, TypeError, KeyError)) and type(error) is not Exception:
            raise
        raise ScoringInputError(f"cannot load a tokenizer from {str(path)!r}: {error}") from error
    if len(tokenizer) == 0:
        raise ScoringInputError(f"the tokenizer in {str(path)!r} has an empty vocabulary")
    return tokenizer


def load_model(info: ModelInfo, setup, config) -> LoadedModel:
    """Load info's weights as a resolved setup says (engine/model/setup.py: dtype, device, layers, ops), with
    config's trust_remote_code, safetensors unless its allow_pickle: native layers or transformers' model."""
    weights = check_weight_files(info.path)  # headers only: a damaged file is named before a long load
    trust_remote_code, allow_pickle = config.trust_remote_code, config.allow_pickle
    if setup.layers == "native":
        return _load_native(info, setup, trust_remote_code)
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from score_batch.engine.attention import HF_ATTENTION_NAME, register_with_transformers

    has_safetensors = weights == "safetensors"
    if not has_safetensors and not allow_pickle:
        problem = f"refuses model {str(info.path)!r}: it has no .safetensors weights, and pickle (.bin) "
        problem += "weights can run code when loaded; set it to True if you trust them"
        raise SettingError("EngineConfig.allow_pickle", allow_pickle, problem)
    register_with_transformers()
    auto = AutoModelForCausalLM if info.kind == "causal" else AutoModelForSequenceClassification
    try:
        with _no_progress_bar():
            model, loading = auto.from_pretrained(
                info.path,
                dtype=setup.dtype,
                attn_implementation=None if info.encoder else HF_ATTENTION_NAME,
                trust_remote_code=trust_remote_code,
                local_files_only=True,
                use_safetensors=has_safetensors,
                output_loading_info=True,
            )
    except (OSError, EOFError, pickle.UnpicklingError, SafetensorError) as error:
        raise ScoringInputError(f"cannot load the weights of model {str(info.path)!r}: {error}") from error
    except RuntimeError as error:
        if isinstance(error, torch.OutOfMemoryError) or not any(m in str(error) for m in CHECKPOINT_ERRORS):
            raise
        raise ScoringInputError(
            f"the weights of model {str(info.path)!r} do not match its config.json: {error}"
        ) from error
    _refuse_missing_weights(info, loading)
    model.to(setup.device).eval()
    backbone = getattr(model, model.base_model_prefix)
    if info.kind == "causal":
        head = model.get_output_embeddings()
    else:
        head = getattr(model, "score", None) or getattr(model, "classifier", None)
        if head is None:
            raise ScoringInputError(f"cannot find the classification head of {info.architecture}")
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return LoadedModel(info=info, model=model, backbone=backbone, head=head, final_logit_softcap=softcap)


def _load_native(info: ModelInfo, setup, trust_remote_code: bool) -> LoadedModel:
    """The native decoder and its head, straight from the safetensors files."""
    from score_batch.engine.native.load import load_native

    try:
        paths = weight_files(info.path)[1]
        backbone, head, _ = load_native(
            info.path, paths, info.kind, info.num_labels, setup.dtype, setup.device, setup.ops,
            trust_remote_code,
        )  # fmt: skip
    except (OSError, SafetensorError, KeyError, ValueError) as error:
        raise ScoringInputError(f"cannot load the weights of model {str(info.path)!r}: {error}") from error
    return LoadedModel(
        info=info, model=backbone, backbone=backbone, head=head, final_logit_softcap=None, native=True
    )


@contextlib.contextmanager
def _no_progress_bar():
    """transformers' "Loading weights" bar off while a model loads (it would print in a user's notebook)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


# What torch and transformers say in the RuntimeErrors of a damaged or mismatched checkpoint.
CHECKPOINT_ERRORS = (
    "size mismatch", "ignore_mismatched_sizes", "PytorchStreamReader", "zip archive", "unexpected EOF",
    "checkpoint",
)  # fmt: skip


def _refuse_missing_weights(info: ModelInfo, loading: dict) -> None:
    """Refuse a checkpoint that lacks tensors the model needs: transformers would fill them with random values."""
    missing = sorted(loading.get("missing_keys") or ())
    mismatched = sorted(
        str(key[0]) if isinstance(key, tuple) else str(key) for key in loading.get("mismatched_keys") or ()
    )
    if missing or mismatched:
        names = missing + mismatched
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        what = "lack" if missing else "have wrongly shaped"
        raise ScoringInputError(
            f"the weight files of model {str(info.path)!r} {what} tensors the model needs ({shown}); "
            "they would be random: the checkpoint does not match its config.json or is incomplete"
        )
