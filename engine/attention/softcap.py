"""SDPA with optional attention-logit soft-capping (Gemma 2): the one attention formula the SDPA backends share."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., kv_heads, len, d] → [..., heads, len, d], each K/V head repeated for its query heads."""
    return x if x.shape[-3] == heads else x.repeat_interleave(heads // x.shape[-3], dim=-3)


def native_gqa(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether SDPA gets the grouped K/V as they are (enable_gqa=True) rather than expanded to every head. On
    the CPU, SDPA's fused kernel takes GQA with a mask. On CUDA (and any other accelerator) a boolean mask (or
    a float32 query) rules out the flash kernel, and the memory-efficient kernel does not support enable_gqa,
    so SDPA would fall back to its math kernel ([heads, L, L] fp32 scores: ~4 GiB per 8k pack and layer at 16
    heads); expanding K/V keeps the memory-efficient kernel. Causal 16-bit: flash takes GQA."""
    if key.shape[-3] == query.shape[-3]:
        return False
    return query.device.type == "cpu" or (mask is None and query.dtype in (torch.float16, torch.bfloat16))


def attention(
    query: torch.Tensor,  # [..., heads, q_len, head_dim]
    key: torch.Tensor,  # [..., kv_heads, kv_len, head_dim]
    value: torch.Tensor,  # [..., kv_heads, kv_len, head_dim]
    mask: torch.Tensor | None,  # bool, broadcastable to [..., heads, q_len, kv_len]; None = causal
    scale: float | None,
    softcap: float | None,
) -> torch.Tensor:  # [..., heads, q_len, head_dim]
    """softmax(cap·tanh(QKᵀ·scale/cap) + mask)·V; plain SDPA when there is no cap."""
    heads = query.shape[-3]
    if softcap is None:
        gqa = native_gqa(query, key, mask)
        if not gqa:
            key, value = repeat_kv(key, heads), repeat_kv(value, heads)  # [..., heads, kv_len, head_dim]
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=gqa
        )
    key, value = repeat_kv(key, heads), repeat_kv(value, heads)  # [..., heads, kv_len, head_dim]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.matmul(query, key.transpose(-1, -2)) * scale  # [..., heads, q_len, kv_len]
    logits = torch.tanh(logits / softcap) * softcap
    if mask is None:
        q_len, kv_len = logits.shape[-2:]
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=logits.device).tril(kv_len - q_len)
    logits = logits.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value)
