"""Encoder cross-encoders: (query, item) text pairs → length-sorted padded batches (no packing).

Bidirectional attention lets every token see every other, so items cannot share a sequence; the
pairs of a group are encoded by the model's own tokenizer in one batch call (`tokenizer([(query,
item), …])`, with token_type_ids where the tokenizer makes them), exactly what sentence-transformers'
CrossEncoder feeds its model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from score_batch.engine.config import ScoringConfig
from score_batch.engine.types import Group, ItemRef


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
    """Encode every (query, item) pair of a group in one batch call, as CrossEncoder's batches encode them.
    `tokenizer([(query, item), …])` encodes an empty item as a pair (`[CLS] q [SEP] [SEP]`), where a call with
    one pair `tokenizer(query, "")` drops it (`[CLS] q [SEP]`). Beyond max_length: truncate="error" is a
    per-item error, "item-tail" cuts the item's end (only_second; only_first under item_first) and
    "longest-first" is the tokenizer's longest_first rule, CrossEncoder's."""
    n = len(group.items)
    if not isinstance(group.query, str) or any(not isinstance(item, str) for item in group.items):
        error = "an encoder cross-encoder takes text (its tokenizer builds the pair), not token ids"
        return PairGroup([None] * n, [None] * n, [error] * n)
    if not n:
        return PairGroup([], [], [])
    query = cfg.query_template.replace("{query}", group.query) if cfg.query_template else group.query
    items = [cfg.item_template.replace("{item}", raw) if cfg.item_template else raw for raw in group.items]
    pairs = [(item, query) if cfg.item_first else (query, item) for item in items]
    if cfg.truncate == "longest-first":
        encodings = _encode_batch(tokenizer, pairs, truncation="longest_first", max_length=max_length)
    else:
        encodings = _encode_batch(tokenizer, pairs)
    item_ids: list[list[int] | None] = []
    type_ids: list[list[int] | None] = []
    errors: list[str | None] = []
    for index, (pair, encoding) in enumerate(zip(pairs, encodings)):
        error = encoding if isinstance(encoding, str) else None
        if error is None and len(encoding["input_ids"]) > max_length:
            if cfg.truncate == "item-tail":
                which = "only_first" if cfg.item_first else "only_second"
                encoding = _encode_batch(tokenizer, [pair], truncation=which, max_length=max_length)[0]
                if isinstance(encoding, str):
                    error = f"pair {index} cannot be truncated to {max_length} tokens: {encoding}"
            else:
                error = (
                    f"pair {index} has {len(encoding['input_ids'])} tokens, over the model's limit of "
                    f"{max_length} (set truncate to longest-first or item-tail to cut it to fit)"
                )
        item_ids.append(None if error else list(encoding["input_ids"]))
        types = None if error else encoding.get("token_type_ids")
        type_ids.append(None if types is None else list(types))
        errors.append(error)
    return PairGroup(item_ids, type_ids, errors)


def _encode_batch(tokenizer, pairs: list[tuple[str, str]], **kwargs) -> list[dict | str]:
    """Each pair's encoding ({input_ids, token_type_ids?}) from one batch call, or why it cannot be encoded. A
    tokenizer refuses a whole batch when one pair cannot be truncated as asked (a query longer than the limit
    under only_second); the pairs are then encoded one at a time (still in batch form, so that an empty item
    stays a pair) to name the ones that fail."""
    try:
        encoding = tokenizer([list(pair) for pair in pairs], **kwargs)
    except Exception as failure:  # the tokenizers library raises a bare Exception for truncation errors
        if len(pairs) == 1:
            return [str(failure)]
        return [_encode_batch(tokenizer, [pair], **kwargs)[0] for pair in pairs]
    names = [name for name in ("input_ids", "token_type_ids") if name in encoding]
    return [{name: encoding[name][row] for name in names} for row in range(len(pairs))]


def duplicate_pairs(groups: list[PairGroup]) -> dict[ItemRef, tuple[ItemRef, ...]]:
    """Each encoded pair that later ones repeat exactly (same input ids and token type ids: the same query and
    item as the model sees them) → those repeats, across the call's groups: scored once and copied."""
    first: dict[tuple, ItemRef] = {}  # (ids, type ids) → the pair's first ItemRef
    copies: dict[ItemRef, list[ItemRef]] = {}
    for g, group in enumerate(groups):
        for i, ids in enumerate(group.item_ids):
            if ids is None:
                continue
            types = group.type_ids[i]
            ref = ItemRef(g, i)
            original = first.setdefault((tuple(ids), None if types is None else tuple(types)), ref)
            if original != ref:
                copies.setdefault(original, []).append(ref)
    return {original: tuple(refs) for original, refs in copies.items()}


def make_pair_batches(
    groups: list[PairGroup], max_batch_tokens: int, pad_id: int, skip: frozenset[ItemRef] = frozenset()
) -> list[PairBatch]:
    """Sort valid pairs by length (longest first) and cut padded batches of at most max_batch_tokens; the pairs
    in skip (repeats of an earlier one: duplicate_pairs) are left out."""
    pairs = [
        (len(ids), ItemRef(g, i))
        for g, group in enumerate(groups)
        for i, ids in enumerate(group.item_ids)
        if ids is not None and (not skip or ItemRef(g, i) not in skip)
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
