"""`truncate="chunk"`: an over-long item scored as chunks of its tokens, one result per item (docs/semantics.md:
Truncation). Pure code, no model.

The chunks are those of a Hugging Face fast tokenizer's `return_overflowing_tokens=True` with
`max_length=size, stride=overlap` over the item's content tokens (the Rust `Encoding.truncate` rule: chunks
start at 0, size − overlap, 2·(size − overlap), …, each `size` tokens long, the last one ending at the item's end
and possibly shorter); the item template's own tokens before and after the content wrap every chunk.
Every chunk is scored as an item of its group (the query shared); `aggregate` turns the chunks' results back
into one result per item: max (the chunk with the highest `score`), first, or mean (each column averaged).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from score_batch.engine.config import ScoringConfig
from score_batch.engine.errors import SettingError
from score_batch.engine.types import GroupResult, TokenizedGroup

if TYPE_CHECKING:
    from score_batch.engine.types import ItemRef


def chunk_spans(length: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """[start, stop) of each chunk over `length` tokens: `size` tokens each, `overlap` shared by neighbours.
    Hugging Face's overflow rule: chunks start every size − overlap tokens and stop at the first one that
    reaches the end. An empty sequence is one empty chunk; one within size is itself."""
    if not 0 <= overlap < size:
        raise ValueError(f"chunks of {size} tokens cannot share {overlap} tokens (needs 0 <= overlap < size)")
    spans = []
    start = 0
    while True:
        stop = min(start + size, length)
        spans.append((start, stop))
        if stop == length:
            return spans
        start += size - overlap


def split_chunks(
    ids: list[int], content: list[int], limit: int, overlap: int
) -> tuple[list[list[int]], str | None]:
    """The chunks of one templated item of at most `limit` tokens each, or ([], why it cannot be split).
    content: indices into ids of the tokens holding the item's text, a token straddling the template boundary
    included (all of them for token-id input). The tokens before the first content token (template prefix,
    special tokens) and after the last one (template suffix) wrap every chunk; the content tokens in between
    are split by chunk_spans into runs of limit − len(prefix) − len(suffix) tokens. An item within the limit
    is its own single chunk."""
    if len(ids) <= limit:
        return [list(ids)], None
    if limit <= 0:
        return [], "the query alone fills the limit"
    if not content:
        return [], (
            "no tokens lie inside its text (its template alone is too long, or the tokenizer is not a fast "
            "one: splitting text needs a fast tokenizer's offsets)"
        )
    head, tail = ids[: content[0]], ids[content[-1] + 1 :]
    body = ids[content[0] : content[-1] + 1]
    size = limit - len(head) - len(tail)
    if size <= 0:
        return [], f"its template alone has {len(head) + len(tail)} tokens"
    if overlap >= size:
        return [], (
            f"chunks of {size} content tokens (the limit less {len(head) + len(tail)} template tokens) cannot "
            f"share chunk_overlap {overlap} tokens"
        )
    return [head + body[start:stop] + tail for start, stop in chunk_spans(len(body), size, overlap)], None


def check_chunk_settings(cfg: ScoringConfig, encoder: bool) -> None:
    """Refuse chunk settings that cannot work: encoders (not yet), an overlap as long as the chunk."""
    if cfg.truncate != "chunk":
        return
    if encoder:
        raise SettingError(
            "ScoringConfig.truncate",
            cfg.truncate,
            "does not apply to an encoder cross-encoder yet: its (query, item) pairs are not split into chunks "
            "(use item-tail to cut the item to fit, or error)",
        )
    if cfg.max_item_tokens is not None and cfg.chunk_overlap >= cfg.max_item_tokens:
        raise SettingError(
            "ScoringConfig.chunk_overlap",
            cfg.chunk_overlap,
            f"must be smaller than ScoringConfig.max_item_tokens ({cfg.max_item_tokens}): each chunk must move "
            "forward",
            conflicts=("ScoringConfig.max_item_tokens",),
        )


@dataclass(frozen=True)
class ChunkedGroup:
    """One tokenized group's chunks as the items its packs score, and the item each chunk came from."""

    scored: TokenizedGroup  # the query and every chunk as an item (what the plan's ItemRefs index)
    owners: tuple[int, ...]  # [chunks] the item of each chunk
    firsts: tuple[int, ...]  # [items] the index of each item's first chunk
    counts: tuple[int, ...]  # [items] chunks per item: 1 for an item that fits, 0 for a failed one

    def chunk_name(self, chunk: int) -> str:
        """A chunk as error messages name it: "item 3 (chunk 2 of 5)", or "item 3" for an item's only chunk."""
        item = self.owners[chunk]
        if self.counts[item] == 1:
            return f"item {item}"
        return f"item {item} (chunk {chunk - self.firsts[item] + 1} of {self.counts[item]})"


def chunk_group(group: TokenizedGroup) -> ChunkedGroup:
    """Flatten a group's per-item chunks (TokenizedGroup.chunks; without them, each item is its one chunk)."""
    per_item = group.chunks
    if per_item is None:
        per_item = [[] if ids is None else [ids] for ids in group.item_ids]
    flat: list[list[int]] = []
    owners: list[int] = []
    firsts: list[int] = []
    for item, (chunks, error) in enumerate(zip(per_item, group.errors)):
        firsts.append(len(flat))
        if error is None:
            flat.extend(chunks)
            owners.extend([item] * len(chunks))
    counts = tuple(len(chunks) if error is None else 0 for chunks, error in zip(per_item, group.errors))
    scored = replace(group, item_ids=flat, errors=[None] * len(flat), chunks=None)
    return ChunkedGroup(scored, tuple(owners), tuple(firsts), counts)


class ItemCountdown:
    """Counts the items a run has finished when their last chunk is scored (progress in items, not chunks)."""

    def __init__(self, chunked: list[ChunkedGroup] | None) -> None:
        self.chunked = chunked
        self.left = None if chunked is None else [list(c.counts) for c in chunked]

    def finished(self, refs: tuple[ItemRef, ...]) -> int:
        """How many items the scored refs (chunks) complete."""
        if self.left is None or self.chunked is None:
            return len(refs)
        done = 0
        for ref in refs:
            item = self.chunked[ref.group].owners[ref.item]
            self.left[ref.group][item] -= 1
            done += self.left[ref.group][item] == 0
        return done


def aggregate(
    chunks: list[GroupResult], chunked: list[ChunkedGroup], errors: list[list[str | None]], how: str
) -> list[GroupResult]:
    """Per-chunk GroupResults (one row per chunk) → per-item GroupResults with `chunks` (chunks per item).
    how: max (the chunk with the highest `score`, the first on ties, gives score, scores, raw and pooled),
    first (the item's first chunk), mean (score, scores, raw and pooled each averaged over the chunks). An
    item fails when any of its chunks fails (its error names the chunk); errors are the items' own."""
    return [
        _aggregate_group(result, group, group_errors, how)
        for result, group, group_errors in zip(chunks, chunked, errors)
    ]


def _aggregate_group(
    result: GroupResult, chunked: ChunkedGroup, errors: list[str | None], how: str
) -> GroupResult:
    """One group's chunks → its items (see aggregate)."""
    items = len(chunked.counts)
    per_chunk = {"score": result.score, "scores": result.scores, "raw": result.raw, "pooled": result.pooled}
    # per item, NaN until set: score [items], scores and raw [items, num_scores], pooled [items, hidden]
    per_item = {
        name: None if values is None else np.full((items, *values.shape[1:]), np.nan, np.float32)
        for name, values in per_chunk.items()
    }
    chunk_errors = list(result.item_errors) or [None] * len(chunked.owners)
    item_errors: list[str | None] = [None] * items
    for item, (first, count) in enumerate(zip(chunked.firsts, chunked.counts)):
        if count == 0:
            continue
        rows = slice(first, first + count)
        failed = [e for e in chunk_errors[rows] if e is not None]
        if failed:
            item_errors[item] = failed[0]
            continue
        pick = first + (0 if how == "first" else int(np.argmax(result.score[rows])))
        for name, values in per_chunk.items():
            if values is not None:
                per_item[name][item] = _mean(values[rows]) if how == "mean" else values[pick]
    return GroupResult(
        **per_item,
        errors=list(errors),
        item_errors=tuple(item_errors),
        chunks=np.asarray(chunked.counts, np.int32),
    )


def _mean(values: np.ndarray) -> np.ndarray:
    """The float32 mean over the first axis, summed in float64."""
    return values.astype(np.float64).mean(axis=0).astype(np.float32)
