"""The attention-backend interface: plan once per batch, attend once per layer."""

from __future__ import annotations

from typing import Protocol

import torch

from engine.batching import Batch


class AttentionPlan(Protocol):
    """Per-batch attention state (masks, kernel plans) reused by every layer."""

    def attend(
        self,
        query: torch.Tensor,  # [1, num_heads, num_tokens, head_dim]
        key: torch.Tensor,  # [1, num_kv_heads, num_tokens, head_dim]
        value: torch.Tensor,  # [1, num_kv_heads, num_tokens, head_dim]
        scaling: float | None,
        sliding_window: int | None,
        softcap: float | None = None,
    ) -> torch.Tensor:  # [1, num_tokens, num_heads, head_dim]
        """Attention of every batch token under the multi-item mask."""
        ...


class AttentionBackend(Protocol):
    """Builds an AttentionPlan from a batch's pack metadata."""

    name: str

    def plan(self, batch: Batch, device: torch.device) -> AttentionPlan:
        """Build the per-batch plan from CPU metadata (the only host work per batch)."""
        ...
