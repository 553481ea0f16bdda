"""Encoder cross-encoders: (query, item) text pairs → length-sorted padded batches (no packing).

Bidirectional attention lets every token see every other, so items cannot share a sequence; each
pair is encoded by the model's own tokenizer (`tokenizer(query, item)`, with token_type_ids where
the tokenizer makes them), exactly what a plain Hugging Face or sentence-transformers loop feeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from score_batch.engine.config import ScoringConfig
from score_batch.engine.packing import ItemRef
from score_batch.engine.types import Group


@dataclass(frozen=True)
class PairGroup:
    """Encoded pairs of one group; a failed item has ids None and an error message."""

    item_ids: list[list[int] | None]  # each: the whole pair sequence, special tokens included
    type_ids: list[list[int] | None]  # token_type_ids of each pair, or None when the tokenizer has none
    errors: list[str | None]


@dataclass(frozen=True)
class PairBatch:
    """Pairs padded to one width, rows sorted by length."""

    input_ids: np.ndarray  # [rows, width] int64
    attention_mask: np.ndarray  # [rows, width] int64
    token_type_ids: np.ndarray | None  # [rows, width] int64
    item_refs: tuple[ItemRef, ...]

    @property
    def num_tokens(self) -> int:
        """Tokens the forward pass runs, padding included."""
        return int(self.input_ids.size)


def encode_pairs(group: Group, tokenizer, cfg: ScoringConfig, max_length: int) -> PairGroup:
    """Encode every (query, item) pair of a group, truncating the item's tail when allowed."""
    n = len(group.items)
    if not isinstance(group.query, str) or any(not isinstance(item, str) for item in group.items):
        error = "an encoder cross-encoder takes text (its tokenizer builds the pair), not token ids"
        return PairGroup([None] * n, [None] * n, [error] * n)
    query = cfg.query_template.replace("{query}", group.query) if cfg.query_template else group.query
    item_ids: list[list[int] | None] = []
    type_ids: list[list[int] | None] = []
    errors: list[str | None] = []
    for index, raw in enumerate(group.items):
        item = cfg.item_template.replace("{item}", raw) if cfg.item_template else raw
        first, second = (item, query) if cfg.item_first else (query, item)
        encoding = tokenizer(first, second)
        error = None
        if len(encoding["input_ids"]) > max_length:
            if cfg.truncate == "item-tail":
                which = "only_first" if cfg.item_first else "only_second"
                try:
                    encoding = tokenizer(first, second, truncation=which, max_length=max_length)
                except Exception as failure:  # the tokenizer refuses when the query alone is too long
                    error = f"pair {index} cannot be truncated to {max_length} tokens: {failure}"
            else:
                error = (
                    f"pair {index} has {len(encoding['input_ids'])} tokens, over the model's limit of "
                    f"{max_length} (set truncate to item-tail to cut the item to fit)"
                )
        item_ids.append(None if error else list(encoding["input_ids"]))
        types = encoding.get("token_type_ids")
        type_ids.append(None if error or types is None else list(types))
        errors.append(error)
    return PairGroup(item_ids, type_ids, errors)


def make_pair_batches(groups: list[PairGroup], max_batch_tokens: int, pad_id: int) -> list[PairBatch]:
    """Sort valid pairs by length (longest first) and cut padded batches of at most max_batch_tokens."""
    pairs = [
        (len(ids), ItemRef(g, i))
        for g, group in enumerate(groups)
        for i, ids in enumerate(group.item_ids)
        if ids is not None
    ]
    pairs.sort(key=lambda pair: (-pair[0], pair[1]))
    batches: list[PairBatch] = []
    start = 0
    while start < len(pairs):
        width = pairs[start][0]  # the longest row of the batch sets its width
        rows = max(1, max_batch_tokens // max(width, 1))
        chunk = pairs[start : start + rows]
        batches.append(pad_pairs([ref for _, ref in chunk], groups, width, pad_id))
        start += len(chunk)
    return batches


def pad_pairs(refs: list[ItemRef], groups: list[PairGroup], width: int, pad_id: int) -> PairBatch:
    """Right-pad the pairs of refs to width."""
    input_ids = np.full((len(refs), width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(refs), width), dtype=np.int64)
    has_types = groups[refs[0].group].type_ids[refs[0].item] is not None
    token_type_ids = np.zeros((len(refs), width), dtype=np.int64) if has_types else None
    for row, ref in enumerate(refs):
        ids = groups[ref.group].item_ids[ref.item]
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
        if token_type_ids is not None:
            token_type_ids[row, : len(ids)] = groups[ref.group].type_ids[ref.item]
    return PairBatch(input_ids, attention_mask, token_type_ids, tuple(refs))
