"""CPU-built metadata for FlashInfer's multi-item-scoring paged prefill (pure numpy, testable without a GPU).

For each pack (one request): prefix_len = the query length; token_pos_in_items covers the tokens from
the first delimiter to the end: 0 at every delimiter, 1, 2, … inside each item; requests are
concatenated, each zero-padded to a common length; max_item_len = the longest item. The kernel's
rule (FlashInfer's FA2 multi-item path) is reproduced by `kernel_mask` so tests can compare it with
the reference mask of engine.packing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from score_batch.engine.batching import Batch
from score_batch.engine.packing import DELIMITER_SEGMENT, Pack

MAX_ITEM_TOKENS = int(np.iinfo(np.uint16).max)  # token_pos_in_items is uint16


@dataclass(frozen=True)
class MultiItemMetadata:
    """The plan() arguments of BatchPrefillWithPagedKVCacheWrapper for one batch (host arrays)."""

    qo_indptr: np.ndarray  # [num_packs + 1] int32 (also kv_indptr: page size 1 over the batch's own K/V)
    kv_indices: np.ndarray  # [num_tokens] int32
    kv_last_page_len: np.ndarray  # [num_packs] int32, all ones
    prefix_len: np.ndarray  # [num_packs] uint32, the query length of each pack
    token_pos_in_items: np.ndarray  # [num_packs * token_pos_in_items_len] uint16
    token_pos_in_items_len: int
    max_item_len: np.ndarray  # [num_packs] uint16


def _positions_in_items(segments: np.ndarray) -> np.ndarray:
    """Per token: its distance to the last delimiter at or before it (0 at delimiters); vectorized."""
    index = np.arange(segments.shape[0])
    last_delimiter = np.maximum.accumulate(np.where(segments == DELIMITER_SEGMENT, index, -1))
    return index - last_delimiter  # [length]; only meaningful from the first delimiter on


def pack_item_positions(pack: Pack) -> np.ndarray:
    """token_pos_in_items of one pack: from its first delimiter on, 0 at delimiters, 1.. inside items."""
    return _positions_in_items(pack.segments)[pack.prefix_len :]


def build_metadata(batch: Batch) -> MultiItemMetadata:
    """Multi-item plan arguments of a batch of MIS packs (numpy over the whole batch, no per-token loop)."""
    num_packs = len(batch.packs)
    prefix_len = np.asarray([p.prefix_len for p in batch.packs], dtype=np.int64)  # [num_packs]
    suffix_start = batch.cu_seqlens[:-1] + prefix_len  # [num_packs], batch row of each first delimiter
    suffix_len = batch.cu_seqlens[1:] - suffix_start  # [num_packs]
    width = int(suffix_len.max(initial=0))
    index = np.arange(batch.num_tokens)
    pack = batch.pack_index  # [num_tokens]
    column = index - suffix_start[pack]  # [num_tokens], negative inside the query
    in_suffix = column >= 0
    positions = _positions_in_items(batch.segments)  # [num_tokens]; packs start their suffix with a delimiter
    padded = np.zeros((num_packs, width), dtype=np.int64)  # [num_packs, width]
    padded[pack[in_suffix], column[in_suffix]] = positions[in_suffix]
    max_item_len = padded.max(axis=1, initial=0)  # [num_packs]
    if max_item_len.max(initial=0) > MAX_ITEM_TOKENS:
        raise ValueError(f"an item is longer than {MAX_ITEM_TOKENS:,} tokens, FlashInfer's multi-item limit")
    return MultiItemMetadata(
        qo_indptr=batch.cu_seqlens.astype(np.int32),
        kv_indices=index.astype(np.int32),
        kv_last_page_len=np.ones(num_packs, dtype=np.int32),
        prefix_len=prefix_len.astype(np.uint32),
        token_pos_in_items=padded.astype(np.uint16).reshape(-1),
        token_pos_in_items_len=width,
        max_item_len=max_item_len.astype(np.uint16),
    )


def kernel_mask(prefix_len: int, token_pos_in_items: np.ndarray, length: int) -> np.ndarray:
    """The [length, length] mask FlashInfer's multi-item kernel applies to one request.

    Row p sees column k iff k <= p and (p < prefix or k < prefix or p - k < t(p)), t(p) = the item
    position of row p (0 at delimiters, so a delimiter row sees only the query).
    """
    p = np.arange(length)[:, None]
    k = np.arange(length)[None, :]
    t = np.zeros(length, dtype=np.int64)
    t[prefix_len:] = token_pos_in_items[: length - prefix_len]
    in_suffix = p >= prefix_len
    allowed = (k <= p) & (~in_suffix | (k < prefix_len) | ((p - k) < t[:, None]))
    return allowed
