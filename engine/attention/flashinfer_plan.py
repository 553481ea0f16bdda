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

from engine.batching import Batch
from engine.packing import DELIMITER_SEGMENT, Pack


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


def pack_item_positions(pack: Pack) -> np.ndarray:
    """token_pos_in_items of one pack: from its first delimiter on, 0 at delimiters, 1.. inside items."""
    suffix = pack.segments[pack.prefix_len :]
    out = np.zeros(suffix.shape[0], dtype=np.int64)
    count = 0
    for i, segment in enumerate(suffix):
        count = 0 if segment == DELIMITER_SEGMENT else count + 1
        out[i] = count
    return out


def build_metadata(batch: Batch) -> MultiItemMetadata:
    """Multi-item plan arguments of a batch of MIS packs."""
    per_pack = [pack_item_positions(p) for p in batch.packs]
    width = max((len(x) for x in per_pack), default=0)
    if max((int(x.max()) if len(x) else 0 for x in per_pack), default=0) > np.iinfo(np.uint16).max:
        raise ValueError("an item is longer than 65,535 tokens, FlashInfer's multi-item limit")
    padded = np.zeros((len(per_pack), width), dtype=np.uint16)
    for i, positions in enumerate(per_pack):
        padded[i, : len(positions)] = positions
    return MultiItemMetadata(
        qo_indptr=batch.cu_seqlens.astype(np.int32),
        kv_indices=np.arange(batch.num_tokens, dtype=np.int32),
        kv_last_page_len=np.ones(len(batch.packs), dtype=np.int32),
        prefix_len=np.asarray([p.prefix_len for p in batch.packs], dtype=np.uint32),
        token_pos_in_items=padded.reshape(-1),
        token_pos_in_items_len=width,
        max_item_len=np.asarray([int(x.max()) if len(x) else 0 for x in per_pack], dtype=np.uint16),
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
