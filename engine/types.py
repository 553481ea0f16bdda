"""The engine's input and output records."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

TokenIds = list[int]


class FlatItems(NamedTuple):
    """Items' token ids as arrays: their tokens back to back and their lengths."""

    tokens: np.ndarray  # [item tokens] int64
    lens: np.ndarray  # [items] int64

    @classmethod
    def of(cls, ids: list[list[int]]) -> FlatItems:
        """Id lists flattened."""
        lens = np.fromiter(map(len, ids), np.int64, len(ids))  # [items]
        return cls(np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lens.sum())), lens)


class ItemRef(NamedTuple):
    """Where a scored item came from: the group's index in the call and the item's index in it."""

    group: int
    item: int


@dataclass(frozen=True)
class Group:
    """One query and its items; text or token ids (never mixed within a run)."""

    query: str | TokenIds
    items: list[str | TokenIds] = field(default_factory=list)


@dataclass
class GroupResult:
    """Per-item results of one group; rows of failed items hold NaN and an error message. `errors` are found
    before the model runs (tokenization, limits); `item_errors` after it (a non-finite output the item gives
    on its own). `failures` merges both. An empty item_errors means none."""

    scores: np.ndarray  # [num_items, num_scores] float32, the Score-API column (docs/semantics.md)
    score: np.ndarray  # [num_items] float32, the activated relevance number of each item
    pooled: np.ndarray | None  # [num_items, hidden] float32, only when asked for
    errors: list[str | None]
    item_errors: tuple[str | None, ...] = ()  # one per item when set: "non-finite score (nan) for item 2"
    raw: np.ndarray | None = None  # [num_items, num_scores] float32 before activation (classifier logits)
    # [num_items] int32 under truncate="chunk": the chunks each item was scored as (1 for an item that fit its
    # limit, 0 for an item that failed before scoring); None otherwise. The other fields are then the
    # aggregate of the item's chunks (ScoringConfig.chunk_aggregate; engine/text/chunking.py).
    chunks: np.ndarray | None = None

    @property
    def failures(self) -> list[str | None]:
        """Each item's error, whichever step found it; None for a scored item."""
        found = list(self.item_errors) or [None] * len(self.errors)
        return [before or after for before, after in zip(self.errors, found)]


@dataclass(frozen=True)
class TokenizedGroup:
    """Token ids of one group; a failed item has ids None and an error message."""

    query_ids: list[int]
    item_ids: list[list[int] | None]
    errors: list[str | None]
    item_first: bool = False
    # truncate="chunk": each item's chunks, each scored as its own item (one chunk, the item itself, when it
    # fits; none when it failed); item_ids then holds each item's whole tokens. None under other policies.
    chunks: list[list[list[int]]] | None = None

    def reference_sequence(self, index: int) -> list[int]:
        """The sequence a separate forward pass of item `index` would see."""
        item = self.item_ids[index]
        assert item is not None
        return item + self.query_ids if self.item_first else self.query_ids + item

    def pair_tokens(self) -> int:
        """Tokens of the sequences a separate pass per item (or, under chunk, per chunk) would hold."""
        chunks = self.chunks or [[ids] for ids in self.item_ids]
        return sum(
            len(self.query_ids) + len(ids)
            for item_chunks, error in zip(chunks, self.errors)
            if error is None
            for ids in item_chunks
        )
