"""Attention backends (see registry) and their hook into transformers' attention interface."""

from __future__ import annotations

from score_batch.engine.attention.base import AttentionPlan

HF_ATTENTION_NAME = "score_batch"
PLAN_KWARG = "attention_plan"


def _score_batch_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: delegate to the batch's plan passed down as a forward kwarg. The
    module's layer_idx names the layer's entry in a QueryCache (queries computed once per group)."""
    plan: AttentionPlan | None = kwargs.get(PLAN_KWARG)
    if plan is None:
        raise RuntimeError(f"score_batch attention called without an {PLAN_KWARG!r} keyword")
    output = plan.attend(
        query,
        key,
        value,
        scaling,
        kwargs.get("sliding_window"),
        kwargs.get("softcap"),
        layer=module.layer_idx,
    )
    return output, None


def register_with_transformers() -> None:
    """Register our attention function under HF_ATTENTION_NAME (idempotent). No mask builder is registered on
    purpose: transformers' mask functions return None at once for an attention name missing from its mask
    registry (masking_utils._preprocess_mask_arguments), before find_packed_sequence_indices, whose `.all()`
    would cost a device→host sync per forward. The plan holds the mask."""
    from transformers import AttentionInterface

    AttentionInterface.register(HF_ATTENTION_NAME, _score_batch_attention)
