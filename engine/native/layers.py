"""The native decoder: embeddings, decoder layers with fused QKV and gate/up projections, final norm.

Tokens are one ragged row [tokens, hidden] (no batch dimension, no padding); attention is the batch's
AttentionPlan, called once per layer with the layer's index. The residual stream follows SGLang's
layout: each norm takes the previous block's output and the residual and returns both, so the add
and the norm are one kernel where the ops fuse them. The last layer runs its output projection and
MLP only on the rows whose hidden states are read (the score rows): attention still sees every token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from score_batch.engine.native.ops import Ops
from score_batch.engine.native.rope import RopeCache
from score_batch.engine.native.spec import DecoderSpec


def _empty(*shape: int) -> nn.Parameter:
    """A parameter placeholder on the meta device (no memory, no random init), replaced by the weight loader."""
    return nn.Parameter(torch.empty(*shape, device="meta"), requires_grad=False)


class Linear(nn.Module):
    """y = x Wᵀ + b with placeholder parameters (nn.Linear's random init would import torch._dynamo on meta)."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = _empty(out_features, in_features)
        self.bias = _empty(out_features) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., in_features] → [..., out_features]."""
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """Token embeddings as a placeholder [vocab, hidden] matrix."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = _empty(vocab_size, hidden_size)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension; with a residual, the residual add comes first (fused by the ops)."""

    def __init__(self, size: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.weight = _empty(size)
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """rms_norm(x), or (rms_norm(x + residual), x + residual)."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) · up(x)) with gate and up as one projection."""

    def __init__(self, spec: DecoderSpec, ops: Ops) -> None:
        super().__init__()
        hidden, inner = spec.hidden_size, spec.intermediate_size
        self.gate_up_proj = Linear(hidden, 2 * inner, bias=spec.mlp_bias)
        self.down_proj = Linear(inner, hidden, bias=spec.mlp_bias)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[tokens, hidden] → [tokens, hidden]."""
        return self.down_proj(self.ops.silu_mul(self.gate_up_proj(x)))


class Attention(nn.Module):
    """GQA self-attention: one QKV projection, optional per-head q/k norms, RoPE in place, the plan's kernel."""

    def __init__(self, spec: DecoderSpec, layer: int, ops: Ops) -> None:
        super().__init__()
        self.layer_idx = layer
        self.head_dim = spec.head_dim
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.scaling = spec.scaling
        self.sliding_window = spec.sliding_windows[layer]
        self.qkv_proj = Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = Linear(self.q_size, spec.hidden_size, bias=spec.o_bias)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps, ops) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps, ops) if spec.qk_norm else None
        self.ops = ops

    def forward(self, x, rope, plan, rows=None) -> torch.Tensor:
        """[tokens, hidden] → [tokens, hidden], or [rows, hidden] for the given rows only."""
        tokens = x.shape[0]
        qkv = self.qkv_proj(x)  # [tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        norms = None
        if self.q_norm is not None:  # per-head RMSNorms of q and k, then RoPE: one call of the ops
            norms = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        q, k = self.ops.qk_norm_rope(rope, q, k, norms, self.head_dim)  # views of qkv where the ops allow
        out = plan.attend(
            q.view(1, tokens, -1, self.head_dim).transpose(1, 2),  # [1, heads, tokens, head_dim]
            k.view(1, tokens, -1, self.head_dim).transpose(1, 2),  # [1, kv_heads, tokens, head_dim]
            v.view(1, tokens, -1, self.head_dim).transpose(1, 2),
            self.scaling,
            self.sliding_window,
            layer=self.layer_idx,
        )[0]  # [tokens, heads, head_dim]
        if rows is not None:
            out = out[rows]  # [rows, heads, head_dim]
        return self.o_proj(out.reshape(out.shape[0], self.q_size))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks around the residual stream."""

    def __init__(self, spec: DecoderSpec, layer: int, ops: Ops) -> None:
        super().__init__()
        self.self_attn = Attention(spec, layer, ops)
        self.mlp = GatedMLP(spec, ops)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, ops)

    def forward(self, hidden, residual, rope, plan, rows=None):
        """(block output, residual) after this layer; rows restricts both to those rows."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, rope, plan, rows)
        if rows is not None:
            residual = residual[rows]
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class NativeDecoder(nn.Module):
    """The backbone: token ids and positions of a ragged batch → final-norm hidden states of chosen rows."""

    def __init__(self, spec: DecoderSpec, ops: Ops, rope: RopeCache) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, ops) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, ops)
        self.rope = rope
        self.ops = ops

    def forward(
        self,
        input_ids: torch.Tensor,  # [tokens] int64
        positions: torch.Tensor,  # [tokens] int64
        max_position: int,  # the largest position, known on the host
        plan,  # the batch's AttentionPlan
        rows: torch.Tensor,  # [rows] int64, the token rows whose hidden states are returned
    ) -> torch.Tensor:  # [rows, hidden]
        """One prefill-only forward; only `rows` come out of the last layer."""
        hidden = F.embedding(input_ids, self.embed_tokens.weight)  # [tokens, hidden]
        # what every layer's RoPE reads for these positions
        rope = self.ops.rope_tables(positions, self.rope.covering(max_position), hidden.dtype)
        residual = None
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            hidden, residual = layer(hidden, residual, rope, plan, rows if index == last else None)
        hidden, _ = self.norm(hidden, residual)
        return hidden
