"""Attention backends (a registry by name) and their hook into transformers' attention interface."""

from __future__ import annotations

import torch

from engine.attention.base import AttentionBackend, AttentionPlan
from engine.errors import ScoringInputError

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


def flashinfer_available() -> bool:
    """True when flashinfer imports and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


def resolve_backend_name(requested: str, device: torch.device, head_dim: int, position_rules: bool) -> str:
    """Pick the backend for 'auto' (flashinfer on CUDA when usable, else flex; split on CPU).

    position_rules: the model has sliding windows or attention soft-capping, which flashinfer's
    multi-item kernel does not apply.
    """
    if requested == "flashinfer":
        if position_rules:
            raise ScoringInputError(
                "--backend flashinfer does not apply sliding windows or soft-capping; use --backend flex"
            )
        if not flashinfer_available():
            raise ScoringInputError(
                "--backend flashinfer needs a CUDA device and the flashinfer package (pip install -e .[gpu])"
            )
        if head_dim % 64 != 0:
            raise ScoringInputError(
                f"--backend flashinfer needs head_dim a multiple of 64; this model has {head_dim}"
            )
        return requested
    if requested != "auto":
        return requested
    if device.type == "cuda":
        if flashinfer_available() and head_dim % 64 == 0 and not position_rules:
            return "flashinfer"
        return "flex"
    return "split"


def make_backend(name: str, device: torch.device, compile: bool | None) -> AttentionBackend:
    """Instantiate a backend by name."""
    if name == "sdpa":
        from engine.attention.sdpa import SdpaBackend

        return SdpaBackend()
    if name == "split":
        from engine.attention.split import SplitBackend

        return SplitBackend()
    if name == "flex":
        from engine.attention.flex import FlexBackend

        return FlexBackend(compile=device.type == "cuda" if compile is None else compile)
    if name == "flashinfer":
        from engine.attention.flashinfer import FlashInferBackend

        return FlashInferBackend(device)
    raise ScoringInputError(f"unknown attention backend {name!r}")
