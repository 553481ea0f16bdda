"""CPU fast path: per pack, causal SDPA over the query, then all items at once against query + own K/V.

Same mask as the dense reference, without its quadratic cost in the number of items: item rows only
ever look at the query and their own item, so they are gathered into an [items, item_len] block.
Delimiter rows are never read and never attended to; their outputs are left at zero.

On the CPU (no soft-capping, no sliding window) an item row's attention is computed in two mask-free
parts and merged exactly by their log-sum-exp: every item row against the query's K/V in one call, and
each item causally against its own K/V. Nothing is copied per item, where the general path concatenates
the query's K/V to every item's block and runs one masked SDPA.

A cached pack (Pack.query_cached) holds no query rows: its items take the query's K/V of this layer from
the run's QueryCache, where the group's storing pack put them, through the same two paths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from score_batch.engine.attention.base import Capabilities
from score_batch.engine.attention.query_cache import QueryCache, cached_query_kv, check_cache, store_query_kv
from score_batch.engine.attention.softcap import attention, repeat_kv
from score_batch.engine.plan.batching import Batch
from score_batch.engine.plan.packing import Pack, attention_mask


@dataclass(frozen=True)
class _PackLayout:
    """Index tensors of one pack in batch coordinates."""

    pack: Pack
    query_start: int  # batch row of the query's first token (of the first delimiter when cached)
    query_len: int
    query_mask: torch.Tensor | None  # [q, q] bool, only when a sliding window applies (inline query)
    item_index: torch.Tensor | None  # [num_items, item_len] int64 rows of item tokens (clipped)
    item_rows: torch.Tensor | None  # [item_tokens] int64 batch rows of the real item tokens
    item_slots: torch.Tensor | None  # [item_tokens] int64 their places in the flattened [items * item_len]
    item_mask: torch.Tensor | None  # [num_items, 1, item_len, q + item_len] bool


def _layout(batch: Batch, pack_id: int, device: torch.device, sliding_window: int | None) -> _PackLayout:
    """Gather indices and masks of one pack (built on the CPU once per batch and window size)."""
    pack = batch.packs[pack_id]
    start = int(batch.cu_seqlens[pack_id])
    q = pack.prefix_len
    query_mask = None
    if sliding_window is not None and not pack.query_cached:
        query_mask = torch.from_numpy(
            attention_mask(pack.segments[:q], pack.positions[:q], sliding_window)
        ).to(device)
    item_ids = [k for k in np.unique(pack.segments) if k >= 0]
    if not item_ids:
        return _PackLayout(pack, start, q, query_mask, None, None, None, None)
    rows = [np.flatnonzero(pack.segments == k) for k in item_ids]
    width = max(len(r) for r in rows)
    index = np.zeros((len(rows), width), dtype=np.int64)
    valid = np.zeros((len(rows), width), dtype=bool)
    for i, r in enumerate(rows):
        index[i, : len(r)] = r + start
        index[i, len(r) :] = r[-1] + start
        valid[i, : len(r)] = True
    own = np.tril(np.ones((width, width), dtype=bool))[None] & valid[:, None, :]  # [items, width, width]
    # [items, width, q + width]
    mask = np.concatenate([np.ones((len(rows), width, q), dtype=bool), own], axis=2)
    if sliding_window is not None:
        row_pos = q + np.arange(width)
        key_pos = np.concatenate([np.arange(q), q + np.arange(width)])
        mask &= ((row_pos[:, None] - key_pos[None, :]) < sliding_window)[None]
    # Kept rows as integer indices built here: a boolean index on the device would sync per pack and layer.
    slots = np.flatnonzero(valid.reshape(-1))  # [item_tokens]
    return _PackLayout(
        pack,
        start,
        q,
        query_mask,
        torch.from_numpy(index).to(device),
        torch.from_numpy(index.reshape(-1)[slots]).to(device),
        torch.from_numpy(slots).to(device),
        torch.from_numpy(mask[:, None]).to(device),
    )


def merged_parts_apply(query: torch.Tensor, sliding_window: int | None, softcap: float | None) -> bool:
    """Whether item rows take the two-part log-sum-exp path (CPU fp32/bf16, no cap, no window)."""
    return (
        query.device.type == "cpu"
        and query.dtype in (torch.float32, torch.bfloat16)
        and sliding_window is None
        and softcap is None
    )


def _attention_with_lse(query, key, value, scaling, causal):
    """SDPA output [..., heads, q_len, d] and its log-sum-exp [..., heads, q_len] (fp32), CPU flash kernel."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, causal, scale=scaling
    )


def _items_by_merged_parts(
    q_all, k_all, v_all, k_query, v_query, layout: _PackLayout, scaling
) -> torch.Tensor:
    """Attention output of a pack's real item tokens [heads, item_tokens, d], from two merged mask-free parts.
    k_query, v_query: the pack's query K/V [kv_heads, q, d] (its own rows, or the cached ones)."""
    heads = q_all.shape[0]
    n, width = layout.item_index.shape
    flat = layout.item_index.reshape(-1)  # [n * width]
    q_items = q_all[:, flat]  # [heads, n * width, d]
    k_query = repeat_kv(k_query, heads)  # [heads, q, d]
    v_query = repeat_kv(v_query, heads)
    out_query, lse_query = _attention_with_lse(q_items[None], k_query[None], v_query[None], scaling, False)

    def blocks(t: torch.Tensor) -> torch.Tensor:  # [heads, n * width, d] -> [n, heads, width, d]
        return t.view(heads, n, width, -1).transpose(0, 1)

    k_items = repeat_kv(k_all[:, flat], heads)  # [heads, n * width, d]
    v_items = repeat_kv(v_all[:, flat], heads)
    # Padding slots repeat an item's last token after its real ones: causal rows never see them.
    out_own, lse_own = _attention_with_lse(blocks(q_items), blocks(k_items), blocks(v_items), scaling, True)
    out_own = out_own.transpose(0, 1).reshape(heads, n * width, -1)  # [heads, n * width, d]
    lse_own = lse_own.transpose(0, 1).reshape(heads, n * width)
    # softmax over [query ; own] keys = the two parts weighted by their share of the total exp-sum.
    share_own = torch.sigmoid(lse_own - lse_query[0]).unsqueeze(-1)  # [heads, n * width, 1]
    merged = torch.lerp(out_query[0].float(), out_own.float(), share_own).to(q_all.dtype)
    return merged[:, layout.item_slots]  # [heads, item_tokens, d]


class SplitPlan:
    """Per-pack layouts, built lazily per sliding-window size and reused by every layer."""

    def __init__(self, batch: Batch, device: torch.device, query_cache: QueryCache | None = None) -> None:
        check_cache(batch, query_cache)
        self._batch = batch
        self._device = device
        self._cache = query_cache
        self._layouts: dict[int | None, list[_PackLayout]] = {}

    def _pack_layouts(self, sliding_window: int | None) -> list[_PackLayout]:
        if sliding_window not in self._layouts:
            self._layouts[sliding_window] = [
                _layout(self._batch, p, self._device, sliding_window) for p in range(len(self._batch.packs))
            ]
        return self._layouts[sliding_window]

    def attend(self, query, key, value, scaling, sliding_window, softcap=None, layer=0):
        """Query block causal, item blocks against [query K/V ; own K/V] (the query's K/V cached or inline)."""
        store_query_kv(self._cache, self._batch, key, value, layer)
        q_all, k_all, v_all = query[0], key[0], value[0]  # [heads, num_tokens, head_dim]
        output = torch.zeros_like(q_all)
        for layout in self._pack_layouts(sliding_window):
            if layout.pack.query_cached:
                k_query, v_query = cached_query_kv(self._cache, layout.pack, layer)  # [kv_heads, q, d]
            else:
                s, e = layout.query_start, layout.query_start + layout.query_len
                # 4-D views: with 3-D inputs the CPU SDPA dispatch falls back to its slow math kernel (~9x).
                output[:, s:e] = attention(
                    query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], layout.query_mask, scaling, softcap
                )[0]
                k_query, v_query = k_all[:, s:e], v_all[:, s:e]  # [kv_heads, q, d]
            if layout.item_index is None:
                continue
            if merged_parts_apply(query, sliding_window, softcap):
                item_output = _items_by_merged_parts(q_all, k_all, v_all, k_query, v_query, layout, scaling)
            else:
                item_output = _items_by_mask(q_all, k_all, v_all, k_query, v_query, layout, scaling, softcap)
            output[:, layout.item_rows] = item_output
        return output.unsqueeze(0).transpose(1, 2)


def _items_by_mask(q_all, k_all, v_all, k_query, v_query, layout: _PackLayout, scaling, softcap):
    """Attention output of a pack's real item tokens [heads, item_tokens, d]: one masked SDPA per item block."""
    n, width = layout.item_index.shape
    flat = layout.item_index.reshape(-1)

    def gather(t: torch.Tensor) -> torch.Tensor:  # [heads, num_tokens, d] → [items, heads, width, d]
        return t[:, flat].reshape(t.shape[0], n, width, -1).transpose(0, 1)

    k_items = torch.cat([k_query.unsqueeze(0).expand(n, -1, -1, -1), gather(k_all)], dim=2)
    v_items = torch.cat([v_query.unsqueeze(0).expand(n, -1, -1, -1), gather(v_all)], dim=2)
    # [items, kv_heads, q + width, d] keys and values; output [items, heads, width, head_dim]
    out_items = attention(gather(q_all), k_items, v_items, layout.item_mask, scaling, softcap)
    out_flat = out_items.transpose(0, 1).reshape(q_all.shape[0], n * width, -1)  # [heads, n*width, d]
    return out_flat[:, layout.item_slots]


class SplitBackend:
    """The MIS-structured SDPA backend (the CPU default)."""

    name = "split"
    capabilities = Capabilities(
        devices=frozenset({"cpu", "cuda"}), auto_devices=frozenset({"cpu"}), cached_query=True
    )

    def __init__(self, device: torch.device) -> None:
        pass

    def plan(self, batch: Batch, device: torch.device, query_cache: QueryCache | None = None) -> SplitPlan:
        """Layouts are built on first use by a layer."""
        return SplitPlan(batch, device, query_cache)
