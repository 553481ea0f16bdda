"""Groups → packs: the multi-item sequence layout of docs/semantics.md (pure CPU code, no model)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from score_batch.engine.types import FlatItems, ItemRef

QUERY_SEGMENT = -1
DELIMITER_SEGMENT = -2


@dataclass(frozen=True)
class Pack:
    """One packed sequence: a query and a run of its items (MIS), or one reference sequence (single)."""

    token_ids: np.ndarray  # [length] int64
    positions: np.ndarray  # [length] int64, the RoPE positions
    segments: np.ndarray  # [length] int32: -1 query, -2 delimiter, k >= 0 item k of this pack
    score_rows: np.ndarray  # [num_items] int64, row of each item's score inside the pack
    item_refs: tuple[ItemRef, ...]
    prefix_len: int  # the query's length (the whole sequence when single), in the pack or not
    # The group's query cache entry (the group's index in the plan): set on the pack that stores the
    # query's per-layer K/V and on the packs that read them; None when the group has no cached pack.
    query_key: int | None = None
    # The pack starts at its first delimiter: its query K/V come from the cache entry query_key.
    query_cached: bool = False

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def stores_query(self) -> bool:
        """Whether this pack holds its query inline and stores its per-layer K/V for cached packs."""
        return self.query_key is not None and not self.query_cached


def mis_pack(
    query_ids: list[int],
    items: list[list[int]] | FlatItems,
    refs: list[ItemRef],
    delimiter: int,
    query_key: int | None = None,
) -> Pack:
    """Pack `query D item0 D item1 D … D` with restarting positions and per-item score rows (items: each
    item's ids, or all of them as FlatItems). With query_key, the pack also stores its query's per-layer K/V
    under that key for cached packs."""
    if not query_ids:
        raise ValueError("multi-item packing needs a query of at least one token")
    flat, lens = items if isinstance(items, FlatItems) else FlatItems.of(items)  # [item tokens], [n]
    q, n = len(query_ids), len(lens)
    total = q + 1 + int(lens.sum()) + n
    tokens = np.full(total, delimiter, np.int64)  # [total]: delimiters everywhere the items do not write
    positions = np.full(total, q - 1, np.int64)  # a delimiter sits at the query's last position
    segments = np.full(total, DELIMITER_SEGMENT, np.int32)
    tokens[:q], positions[:q], segments[:q] = query_ids, np.arange(q), QUERY_SEGMENT
    ends = np.cumsum(lens + 1)  # [n] each item's end, its closing delimiter included, after `query D`
    starts = q + 1 + ends - lens - 1  # [n] each item's first row
    within = np.arange(len(flat)) - np.repeat(np.cumsum(lens) - lens, lens)  # [item tokens] index in its item
    rows = np.repeat(starts, lens) + within  # [item tokens] where each item token goes
    tokens[rows], positions[rows], segments[rows] = (
        flat,
        q + within,
        np.repeat(np.arange(n, dtype=np.int32), lens),
    )
    # The score row is the item's last token; for an empty item, the query's last token.
    score_rows = np.where(lens > 0, starts + lens - 1, q - 1)
    return Pack(
        token_ids=tokens,
        positions=positions,
        segments=segments,
        score_rows=score_rows.astype(np.int64),
        item_refs=tuple(refs),
        prefix_len=q,
        query_key=query_key,
    )


def cached_mis_pack(
    query_len: int, items: list[list[int]], refs: list[ItemRef], delimiter: int, key: int
) -> Pack:
    """Pack `D item0 D item1 D … D`: the tail of mis_pack's layout, its query K/V read from cache entry key.
    Items must be non-empty: an empty item scores at the query's last token, which this pack lacks."""
    if query_len < 1:
        raise ValueError("multi-item packing needs a query of at least one token")
    if any(not item for item in items):
        raise ValueError("an empty item scores at the query's last token: it needs the query inline")
    inline = mis_pack([delimiter] * query_len, items, refs, delimiter)
    return replace(
        inline,
        token_ids=inline.token_ids[query_len:],
        positions=inline.positions[query_len:],
        segments=inline.segments[query_len:],
        score_rows=inline.score_rows - query_len,
        query_key=key,
        query_cached=True,
    )


def pack_mask(pack: Pack, sliding_window: int | None = None) -> np.ndarray:
    """Dense boolean mask of one pack's rows over its keys: [len, len], or [len, q + len] when cached."""
    if not pack.query_cached:
        return attention_mask(pack.segments, pack.positions, sliding_window)
    q = pack.prefix_len  # a cached pack's keys: [query ; pack tokens]
    segments = np.concatenate([np.full(q, QUERY_SEGMENT, dtype=np.int32), pack.segments])
    positions = np.concatenate([np.arange(q, dtype=np.int64), pack.positions])
    return attention_mask(segments, positions, sliding_window)[q:]


def single_pack(sequence: list[int], ref: ItemRef) -> Pack:
    """Pack one reference sequence on its own: plain causal, scored at its last token."""
    if not sequence:
        raise ValueError("a reference sequence needs at least one token")
    length = len(sequence)
    return Pack(
        token_ids=np.asarray(sequence, dtype=np.int64),
        positions=np.arange(length, dtype=np.int64),
        segments=np.full(length, QUERY_SEGMENT, dtype=np.int32),
        score_rows=np.asarray([length - 1], dtype=np.int64),
        item_refs=(ref,),
        prefix_len=length,
    )


def split_items(query_len: int, item_lens: list[int], max_pack_tokens: int) -> list[list[int]]:
    """Split item indices into consecutive runs whose MIS packs fit max_pack_tokens, each run as long as fits
    (greedy, in order). Every single item must already fit (query_len + item + 2 <= max_pack_tokens)."""
    room = max_pack_tokens - query_len - 1  # what the items and their delimiters may take
    need = np.asarray(item_lens, dtype=np.int64) + 1  # [n] an item and its closing delimiter
    over = np.flatnonzero(need > room)
    if len(over):
        index = int(over[0])
        raise ValueError(
            f"item {index} ({item_lens[index]} tokens) cannot fit a pack of {max_pack_tokens} tokens"
        )
    ends = np.cumsum(need)  # [n] the tokens items 0..k take together
    runs: list[list[int]] = []
    start, used = 0, 0
    while start < len(need):
        stop = int(np.searchsorted(ends, used + room, side="right"))  # past the last item that still fits
        runs.append(list(range(start, stop)))
        start, used = stop, int(ends[stop - 1])
    return runs


def attention_mask(
    segments: np.ndarray, positions: np.ndarray, sliding_window: int | None = None
) -> np.ndarray:
    """Dense boolean [length, length] mask of one pack: True where row i may attend to column j. Row i sees
    column j iff j <= i and (j is a query token, or i and j lie in the same item); a sliding window applies to
    position distance, which equals distance in the reference sequence."""
    length = segments.shape[0]
    row = segments[:, None]  # [length, 1]
    col = segments[None, :]  # [1, length]
    causal = np.tril(np.ones((length, length), dtype=bool))
    visible = (col == QUERY_SEGMENT) | ((col == row) & (row >= 0))
    mask = causal & visible
    if sliding_window is not None:
        mask &= (positions[:, None] - positions[None, :]) < sliding_window
    return mask
