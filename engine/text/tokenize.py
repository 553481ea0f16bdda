"""Text or token ids → token ids per query and item, with templates and truncation (docs/semantics.md: Sequence layout, Truncation)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import replace

from score_batch.engine.config import ScoringConfig
from score_batch.engine.text.chunking import split_chunks
from score_batch.engine.text.encode import Encoded, EncodedTexts, encode_groups, given_ids
from score_batch.engine.text.truncation import check_ids, failed, fit, longest_first, query_head, query_within
from score_batch.engine.types import FlatItems, Group, TokenizedGroup

MIS_DELIMITERS_PER_ITEM = 2  # the delimiter after the query and the one closing the item


def without_unscored_tail(group: TokenizedGroup, tail_id: int | None) -> TokenizedGroup:
    """The group read where transformers' *ForSequenceClassification reads a decoder classifier: at the last
    token of each reference sequence that is not tail_id, its pad id (PlanLimits.unscored_tail_id); at the
    first token when every token is tail_id. Trailing tail_id tokens of items and chunks are dropped; an item
    left empty is read at the query's end. The query's own tail_id tokens move to the front of every non-empty
    item, so an empty item is read at the query's last token that is not tail_id while the others still see
    the whole query. Under item_first the query ends every sequence: its tail is dropped, and the items' too
    when nothing else is left."""
    if tail_id is None:
        return group

    def cut(ids: list[int] | None) -> list[int] | None:
        if not ids or ids[-1] != tail_id:  # the common case: nothing to drop, nothing copied
            return ids
        end = len(ids)
        while end and ids[end - 1] == tail_id:
            end -= 1
        return ids[:end]

    def each(change, ids_list: list[list[int] | None] | None):
        """The lists changed; the same list object when none changed (packing then slices the encodings)."""
        if ids_list is None:
            return None
        changed = [change(ids) for ids in ids_list]
        return ids_list if all(map(operator.is_, changed, ids_list)) else changed

    def each_chunk(change):
        return None if group.chunks is None else [each(change, ws) for ws in group.chunks]

    if group.item_first:  # item + query: the query ends every reference sequence
        query_ids = cut(group.query_ids)
        if query_ids:
            return replace(group, query_ids=query_ids)

        def cut_item(ids: list[int] | None) -> list[int] | None:
            kept = cut(ids)  # all tail_id: read at the sequence's first token
            return kept if ids is None or kept else (ids + group.query_ids)[:1]

        return replace(
            group, query_ids=[], item_ids=each(cut_item, group.item_ids), chunks=each_chunk(cut_item)
        )
    query_ids = group.query_ids
    head = cut(query_ids) or query_ids[:1]  # all tail_id: read at the first token
    tail = query_ids[len(head) :]
    if not tail and group.chunks is None and not any(ids and ids[-1] == tail_id for ids in group.item_ids):
        return group  # the common case: nothing to cut or carry (packing then slices the encodings)

    def cut_and_carry(ids: list[int] | None) -> list[int] | None:
        kept = cut(ids)
        return tail + kept if tail and kept else kept

    return replace(
        group, query_ids=head, item_ids=each(cut_and_carry, group.item_ids), chunks=each_chunk(cut_and_carry)
    )


def tokenize_group(
    group: Group,
    tokenizer,
    cfg: ScoringConfig,
    max_pack_tokens: int,
    vocab_size: int,
    max_positions: int | None = None,
    encoded: tuple | None = None,
) -> TokenizedGroup:
    """Tokenize one group under the config's templates, limits and truncation policy (encoded: its texts
    already encoded by encode_groups). max_positions (max_position_embeddings) bounds each reference sequence
    (query + item), since under multi-item packing an item's positions continue after the query's."""
    text_input = isinstance(group.query, str)
    overhead = 0 if cfg.packing == "single" or cfg.item_first else MIS_DELIMITERS_PER_ITEM
    if any(issubclass(kind, str) != text_input for kind in set(map(type, group.items))):
        return failed(
            len(group.items), "a group must be all text or all token ids (query and items)", cfg.item_first
        )
    if encoded is not None:
        query, items = encoded
    elif text_input:
        query, items = encode_groups([group], tokenizer, cfg)[0]
    else:
        query, items = given_ids(group.query), [given_ids(item) for item in group.items]
    if cfg.truncate == "longest-first":
        return longest_first(
            query, items, tokenizer, cfg, max_pack_tokens - overhead, vocab_size, max_positions
        )
    if cfg.truncate == "query-head":
        return query_head(query, items, cfg, max_pack_tokens, overhead, vocab_size, max_positions)
    pair_limit = max_pack_tokens - overhead
    query_ids, query_error = query_within(query, cfg, pair_limit, vocab_size, max_positions)
    if query_error is not None:
        return failed(len(items), query_error, cfg.item_first)
    return _fit_items(query_ids, items, cfg, text_input, pair_limit, vocab_size, max_positions)


def _fit_items(
    query_ids: list[int],
    items: Sequence[Encoded],
    cfg: ScoringConfig,
    text_input: bool,
    pair_limit: int,
    vocab_size: int,
    max_positions: int | None,
) -> TokenizedGroup:
    """truncate error, item-tail or chunk: each item within what the query leaves of the pack (pair_limit, the
    pack less the delimiters), max_item_tokens and the position limit."""
    item_limit = min(pair_limit - len(query_ids), cfg.max_item_tokens or pair_limit)
    item_why = ""
    if max_positions is not None and max_positions - len(query_ids) < item_limit:
        item_limit = max_positions - len(query_ids)
        item_why = (
            f": with the query's {len(query_ids)} tokens it would pass the model's position limit "
            f"(max_position_embeddings {max_positions})"
        )
    if text_input and cfg.truncate != "chunk" and (query_ids or not cfg.item_first):
        ids = items.ids if isinstance(items, EncodedTexts) else [item.ids for item in items]
        tokens = items.tokens() if isinstance(items, EncodedTexts) else FlatItems.of(ids)
        # the common case, checked over the group's tokens at once
        if _all_fit(tokens, item_limit, vocab_size):
            return TokenizedGroup(query_ids, ids, [None] * len(ids), cfg.item_first)
    item_ids: list[list[int] | None] = []
    errors: list[str | None] = []
    chunks: list[list[list[int]]] | None = [] if cfg.truncate == "chunk" else None
    for index, item in enumerate(items):
        error = check_ids(item.ids, vocab_size, f"item {index}")
        ids, item_chunks = None, []
        if error is None and chunks is not None:
            ids, item_chunks, error = _chunk(item, item_limit, cfg.chunk_overlap, f"item {index}", item_why)
        elif error is None:
            ids, error = fit(item, item_limit, f"item {index}", cfg.truncate, "item-tail", item_why)
        if chunks is not None:
            chunks.append(item_chunks)
        if error is None and cfg.item_first and not ids and not query_ids:
            error = f"item {index} and the query are both empty"
        item_ids.append(ids if error is None else None)
        errors.append(error)
    return TokenizedGroup(query_ids, item_ids, errors, cfg.item_first, chunks)


def _chunk(
    encoded: Encoded, limit: int, overlap: int, what: str, why: str
) -> tuple[list[int], list[list[int]], str | None]:
    """truncate="chunk": (the item's whole ids, its chunks of at most limit tokens, None) or an error. An item
    within the limit is its one chunk; a longer one is split by engine/text/chunking.split_chunks (the
    template's tokens around every chunk, content chunks as a Hugging Face tokenizer's overflow makes
    them)."""
    chunks, reason = split_chunks(encoded.ids, encoded.touching(), limit, overlap)
    if reason is None:
        return encoded.ids, chunks, None
    over = f"{what} has {len(encoded.ids)} tokens, over the limit of {limit}{why}"
    return [], [], f"{over}, and cannot be split into chunks: {reason}"


def _all_fit(items: FlatItems, limit: int, vocab_size: int) -> bool:
    """Whether every item's tokenizer ids fit the limit and the vocabulary (else each is checked on its own)."""
    flat, lens = items
    if not len(lens) or lens.max() > limit:
        return False
    return not len(flat) or (flat.min() >= 0 and flat.max() < vocab_size)
