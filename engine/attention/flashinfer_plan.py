"""CPU-built metadata for FlashInfer's multi-item-scoring paged prefill (pure numpy, testable without a GPU).

For each pack (one request): prefix_len = the query length; token_pos_in_items covers the tokens from
the first delimiter to the end: 0 at every delimiter, 1, 2, … inside each item; requests are
concatenated, each zero-padded to a common length; max_item_len = the longest item. The kernel's
rule (FlashInfer's FA2 and FA3 multi-item paths) is reproduced by `kernel_mask` so tests can compare it
with the reference mask of engine.plan.packing.

Cached packs (Pack.query_cached: `D item D item … D`, the query computed once per group) are planned the
way FlashInfer's own multi-item benchmark plans a cached prefix: the request's Q rows are the pack's own
tokens, its KV pages are the query's pages followed by the pack's own, and prefix_len is the query length.
The kernel places Q row r at KV position r + kv_len - qo_len (= r + q), so its rule is unchanged. The
query's pages are the storing pack's query rows when that pack is in the same batch (no copy), else pages
appended after the batch's own tokens that the plan fills from the QueryCache in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from score_batch.engine.plan.batching import Batch
from score_batch.engine.plan.packing import DELIMITER_SEGMENT, Pack

MAX_ITEM_TOKENS = int(np.iinfo(np.uint16).max)  # token_pos_in_items is uint16


@dataclass(frozen=True)
class CachedQuery:
    """A query's K/V pages appended after the batch's own tokens, filled from the QueryCache each layer."""

    key: int  # Pack.query_key
    first_page: int  # its first page (>= the batch's token count)
    length: int  # the query's length (its pages)


@dataclass(frozen=True)
class StoredQuery:
    """A storing pack's query rows in the batch, put into the QueryCache each layer."""

    key: int  # Pack.query_key
    start: int  # the pack's first batch row
    length: int  # the query's length


@dataclass(frozen=True)
class MultiItemMetadata:
    """The plan() arguments of BatchPrefillWithPagedKVCacheWrapper for one batch (host arrays)."""

    qo_indptr: np.ndarray  # [num_packs + 1] int32, the packs' rows in the batch
    kv_indices: np.ndarray  # [kv_pages] int32 (page size 1: one page per key token)
    kv_last_page_len: np.ndarray  # [num_packs] int32, all ones
    prefix_len: np.ndarray  # [num_packs] uint32, the query length of each pack
    token_pos_in_items: np.ndarray  # [num_packs * token_pos_in_items_len] uint16
    token_pos_in_items_len: int
    max_item_len: np.ndarray  # [num_packs] uint16
    # [num_packs + 1] int32; None: equal to qo_indptr (no cached pack: every pack's keys are its own rows)
    kv_indptr_: np.ndarray | None = None
    num_pages: int = -1  # pages of the paged K/V: the batch's tokens, then cached queries' pages (-1: tokens)
    cached: tuple[CachedQuery, ...] = ()
    stored: tuple[StoredQuery, ...] = ()

    @property
    def kv_indptr(self) -> np.ndarray:
        """[num_packs + 1] int32: each pack's slice of kv_indices."""
        return self.qo_indptr if self.kv_indptr_ is None else self.kv_indptr_

    @property
    def pages(self) -> int:
        """Pages of the paged K/V: the batch's own tokens plus the appended cached queries."""
        return int(self.qo_indptr[-1]) if self.num_pages < 0 else self.num_pages


def _positions_in_items(segments: np.ndarray) -> np.ndarray:
    """Per token: its distance to the last delimiter at or before it (0 at delimiters); vectorized."""
    index = np.arange(segments.shape[0])
    last_delimiter = np.maximum.accumulate(np.where(segments == DELIMITER_SEGMENT, index, -1))
    return index - last_delimiter  # [length]; only meaningful from the first delimiter on


def pack_item_positions(pack: Pack) -> np.ndarray:
    """token_pos_in_items of one pack: from its first delimiter on, 0 at delimiters, 1.. inside items."""
    positions = _positions_in_items(pack.segments)
    return positions if pack.query_cached else positions[pack.prefix_len :]  # cached: starts at a delimiter


def build_metadata(batch: Batch) -> MultiItemMetadata:
    """Multi-item plan arguments of a batch of MIS packs (numpy over the whole batch, no per-token loop)."""
    if any(p.query_cached for p in batch.packs):
        return _build_cached_metadata(batch)
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
    return _metadata(batch, padded, index, stored=_stored(batch))


def _metadata(batch: Batch, padded: np.ndarray, kv_indices: np.ndarray, **paging) -> MultiItemMetadata:
    """A batch's plan arguments from its padded token_pos_in_items [num_packs, width] and its KV pages."""
    max_item_len = padded.max(axis=1, initial=0)  # [num_packs]
    if max_item_len.max(initial=0) > MAX_ITEM_TOKENS:
        raise ValueError(f"an item is longer than {MAX_ITEM_TOKENS:,} tokens, FlashInfer's multi-item limit")
    return MultiItemMetadata(
        qo_indptr=batch.cu_seqlens.astype(np.int32),
        kv_indices=kv_indices.astype(np.int32),
        kv_last_page_len=np.ones(len(batch.packs), dtype=np.int32),
        prefix_len=np.asarray([p.prefix_len for p in batch.packs], dtype=np.uint32),
        token_pos_in_items=padded.astype(np.uint16).reshape(-1),
        token_pos_in_items_len=padded.shape[1],
        max_item_len=max_item_len.astype(np.uint16),
        **paging,
    )


def _stored(batch: Batch) -> tuple[StoredQuery, ...]:
    """The storing packs of a batch (Pack.stores_query): their query rows go into the QueryCache."""
    starts = batch.cu_seqlens
    return tuple(
        StoredQuery(p.query_key, int(starts[i]), p.prefix_len)
        for i, p in enumerate(batch.packs)
        if p.stores_query
    )


def _build_cached_metadata(batch: Batch) -> MultiItemMetadata:
    """Metadata of a batch with cached packs: their KV = the query's pages, then their own (per-pack loop)."""
    starts = batch.cu_seqlens.astype(np.int64)
    stored = _stored(batch)
    in_batch = {s.key: s for s in stored}
    cached: dict[int, CachedQuery] = {}
    next_page = batch.num_tokens
    kv_pages, kv_lens, suffixes = [], [], []
    for i, pack in enumerate(batch.packs):
        own = np.arange(starts[i], starts[i + 1], dtype=np.int64)  # [len] the pack's own pages
        if pack.query_cached:
            q = pack.prefix_len
            if pack.query_key in in_batch:  # the storing pack's query rows, in this batch's own K/V
                first = in_batch[pack.query_key].start
            else:
                if pack.query_key not in cached:
                    cached[pack.query_key] = CachedQuery(pack.query_key, next_page, q)
                    next_page += q
                first = cached[pack.query_key].first_page
            kv_pages.append(np.concatenate([np.arange(first, first + q, dtype=np.int64), own]))
        else:
            kv_pages.append(own)
        kv_lens.append(kv_pages[-1].shape[0])
        suffixes.append(pack_item_positions(pack))  # from the first delimiter on
    width = max((s.shape[0] for s in suffixes), default=0)
    padded = np.zeros((len(batch.packs), width), dtype=np.int64)  # [num_packs, width]
    for i, suffix in enumerate(suffixes):
        padded[i, : suffix.shape[0]] = suffix
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    return _metadata(
        batch,
        padded,
        np.concatenate(kv_pages),
        kv_indptr_=kv_indptr,
        num_pages=next_page,
        cached=tuple(cached.values()),
        stored=stored,
    )


def kernel_mask(
    prefix_len: int, token_pos_in_items: np.ndarray, length: int, kv_len: int | None = None
) -> np.ndarray:
    """The [length, kv_len] mask FlashInfer's multi-item kernel applies to one request of `length` Q rows. Q
    row r sits at KV position p = r + kv_len - length (kv_len = length unless a cached query precedes the
    rows). Row p sees column k iff k <= p and (p < prefix or k < prefix or p - k < t(p)), with t(p) =
    token_pos_in_items[p - prefix] (0 at delimiters, so a delimiter row sees only the query). Read from
    prefill.cuh's logits_mask_multi_item_scoring (FA2) and hopper/mainloop_mma.cuh's mask_multi_item_scoring
    (FA3), FlashInfer 0.6.6."""
    kv_len = length if kv_len is None else kv_len
    p = np.arange(length)[:, None] + (kv_len - length)  # [length, 1] KV position of each Q row
    k = np.arange(kv_len)[None, :]
    t = np.zeros((length, 1), dtype=np.int64)
    in_suffix = p >= prefix_len
    rows = np.flatnonzero(in_suffix[:, 0])
    t[rows, 0] = token_pos_in_items[p[rows, 0] - prefix_len]
    return (k <= p) & (~in_suffix | (k < prefix_len) | ((p - k) < t))
