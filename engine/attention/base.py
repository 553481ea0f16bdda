"""The attention-backend interface (plan once per batch, attend once per layer) and what a backend can run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from score_batch.engine.attention.query_cache import QueryCache
from score_batch.engine.plan.batching import Batch


@dataclass(frozen=True)
class Workload:
    """What a model and its settings ask of an attention backend."""

    device: str  # "cpu" or "cuda"
    dtype: torch.dtype
    head_dim: int
    softcap: bool  # the model soft-caps attention logits (Gemma 2)
    sliding_window: bool  # some layers attend within a sliding window
    max_pack_tokens: int


@dataclass(frozen=True)
class Capabilities:
    """What one backend runs, declared next to its implementation and queried by the registry."""

    devices: frozenset[str]  # device types it runs on
    auto_devices: frozenset[str]  # device types on which `auto` may pick it
    dtypes: frozenset[torch.dtype] | None = None  # None: any
    head_dims: frozenset[int] | None = None  # None: any
    softcap: bool = True
    sliding_window: bool = True
    max_pack_tokens: int | None = None  # None: no limit
    module: str | None = None  # a package it imports when it runs
    # It runs packs whose query K/V come from a QueryCache (Pack.query_cached; PlanLimits.cache_query).
    cached_query: bool = False

    def why_not(self, need: Workload) -> str | None:
        """Why the workload is out of these capabilities (None when it fits); imports are not tried here."""
        if need.device not in self.devices:
            return f"does not run on {need.device} (EngineConfig.device)"
        if self.dtypes is not None and need.dtype not in self.dtypes:
            allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            return f"needs EngineConfig.dtype in ({allowed}), not {str(need.dtype).removeprefix('torch.')}"
        if self.head_dims is not None and need.head_dim not in self.head_dims:
            return f"needs a head_dim in {sorted(self.head_dims)}; this model has {need.head_dim}"
        if need.softcap and not self.softcap:
            return "does not apply attention-logit soft-capping, which this model uses"
        if need.sliding_window and not self.sliding_window:
            return "does not apply sliding windows by position, which this model uses"
        if self.max_pack_tokens is not None and need.max_pack_tokens > self.max_pack_tokens:
            return f"needs EngineConfig.max_pack_tokens <= {self.max_pack_tokens}, not {need.max_pack_tokens}"
        return None


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
        layer: int = 0,  # the decoder layer's index: the QueryCache entry of this layer
    ) -> torch.Tensor:  # [1, num_tokens, num_heads, head_dim]
        """Attention of every batch token under the multi-item mask. With a QueryCache, storing packs put this
        layer's query K/V first; cached packs' rows then attend over [cached query K/V ; their own K/V] under
        the mask the inline pack would give."""
        ...


class AttentionBackend(Protocol):
    """Builds an AttentionPlan from a batch's pack metadata; constructed as cls(device)."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    def plan(
        self, batch: Batch, device: torch.device, query_cache: QueryCache | None = None
    ) -> AttentionPlan:
        """Build the per-batch plan from CPU metadata (the only host work per batch). query_cache: the run's
        QueryCache; needed when the batch has a cached pack (Pack.query_cached)."""
        ...


def to_device(array, device: torch.device) -> torch.Tensor:
    """A host array on the device; to CUDA from pinned memory, so the copy does not wait for the host."""
    host = torch.from_numpy(array)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
