"""Frozen engine and scoring settings, resolved once by the caller (the CLI or Python code)."""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, field, replace
from typing import Literal

from score_batch import choices
from score_batch.engine.errors import SettingError

SGLANG_DEFAULT_DELIMITER = 9999


@dataclass(frozen=True)
class ScoringConfig:
    """What a score is: labels, templates, packing, truncation (docs/semantics.md)."""

    label_tokens: tuple[str, ...] = ()
    label_token_ids: tuple[int, ...] = ()
    apply_softmax: bool = False
    score_index: int = -1
    pooled_hidden_states: bool = False
    normalize: bool = False
    query_template: str | None = None
    item_template: str | None = None
    item_first: bool = False
    packing: choices.Packing = "auto"  # auto: mis when the model allows it, else single
    delimiter_token_id: int | None = None
    max_query_tokens: int | None = None
    max_item_tokens: int | None = None
    # error: a row error; item-tail / query-head: cut that end; longest-first: CrossEncoder's pair rule (cut
    # the longer of query and item, a token at a time); chunk: an over-long item is scored as chunks of
    # max_item_tokens tokens sharing chunk_overlap tokens with their neighbours, aggregated by chunk_aggregate.
    truncate: choices.Truncate = "error"
    chunk_overlap: int = 0
    chunk_aggregate: choices.ChunkAggregate = "max"
    # The `score` column's activation; auto: as CrossEncoder (engine/activation.py).
    activation: choices.ActivationChoice = "auto"
    # CausalLM label scores (engine/run/heads.label_scores): probability = P(label) over the whole vocabulary
    # (a softmax over the labels with apply_softmax); logit = the label token's raw logit (FlagEmbedding's LLM
    # rerankers, sentence-transformers' LogitScore with one token); sigmoid = the sigmoid of that logit
    # (FlagEmbedding's normalize=True). A classifier's scores are its head's logits whatever this says.
    label_score: choices.LabelScore = "probability"

    def __post_init__(self) -> None:
        _check_choices(self)
        overlap = self.chunk_overlap
        if isinstance(overlap, bool) or not isinstance(overlap, int) or overlap < 0:
            raise SettingError("ScoringConfig.chunk_overlap", overlap, "must be a whole number >= 0")
        if self.label_score != "probability" and self.apply_softmax:
            raise SettingError(
                "ScoringConfig.label_score",
                self.label_score,
                "cannot be combined with ScoringConfig.apply_softmax=True (a softmax over the labels' "
                "probabilities): turn that off with ScoringConfig.apply_softmax=False, or keep it with "
                "ScoringConfig.label_score='probability'",
                conflicts=("ScoringConfig.apply_softmax",),
            )
        if self.label_tokens and self.label_token_ids:
            raise SettingError(
                "ScoringConfig.label_token_ids",
                self.label_token_ids,
                "is given together with ScoringConfig.label_tokens; give labels as strings or as ids, not both",
                conflicts=("ScoringConfig.label_tokens",),
            )
        for name, placeholder in (("query_template", "{query}"), ("item_template", "{item}")):
            template = getattr(self, name)
            if template is not None and placeholder not in template:
                raise SettingError(f"ScoringConfig.{name}", template, f"must contain {placeholder}")
        for name in ("max_query_tokens", "max_item_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SettingError(f"ScoringConfig.{name}", value, "must be at least 1")

    def deciding(self) -> ScoringConfig:
        """This config as it decides scores: chunk_overlap and chunk_aggregate at their defaults unless truncate
        is chunk (they do nothing then), so that they change no score identity and no fingerprint."""
        return self if self.truncate == "chunk" else replace(self, chunk_overlap=0, chunk_aggregate="max")


@dataclass(frozen=True)
class EngineConfig:
    """How to run: device, dtype, attention backend and token budgets."""

    device: choices.Device = "auto"
    dtype: choices.Dtype = "auto"
    backend: choices.Backend = "auto"
    max_batch_tokens: int | None = None
    max_pack_tokens: int = 8192
    trust_remote_code: bool = False
    allow_pickle: bool = False
    compile: bool = False  # torch.compile the decoder layers' norms, MLPs and attention projections + RoPE
    # Decoder layers: native (engine/native, Llama/Mistral/Qwen2/Qwen3) or transformers' modeling code;
    # auto: native when the model's family and config features are implemented there.
    layers: choices.Layers = "auto"
    # Element-wise kernels of the native layers (RMSNorm + residual, RoPE, SiLU·mul); auto: flashinfer on
    # CUDA when it imports (torch under --compile), torch elsewhere.
    ops: choices.Ops = "auto"
    # Items re-scored alone through the reference path at the end of a run (engine/run/verify.py); None: 16
    # where the run takes a GPU kernel path, else 0. Changes no score (not in the score identity).
    verify: int | None = None
    scoring: ScoringConfig = field(default_factory=ScoringConfig)

    def __post_init__(self) -> None:
        _check_choices(self)
        if not isinstance(self.compile, bool):
            raise SettingError("EngineConfig.compile", self.compile, "must be True or False")
        if self.max_pack_tokens < 8:
            raise SettingError("EngineConfig.max_pack_tokens", self.max_pack_tokens, "must be at least 8")
        if self.verify is not None and (isinstance(self.verify, bool) or self.verify < 0):
            raise SettingError("EngineConfig.verify", self.verify, "must be a whole number >= 0")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise SettingError("EngineConfig.max_batch_tokens", self.max_batch_tokens, "must be positive")


def _check_choices(config: ScoringConfig | EngineConfig) -> None:
    """Raise SettingError naming the first field whose value is not one of its Literal type's choices."""
    for name, allowed in _choices(type(config)).items():
        value = getattr(config, name)
        if value not in allowed:
            raise SettingError(
                f"{type(config).__name__}.{name}", value, f"is not one of {', '.join(allowed)}"
            )


@functools.cache
def _choices(owner: type) -> dict[str, tuple[str, ...]]:
    """The choices of owner's fields typed as a Literal (score_batch/choices.py's), by field name."""
    hints = typing.get_type_hints(owner)
    return {name: typing.get_args(hint) for name, hint in hints.items() if typing.get_origin(hint) is Literal}
