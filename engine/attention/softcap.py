"""SDPA with optional attention-logit soft-capping (Gemma 2): the one attention formula the CPU backends share."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(
    query: torch.Tensor,  # [..., heads, q_len, head_dim]
    key: torch.Tensor,  # [..., kv_heads, kv_len, head_dim]
    value: torch.Tensor,  # [..., kv_heads, kv_len, head_dim]
    mask: torch.Tensor | None,  # bool, broadcastable to [..., heads, q_len, kv_len]; None = causal
    scale: float | None,
    softcap: float | None,
) -> torch.Tensor:  # [..., heads, q_len, head_dim]
    """softmax(cap·tanh(QKᵀ·scale/cap) + mask)·V; plain SDPA when there is no cap."""
    gqa = key.shape[-3] != query.shape[-3]
    if softcap is None:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=gqa
        )
    if gqa:
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.matmul(query, key.transpose(-1, -2)) * scale  # [..., heads, q_len, kv_len]
    logits = torch.tanh(logits / softcap) * softcap
    if mask is None:
        q_len, kv_len = logits.shape[-2:]
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=logits.device).tril(kv_len - q_len)
    logits = logits.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value)
