"""Packs → ragged batches under a token budget, concatenated without padding."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from score_batch.engine.plan.packing import ItemRef, Pack


@dataclass(frozen=True)
class Batch:
    """Packs concatenated into one ragged row, with the metadata attention backends plan from."""

    packs: tuple[Pack, ...]
    token_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    segments: np.ndarray  # [num_tokens] int32, per-pack segment ids (see packing)
    pack_index: np.ndarray  # [num_tokens] int32, which pack each token belongs to
    cu_seqlens: np.ndarray  # [num_packs + 1] int64, pack boundaries
    score_rows: np.ndarray  # [num_items] int64, rows in the concatenated batch
    item_refs: tuple[ItemRef, ...]

    @property
    def num_tokens(self) -> int:
        """Tokens in the batch (what the forward pass runs)."""
        return int(self.token_ids.shape[0])


def collate(packs: list[Pack]) -> Batch:
    """Concatenate packs into one Batch, shifting each pack's score rows by its offset."""
    lengths = np.asarray([len(p) for p in packs], dtype=np.int64)
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Batch(
        packs=tuple(packs),
        token_ids=np.concatenate([p.token_ids for p in packs]),
        positions=np.concatenate([p.positions for p in packs]),
        segments=np.concatenate([p.segments for p in packs]),
        pack_index=np.repeat(np.arange(len(packs), dtype=np.int32), lengths),
        cu_seqlens=cu_seqlens,
        score_rows=np.concatenate([p.score_rows + offset for p, offset in zip(packs, cu_seqlens[:-1])]),
        item_refs=tuple(itertools.chain.from_iterable(p.item_refs for p in packs)),
    )


def batch_order(packs: list[Pack]) -> list[int]:
    """Pack indices longest first; a group with cached packs runs together, after its storing pack. A pack
    sorts by (-len(pack), its index); a group with cached packs sorts as its storing pack, then by its packs'
    order (storing pack first), so its cached packs run in the storing pack's batch or a later one, and few
    cache entries are alive at once."""
    storing = {p.query_key: i for i, p in enumerate(packs) if p.stores_query}
    missing = {p.query_key for p in packs if p.query_cached} - storing.keys()
    if missing:
        raise ValueError(f"cached packs without a pack storing their query: keys {sorted(missing)}")

    def sort_key(index: int) -> tuple[int, int, int]:
        pack = packs[index]
        if pack.query_key is None:
            return (-len(pack), index, 0)
        lead = storing[pack.query_key]
        return (-len(packs[lead]), lead, 0 if index == lead else 1 + index)

    return sorted(range(len(packs)), key=sort_key)


def make_batches(packs: list[Pack], max_batch_tokens: int) -> list[Batch]:
    """Group packs in batch_order into batches of at most max_batch_tokens (an oversized pack goes alone)."""
    batches: list[Batch] = []
    current: list[Pack] = []
    tokens = 0
    for index in batch_order(packs):
        pack = packs[index]
        if current and tokens + len(pack) > max_batch_tokens:
            batches.append(collate(current))
            current, tokens = [], 0
        current.append(pack)
        tokens += len(pack)
    if current:
        batches.append(collate(current))
    return batches
