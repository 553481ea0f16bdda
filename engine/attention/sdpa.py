"""Reference backend: SDPA (or soft-capped attention) per pack with the dense boolean mask (docs/semantics.md, Attention mask)."""

from __future__ import annotations

import torch
from score_batch.engine.attention.base import Capabilities
from score_batch.engine.attention.softcap import attention
from score_batch.engine.batching import Batch
from score_batch.engine.packing import attention_mask


class SdpaPlan:
    """Per-pack dense masks, built lazily per sliding-window size and kept for all layers."""

    def __init__(self, batch: Batch, device: torch.device) -> None:
        self._batch = batch
        self._device = device
        self._masks: dict[int | None, list[torch.Tensor]] = {}

    def _pack_masks(self, sliding_window: int | None) -> list[torch.Tensor]:
        """Dense masks of each pack for one window size."""
        if sliding_window not in self._masks:
            self._masks[sliding_window] = [
                torch.from_numpy(attention_mask(p.segments, p.positions, sliding_window)).to(self._device)
                for p in self._batch.packs
            ]
        return self._masks[sliding_window]

    def attend(self, query, key, value, scaling, sliding_window, softcap=None):
        """Run SDPA pack by pack; packs never see each other."""
        output = torch.empty_like(query)  # [1, num_heads, num_tokens, head_dim]
        bounds = self._batch.cu_seqlens.tolist()
        for pack_id, mask in enumerate(self._pack_masks(sliding_window)):
            start, end = bounds[pack_id], bounds[pack_id + 1]
            output[:, :, start:end] = attention(
                query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], mask, scaling, softcap
            )
        return output.transpose(1, 2)


class SdpaBackend:
    """Dense-mask reference backend; runs on CPU and CUDA."""

    name = "sdpa"
    capabilities = Capabilities(devices=frozenset({"cpu", "cuda"}), auto_devices=frozenset({"cpu", "cuda"}))

    def __init__(self, device: torch.device) -> None:
        pass

    def plan(self, batch: Batch, device: torch.device) -> SdpaPlan:
        """Masks are built on first use by a layer."""
        return SdpaPlan(batch, device)
