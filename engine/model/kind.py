"""What kind of model a directory holds, from its config.json alone (no torch, no transformers).

The `models` command and read_model_info share these checks: CausalLM or sequence classifier, encoder or
decoder, and why multi-item packing would be wrong for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from score_batch.engine.errors import ScoringInputError, SettingError

ENCODER_MODEL_TYPES = set(
    "bert roberta xlm-roberta modernbert deberta deberta-v2 distilbert electra albert camembert mpnet".split()
)
ENCODER_DECODER_MODEL_TYPES = {"t5", "bart", "mt5", "umt5", "mbart", "pegasus"}
# Position ids of RoBERTa-style models start after the padding index, so two positions are unusable.
POSITION_OFFSET_MODEL_TYPES = {"roberta", "xlm-roberta", "camembert"}
RECURRENT_MODEL_TYPES = set(
    "mamba mamba2 rwkv jamba falcon_h1 falcon_mamba qwen3_next recurrent_gemma zamba zamba2 bamba lfm2 "
    "granitemoehybrid nemotron_h minimax xlstm".split()
)
ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention"}


@dataclass(frozen=True)
class ModelKind:
    """A model's kind and the packings it allows, read without loading it."""

    architecture: str
    model_type: str
    kind: Literal["causal", "classifier"]
    encoder: bool  # bidirectional attention: pairs run unpacked through the model's own attention
    mis_refusal: str | None  # why multi-item packing would be wrong for this model, or None
    isolate_sequences: bool  # recurrent state: every pack must run as its own sequence

    @property
    def packings(self) -> tuple[str, ...]:
        """The packing modes this model allows."""
        return ("single",) if self.mis_refusal else ("mis", "single")


def read_config_json(path: Path, trust_remote_code: bool) -> dict:
    """config.json of a model directory, refusing a missing directory or file and unasked-for custom code."""
    if not path.is_dir():
        raise ScoringInputError(
            f"model directory {str(path)!r} does not exist (give a local Hugging Face model directory)"
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ScoringInputError(f"{str(path)!r} has no config.json; it is not a Hugging Face model directory")
    raw = read_json_file(config_file, "a JSON object of model settings")
    if raw.get("auto_map") and not trust_remote_code:
        problem = f"refuses model {str(path)!r}: it needs custom code (auto_map in config.json); "
        problem += "set it to True if you trust that code"
        raise SettingError("EngineConfig.trust_remote_code", trust_remote_code, problem)
    return raw


def model_kind(
    path: Path, architecture: str, model_type: str, layer_types: set[str], encoder_decoder: bool
) -> ModelKind:
    """Check that score-batch runs this model and say how (see ModelKind)."""
    if architecture.endswith("ForCausalLM"):
        kind: Literal["causal", "classifier"] = "causal"
    elif architecture.endswith("ForSequenceClassification"):
        kind = "classifier"
    else:
        raise ScoringInputError(
            f"model {str(path)!r} is a {architecture}; score-batch scores *ForCausalLM and *ForSequenceClassification models"
        )
    where = f"model {str(path)!r} ({model_type})"
    if model_type in ENCODER_DECODER_MODEL_TYPES or encoder_decoder:
        raise ScoringInputError(f"{where} is an encoder-decoder model, which score-batch does not run")
    encoder = model_type in ENCODER_MODEL_TYPES
    if encoder and kind != "classifier":
        raise ScoringInputError(
            f"{where} is a bidirectional encoder; score-batch runs encoders only as *ForSequenceClassification "
            "cross-encoders"
        )
    recurrent = model_type in RECURRENT_MODEL_TYPES or bool(layer_types - ATTENTION_LAYER_TYPES)
    refusal = None
    if encoder:
        refusal = (
            f"{where} is a bidirectional encoder: every token sees every other, so items cannot share a "
            "packed sequence; it runs unpacked, one (query, item) pair per row (packing single or auto)"
        )
    elif recurrent:
        refusal = (
            f"{where} has recurrent or linear-attention layers whose state would leak from one packed item "
            "into the next; run it with packing single (or auto)"
        )
    return ModelKind(architecture, model_type, kind, encoder, refusal, recurrent)


def read_model_kind(path: str | Path, trust_remote_code: bool = False) -> ModelKind:
    """A model directory's kind from config.json alone (what the `models` command shows)."""
    path = Path(path)
    raw = read_config_json(path, trust_remote_code)
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    architecture, model_type = str((raw.get("architectures") or ["?"])[0]), str(raw.get("model_type", "?"))
    layer_types = set(text.get("layer_types") or [])
    return model_kind(path, architecture, model_type, layer_types, bool(raw.get("is_encoder_decoder")))


def read_json_file(file: Path, what: str) -> dict:
    """Parse a JSON object file of a model directory; a truncated or invalid one is a ScoringInputError naming it."""
    where = f"{file.name} in {str(file.parent)!r}"
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ScoringInputError(f"{where} cannot be read: {error}") from None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ScoringInputError(f"{where} is truncated or not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ScoringInputError(f"{where} is not {what} (it holds a JSON {type(value).__name__})")
    return value
