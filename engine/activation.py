"""The `score` column's activation: which one a model gets (`auto`) and the math (numpy only, no torch).

`auto` follows sentence-transformers' CrossEncoder: the model's own activation_fn (model_activation_fn) wins;
else a one-label head gets a sigmoid. Where CrossEncoder keeps a multi-label head's raw logits, `auto` takes
the softmax probability of the `score_index` class, so that ranking by `score` is a relevance order.
CausalLM label scores are probabilities already and are never activated again (docs/semantics.md).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from score_batch.choices import ActivationChoice
from score_batch.engine.errors import SettingError

log = logging.getLogger(__name__)

Activation = Literal["none", "sigmoid", "softmax"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
ModelKind = Literal["causal", "classifier"]

# Activation classes a CrossEncoder config names (torch.nn.<Name> under any module path) → ours.
TORCH_ACTIVATIONS: dict[str, Activation] = {"Sigmoid": "sigmoid", "Identity": "none", "Softmax": "softmax"}


@dataclass(frozen=True)
class ResolvedActivation:
    """The activation the `score` column gets, and why (said once in the run log)."""

    name: Activation
    reason: str


def activate(
    scores: np.ndarray,  # [n, labels] raw per-item values (classifier logits, or CausalLM label scores)
    activation: Activation,
    score_index: int,
) -> np.ndarray:  # [n] float32
    """The `score` of each item: the score_index column, raw, through a sigmoid, or softmaxed over the labels."""
    values = np.asarray(scores, dtype=np.float32)
    if values.ndim != 2:
        raise ValueError(f"activate expects scores of shape [n, labels], got shape {values.shape}")
    if activation == "none":
        return values[:, score_index].copy()
    if activation == "sigmoid":
        column = values[:, score_index].astype(np.float64)
        with np.errstate(over="ignore"):
            return (1.0 / (1.0 + np.exp(-column))).astype(np.float32)
    if activation == "softmax":
        wide = values.astype(np.float64)
        with np.errstate(invalid="ignore"):
            shifted = wide - wide.max(axis=1, keepdims=True)  # [n, labels]; a NaN row stays NaN
            exp = np.exp(shifted)
            return (exp[:, score_index] / exp.sum(axis=1)).astype(np.float32)
    raise ValueError(f"unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")


@dataclass(frozen=True)
class RequestActivation:
    """A request's use_activation applied to a run's results, as vLLM's PoolingParams.use_activation. None:
    the run's own `score`. False: the raw value, entry score_index of `scores`. True: the run's `score` when
    the run applies an activation (`auto` by default, as vLLM's default use_activation=true), else a sigmoid
    (one score per item) or softmax (several) over `scores`. A CausalLM run with label_score logit applies
    none; under label_score sigmoid there is no raw value (such a request is refused before scoring)."""

    run_activation: str  # the run's ScoringConfig.activation (auto | none | sigmoid | softmax)
    score_index: int
    label_score: str = "probability"  # the run's ScoringConfig.label_score

    def values(self, scores: np.ndarray, score: np.ndarray, use_activation: bool | None) -> np.ndarray:
        """[n] values of one group's items; scores: [n, num_scores], score: [n] (the run's)."""
        if use_activation is None:
            return score
        if not use_activation:
            return scores[:, self.score_index]
        if self.run_activation != "none" and self.label_score != "logit":
            return score
        return activate(scores, "sigmoid" if scores.shape[1] == 1 else "softmax", self.score_index)


def model_activation_fn(model_dir: str | Path, saved: bool | None = None) -> tuple[str, str] | None:
    """The activation function a model's files name for CrossEncoder, as (dotted path, where), or None. Looked
    up as CrossEncoder does: config_sentence_transformers.json "activation_fn", then config.json
    "sentence_transformers": {"activation_fn": …}, then config.json "sbert_ce_default_activation_function"
    (sentence-transformers < 4). saved: whether the directory is a saved CrossEncoder, the only case in which
    CrossEncoder 6.2 reads config_sentence_transformers.json (None: read it whenever it is there)."""
    model_dir = Path(model_dir)
    st_config = json_object(model_dir / "config_sentence_transformers.json")
    if saved is not False and isinstance(st_config.get("activation_fn"), str):
        return st_config["activation_fn"], "config_sentence_transformers.json activation_fn"
    config = json_object(model_dir / "config.json")
    nested = config.get("sentence_transformers")
    if isinstance(nested, dict) and isinstance(nested.get("activation_fn"), str):
        return nested["activation_fn"], "config.json sentence_transformers.activation_fn"
    legacy = config.get("sbert_ce_default_activation_function")
    return (legacy, "config.json sbert_ce_default_activation_function") if isinstance(legacy, str) else None


def resolve_activation(
    requested: ActivationChoice,
    kind: ModelKind,
    num_labels: int,
    model_activation: tuple[str, str] | None = None,
) -> ResolvedActivation:
    """Resolve ScoringConfig.activation for a model: explicit values as given, `auto` per model (module doc)."""
    if kind == "causal":
        if requested in ("auto", "none"):
            what = "P(label token) over the whole vocabulary, or a softmax over the labels with apply_softmax"
            return ResolvedActivation("none", f"CausalLM label scores are probabilities already ({what})")
        raise SettingError(
            "ScoringConfig.activation",
            requested,
            "does not apply to a CausalLM model: its label scores are probabilities already; use "
            "ScoringConfig.apply_softmax=True for a softmax over the label tokens",
        )
    if requested == "softmax" and num_labels == 1:
        raise SettingError(
            "ScoringConfig.activation",
            requested,
            "makes every score 1.0 for a one-label head; use sigmoid or none",
        )
    if requested != "auto":
        return ResolvedActivation(requested, "set explicitly")
    if model_activation is not None:
        path, where = model_activation
        name = TORCH_ACTIVATIONS.get(path.rsplit(".", 1)[-1]) if path.startswith("torch.") else None
        if name is not None:
            return ResolvedActivation(name, f"the model's {where} is {path}")
        log.warning(
            "the model's %s is %s, which score-batch does not apply (it applies torch.nn Sigmoid, Identity and "
            "Softmax); using the default activation instead (set the activation explicitly to choose)",
            where,
            path,
        )
    if num_labels == 1:
        return ResolvedActivation(
            "sigmoid", "a one-label head: sigmoid of its logit, as CrossEncoder, vLLM and TEI"
        )
    return ResolvedActivation(
        "softmax",
        f"a {num_labels}-label head: softmax probability of the score_index class, a relevance order",
    )


def json_object(path: Path) -> dict:
    """A JSON object file, or {} when it is missing or not an object (the model loader reports broken files)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
