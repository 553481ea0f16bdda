"""Attention backends (see registry) and their hook into transformers' attention interface."""

from __future__ import annotations

from score_batch.engine.attention.base import AttentionPlan

HF_ATTENTION_NAME = "score_batch"
PLAN_KWARG = "attention_plan"


def _score_batch_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: delegate to the batch's plan passed down as a forward kwarg."""
    plan: AttentionPlan | None = kwargs.get(PLAN_KWARG)
    if plan is None:
        raise RuntimeError(f"score_batch attention called without an {PLAN_KWARG!r} keyword")
    return plan.attend(query, key, value, scaling, kwargs.get("sliding_window"), kwargs.get("softcap")), None


def _no_mask(*args, **kwargs):
    """Mask builder for our attention name: the plan holds the mask, so transformers builds none."""
    return None


def register_with_transformers() -> None:
    """Register our attention function and mask builder under HF_ATTENTION_NAME (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(HF_ATTENTION_NAME, _score_batch_attention)
    AttentionMaskInterface.register(HF_ATTENTION_NAME, _no_mask)
