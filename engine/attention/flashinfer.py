"""FlashInfer backend: multi-item-scoring paged prefill (page size 1 over the batch's own K/V), CUDA only.

Only BatchPrefillWithPagedKVCacheWrapper applies the multi-item mask (the ragged wrapper silently
ignores it; see ../shared/GPU.md), so K/V of the batch are viewed as a paged cache of one-token pages.
RoPE is applied by the model from the pack positions before attention (pos_encoding_mode="NONE").
Not yet run on a GPU in this repository: tests/gpu/ checks it against the sdpa backend where CUDA and
flashinfer exist.
"""

from __future__ import annotations

import torch

from engine.attention.flashinfer_plan import MultiItemMetadata, build_metadata
from engine.batching import Batch
from engine.errors import ScoringInputError

WORKSPACE_BYTES = 256 * 1024 * 1024


class FlashInferPlan:
    """Uploads the CPU-built metadata once, plans the wrapper on the first layer, runs it in every layer."""

    def __init__(self, wrapper, meta: MultiItemMetadata, device: torch.device) -> None:
        self._wrapper = wrapper
        self._meta = meta
        self._device = device
        self._planned = False

    def _plan(self, query: torch.Tensor, key: torch.Tensor, scaling: float | None) -> None:
        meta = self._meta
        indptr = torch.from_numpy(meta.qo_indptr).to(self._device)
        multi_item = {}
        if meta.token_pos_in_items_len > 0:
            multi_item = dict(
                prefix_len_ptr=torch.from_numpy(meta.prefix_len).to(self._device),
                token_pos_in_items_ptr=torch.from_numpy(meta.token_pos_in_items).to(self._device),
                token_pos_in_items_len=meta.token_pos_in_items_len,
                max_item_len_ptr=torch.from_numpy(meta.max_item_len).to(self._device),
            )
        self._wrapper.plan(
            indptr,
            indptr,
            torch.from_numpy(meta.kv_indices).to(self._device),
            torch.from_numpy(meta.kv_last_page_len).to(self._device),
            query.shape[1],
            key.shape[1],
            query.shape[-1],
            1,
            causal=True,
            pos_encoding_mode="NONE",
            sm_scale=scaling,
            q_data_type=query.dtype,
            kv_data_type=key.dtype,
            **multi_item,
        )
        self._planned = True

    def attend(self, query, key, value, scaling, sliding_window, softcap=None):
        """Paged multi-item prefill over the batch; K/V pages are the batch's own tokens."""
        if sliding_window is not None or softcap is not None:
            raise ScoringInputError(
                "the flashinfer backend does not apply sliding windows by position or soft-capping; "
                "use --backend flex"
            )
        if not self._planned:
            self._plan(query, key, scaling)
        q = query[0].transpose(0, 1).contiguous()  # [num_tokens, num_heads, head_dim]
        k = (
            key[0].transpose(0, 1).contiguous().unsqueeze(1)
        )  # [num_pages=num_tokens, page_size=1, kv_heads, head_dim]
        v = value[0].transpose(0, 1).contiguous().unsqueeze(1)
        return self._wrapper.run(q, (k, v)).unsqueeze(0)  # [1, num_tokens, num_heads, head_dim]


class FlashInferBackend:
    """One paged prefill wrapper and its workspace, re-planned per batch."""

    name = "flashinfer"

    def __init__(self, device: torch.device | None = None) -> None:
        import flashinfer

        device = device or torch.device("cuda")
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, kv_layout="NHD", backend="fa2"
        )

    def plan(self, batch: Batch, device: torch.device) -> FlashInferPlan:
        """Metadata is built on the CPU here; the kernel plan happens on the first layer (needs head shapes)."""
        return FlashInferPlan(self._wrapper, build_metadata(batch), device)
