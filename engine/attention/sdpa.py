"""Reference backend: SDPA (or soft-capped attention) per pack with the dense boolean mask (docs/semantics.md, Attention mask)."""

from __future__ import annotations

import torch

from score_batch.engine.attention.base import Capabilities
from score_batch.engine.attention.query_cache import QueryCache, cached_query_kv, check_cache, store_query_kv
from score_batch.engine.attention.softcap import attention
from score_batch.engine.plan.batching import Batch
from score_batch.engine.plan.packing import pack_mask


class SdpaPlan:
    """Per-pack dense masks, built lazily per sliding-window size and kept for all layers."""

    def __init__(self, batch: Batch, device: torch.device, query_cache: QueryCache | None = None) -> None:
        check_cache(batch, query_cache)
        self._batch = batch
        self._device = device
        self._cache = query_cache
        self._masks: dict[int | None, list[torch.Tensor]] = {}

    def _pack_masks(self, sliding_window: int | None) -> list[torch.Tensor]:
        """Dense masks of each pack for one window size ([len, q + len] for a cached pack)."""
        if sliding_window not in self._masks:
            self._masks[sliding_window] = [
                torch.from_numpy(pack_mask(p, sliding_window)).to(self._device) for p in self._batch.packs
            ]
        return self._masks[sliding_window]

    def attend(self, query, key, value, scaling, sliding_window, softcap=None, layer=0):
        """Run SDPA pack by pack; packs never see each other; cached packs prepend their query's K/V."""
        store_query_kv(self._cache, self._batch, key, value, layer)
        output = torch.empty_like(query)  # [1, num_heads, num_tokens, head_dim]
        bounds = self._batch.cu_seqlens.tolist()
        for pack_id, mask in enumerate(self._pack_masks(sliding_window)):
            start, end = bounds[pack_id], bounds[pack_id + 1]
            pack_key, pack_value = key[:, :, start:end], value[:, :, start:end]  # [1, kv_heads, len, d]
            pack = self._batch.packs[pack_id]
            if pack.query_cached:
                query_key, query_value = cached_query_kv(self._cache, pack, layer)  # [kv_heads, q, d]
                pack_key = torch.cat([query_key[None], pack_key], dim=2)  # [1, kv_heads, q + len, d]
                pack_value = torch.cat([query_value[None], pack_value], dim=2)
            output[:, :, start:end] = attention(
                query[:, :, start:end], pack_key, pack_value, mask, scaling, softcap
            )
        return output.transpose(1, 2)


class SdpaBackend:
    """Dense-mask reference backend; runs on CPU and CUDA."""

    name = "sdpa"
    capabilities = Capabilities(
        devices=frozenset({"cpu", "cuda"}), auto_devices=frozenset({"cpu", "cuda"}), cached_query=True
    )

    def __init__(self, device: torch.device) -> None:
        pass

    def plan(self, batch: Batch, device: torch.device, query_cache: QueryCache | None = None) -> SdpaPlan:
        """Masks are built on first use by a layer."""
        return SdpaPlan(batch, device, query_cache)
