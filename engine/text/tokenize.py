"""Text or token ids → token ids per query and item, with templates and truncation (docs/semantics.md: Sequence layout, Truncation)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from score_batch.engine.config import ScoringConfig
from score_batch.engine.text.backend_tokenizer import BackendTokenizer
from score_batch.engine.text.chunking import split_chunks
from score_batch.engine.types import Group, TokenizedGroup

MIS_DELIMITERS_PER_ITEM = 2  # the delimiter after the query and the one closing the item


def without_unscored_tail(group: TokenizedGroup, tail_id: int | None) -> TokenizedGroup:
    """The group read where transformers' *ForSequenceClassification reads a decoder classifier: at the last
    token of each reference sequence that is not tail_id, its pad id (PlanLimits.unscored_tail_id); at the
    first token when every token is tail_id.

    Trailing tail_id tokens of items and chunks are dropped; an item left empty is read at the query's
    end. The query's own tail_id tokens move to the front of every non-empty item, so an empty item is read at
    the query's last token that is not tail_id while the others still see the whole query. Under item_first
    the query ends every sequence: its tail is dropped, and the items' too when nothing else is left.
    """
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
        return None if ids_list is None else [change(ids) for ids in ids_list]

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

    def cut_and_carry(ids: list[int] | None) -> list[int] | None:
        kept = cut(ids)
        return tail + kept if tail and kept else kept

    return replace(
        group,
        query_ids=head,
        item_ids=each(cut_and_carry, group.item_ids),
        chunks=each_chunk(cut_and_carry),
    )


class _Encoded:
    """Token ids of a templated text and the indices of the tokens that come from the content (computed on first
    use from the tokenizer's offsets: only truncation and chunking read them)."""

    __slots__ = ("ids", "_content", "_offsets", "_span")

    def __init__(self, ids: list[int], content=None, offsets=None, span: tuple[int, int] = (0, 0)) -> None:
        self.ids = ids
        self._content: list[int] | None = content
        self._offsets = offsets  # an object whose .offsets are the tokens' (start, end) characters
        self._span = span  # the content's characters in the templated text

    @property
    def content(self) -> list[int]:
        """Indices into ids of the tokens wholly inside the content."""
        if self._content is None:
            start, end = self._span
            offsets = self._offsets.offsets if self._offsets is not None else ()
            self._content = [i for i, (s, e) in enumerate(offsets) if e > s and s >= start and e <= end]
        return self._content

    def touching(self) -> list[int]:
        """Indices into ids of the tokens holding any of the content's characters: those wholly inside it and a
        token that straddles a template boundary (" red" of "Product: red" with the template's space)."""
        if self._offsets is None:
            return self.content  # token ids given, or a slow tokenizer: no offsets to widen by
        start, end = self._span
        return [i for i, (s, e) in enumerate(self._offsets.offsets) if e > s and s < end and e > start]


def _given_ids(ids) -> _Encoded:
    """Token ids given as input: all content."""
    ids = list(ids)
    return _Encoded(ids, list(range(len(ids))))


def encode_groups(groups: list[Group], tokenizer, cfg: ScoringConfig) -> list[tuple | None]:
    """Per group, its (query, items) encoded, the text of every group in two tokenizer calls (the distinct
    queries, then all items); None for a group that is not all text (tokenize_group handles it)."""
    texts = [isinstance(g.query, str) and all(isinstance(item, str) for item in g.items) for g in groups]
    query_index: dict[str, int] = {}
    for g, is_text in zip(groups, texts):
        if is_text:
            query_index.setdefault(g.query, len(query_index))
    queries = _encode_texts(tokenizer, cfg.query_template, "{query}", list(query_index), not cfg.item_first)
    item_texts = [item for g, is_text in zip(groups, texts) if is_text for item in g.items]
    items = _encode_texts(tokenizer, cfg.item_template, "{item}", item_texts, cfg.item_first)
    out: list[tuple | None] = []
    at = 0
    for g, is_text in zip(groups, texts):
        if is_text:
            out.append((queries[query_index[g.query]], items[at : at + len(g.items)]))
            at += len(g.items)
        else:
            out.append(None)
    return out


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
    if any(isinstance(item, str) != text_input for item in group.items):
        error = "a group must be all text or all token ids (query and items)"
        return TokenizedGroup([], [None] * len(group.items), [error] * len(group.items), cfg.item_first)
    if encoded is not None:
        query, items = encoded
    elif text_input:
        query, items = encode_groups([group], tokenizer, cfg)[0]
    else:
        query, items = _given_ids(group.query), [_given_ids(item) for item in group.items]

    if cfg.truncate == "longest-first":
        return _longest_first(
            query, items, tokenizer, cfg, max_pack_tokens - overhead, vocab_size, max_positions
        )
    if cfg.truncate == "query-head":
        return _query_head(query, items, cfg, max_pack_tokens, overhead, vocab_size, max_positions)
    query_error = _check_ids(query.ids, vocab_size, "query")
    query_ids: list[int] = []
    if query_error is None:
        query_limit = min(cfg.max_query_tokens or max_pack_tokens, max_pack_tokens - overhead)
        why = ""
        if max_positions is not None and max_positions < query_limit:
            query_limit = max_positions
            why = f", the model's position limit (max_position_embeddings {max_positions})"
        query_ids, query_error = _fit(query, query_limit, "query", cfg.truncate, "query-head", why)
    if query_error is None and not query_ids and not cfg.item_first:
        query_error = "query is empty after tokenization (it needs at least one token)"
    if query_error is not None:
        return TokenizedGroup([], [None] * len(items), [query_error] * len(items), cfg.item_first)

    item_limit = max_pack_tokens - len(query_ids) - overhead
    if cfg.max_item_tokens is not None:
        item_limit = min(item_limit, cfg.max_item_tokens)
    item_why = ""
    if max_positions is not None and max_positions - len(query_ids) < item_limit:
        item_limit = max_positions - len(query_ids)
        item_why = (
            f": with the query's {len(query_ids)} tokens it would pass the model's position limit "
            f"(max_position_embeddings {max_positions})"
        )
    if text_input and cfg.truncate != "chunk" and (query_ids or not cfg.item_first):
        ids = [item.ids for item in items]
        if _all_fit(ids, item_limit, vocab_size):  # the common case, checked over the group's tokens at once
            return TokenizedGroup(query_ids, ids, [None] * len(ids), cfg.item_first)
    item_ids: list[list[int] | None] = []
    errors: list[str | None] = []
    chunks: list[list[list[int]]] | None = [] if cfg.truncate == "chunk" else None
    for index, item in enumerate(items):
        error = _check_ids(item.ids, vocab_size, f"item {index}")
        ids, item_chunks = None, []
        if error is None and chunks is not None:
            ids, item_chunks, error = _chunk(item, item_limit, cfg.chunk_overlap, f"item {index}", item_why)
        elif error is None:
            ids, error = _fit(item, item_limit, f"item {index}", cfg.truncate, "item-tail", item_why)
        if chunks is not None:
            chunks.append(item_chunks)
        if error is None and cfg.item_first and not ids and not query_ids:
            error = f"item {index} and the query are both empty"
        item_ids.append(ids if error is None else None)
        errors.append(error)
    return TokenizedGroup(query_ids, item_ids, errors, cfg.item_first, chunks)


def _chunk(
    encoded: _Encoded, limit: int, overlap: int, what: str, why: str
) -> tuple[list[int], list[list[int]], str | None]:
    """truncate="chunk": (the item's whole ids, its chunks of at most limit tokens, None) or an error.

    An item within the limit is its one chunk; a longer one is split by engine/text/chunking.split_chunks (the
    template's tokens around every chunk, content chunks as a Hugging Face tokenizer's overflow makes them).
    """
    chunks, reason = split_chunks(encoded.ids, encoded.touching(), limit, overlap)
    if reason is None:
        return encoded.ids, chunks, None
    over = f"{what} has {len(encoded.ids)} tokens, over the limit of {limit}{why}"
    return [], [], f"{over}, and cannot be split into chunks: {reason}"


def _encode_texts(
    tokenizer, template: str | None, placeholder: str, contents: list[str], add_special_tokens: bool
) -> list[_Encoded]:
    """Encode each content wrapped in a template, in one tokenizer call; each encoding knows which of its
    tokens are the content's (a fast tokenizer's offsets; a slow one's: none)."""
    if not contents:
        return []
    prefix, suffix = template.split(placeholder, 1) if template else ("", "")
    texts = [prefix + content + suffix for content in contents] if template else contents
    if not getattr(tokenizer, "is_fast", False):
        return [
            _Encoded(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"], [])
            for text in texts
        ]
    start = len(prefix)
    encodings = _backend_encode(tokenizer, texts, add_special_tokens)
    if encodings is None:  # a tokenizer class of its own: through its __call__
        batch = tokenizer(texts, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        encodings = [_Offsets(*pair) for pair in zip(batch["input_ids"], batch["offset_mapping"])]
    return [
        _Encoded(encoding.ids, None, encoding, (start, start + len(content)))
        for content, encoding in zip(contents, encodings)
    ]


@dataclass(frozen=True)
class _Offsets:
    """Ids and offsets as transformers returns them, in the shape of a tokenizers Encoding."""

    ids: list[int]
    offsets: list[tuple[int, int]]


def _backend_encode(tokenizer, texts: list[str], add_special_tokens: bool) -> list | None:
    """The fast tokenizer's Rust backend called as transformers' own __call__ calls it (no truncation, no
    padding, its split_special_tokens), without building Python lists per token: tokenizers Encodings (the
    GIL released while it runs), or None for a tokenizer class that encodes its own way."""
    if isinstance(tokenizer, BackendTokenizer):  # tokenizer.json alone, as transformers would run it
        return tokenizer.encode_batch(texts, add_special_tokens)
    from transformers.tokenization_utils_base import PaddingStrategy, TruncationStrategy
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    if not isinstance(tokenizer, TokenizersBackend) or any(
        getattr(type(tokenizer), name) is not getattr(TokenizersBackend, name)
        for name in ("__call__", "_encode_plus", "set_truncation_and_padding")
    ):
        return None
    tokenizer.set_truncation_and_padding(
        PaddingStrategy.DO_NOT_PAD, TruncationStrategy.DO_NOT_TRUNCATE, None, 0, None, None
    )
    backend = tokenizer._tokenizer
    if backend.encode_special_tokens != tokenizer.split_special_tokens:
        backend.encode_special_tokens = tokenizer.split_special_tokens
    return backend.encode_batch(texts, add_special_tokens=add_special_tokens, is_pretokenized=False)


def _all_fit(ids: list[list[int]], limit: int, vocab_size: int) -> bool:
    """Whether every item's tokenizer ids fit the limit and the vocabulary (else each is checked on its own)."""
    lens = np.fromiter(map(len, ids), np.int64, len(ids))  # [items]
    if not len(ids) or lens.max() > limit:
        return False
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lens.sum()))  # [item tokens]
    return not len(flat) or (flat.min() >= 0 and flat.max() < vocab_size)


def _check_ids(ids: list[int], vocab_size: int, what: str) -> str | None:
    """Return an error message when a token id is out of the model's vocabulary."""
    if ids and set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < vocab_size:
        return None  # the common case, checked at C speed
    for token in ids:
        if not isinstance(token, int) or token < 0 or token >= vocab_size:
            return f"{what} has token id {token!r} outside the vocabulary [0, {vocab_size})"
    return None


def _fit(
    encoded: _Encoded, limit: int, what: str, truncate: str, cut: str, why: str
) -> tuple[list[int], str | None]:
    """Return ids within limit; over it, content tokens are dropped when truncate is cut, the policy that cuts
    this text ("query-head" drops from the head, "item-tail" from the tail). why: where the limit comes from
    when it is not the configured one."""
    excess = len(encoded.ids) - limit
    if excess <= 0:
        return encoded.ids, None
    if truncate != cut:
        over = f"{what} has {len(encoded.ids)} tokens, over the limit of {limit}{why}"
        return [], f"{over} (set truncate to {cut} to cut it to fit)"
    from_head = cut == "query-head"
    if len(encoded.content) < excess:
        if limit <= 0 and not from_head:
            return [], f"{what} cannot be truncated to {limit} tokens{why}: the query alone fills the limit"
        return [], f"{what} cannot be truncated to {limit} tokens{why}: its template alone is too long"
    dropped = set(encoded.content[:excess] if from_head else encoded.content[-excess:])
    return [token for i, token in enumerate(encoded.ids) if i not in dropped], None


def _longest_first(
    query: _Encoded,
    items: list[_Encoded],
    tokenizer,
    cfg: ScoringConfig,
    pack_limit: int,
    vocab_size: int,
    max_positions: int | None,
) -> TokenizedGroup:
    """truncate="longest-first": each (query, item) pair cut by a Hugging Face tokenizer's longest_first rule.

    A pair may hold the smallest of pack_limit (max_pack_tokens less the item's delimiters), the position
    limit and the tokenizer's model_max_length (CrossEncoder's limit). max_query_tokens / max_item_tokens,
    when set, first cut that side's content tail. Then, as the tokenizer truncates a pair
    (engine/model/st_model.longest_first_lengths), the longer content loses its tail until the pair fits, both
    when both must (the shorter keeps half the room); templates and special tokens are kept.

    An item whose pair needs the query cut sees a shorter query than its neighbours: the group's shared
    query is then cut to the shortest cut, and each item carries the rest of its own query (its tail
    tokens, template included) at its head, so that query_ids + item_ids is exactly its cut pair. Under
    item_first the whole pair is the item's and the shared query is empty.
    """
    from score_batch.engine.model.st_model import UNLIMITED, longest_first_lengths

    limit, why = pack_limit, "the pack limit (max_pack_tokens less the delimiters)"
    if max_positions is not None and max_positions < limit:
        limit, why = max_positions, f"the model's position limit (max_position_embeddings {max_positions})"
    model_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(model_max, int) and model_max < min(limit, UNLIMITED):
        limit, why = model_max, f"the tokenizer's model_max_length ({model_max})"
    n = len(items)
    error = _check_ids(query.ids, vocab_size, "query")
    if error is None:
        query, error = _cut_to(query, cfg.max_query_tokens, "query")
    if error is not None:
        return TokenizedGroup([], [None] * n, [error] * n, cfg.item_first)
    query_fixed = len(query.ids) - len(query.content)
    kept: list[tuple[list[int], list[int]] | None] = []  # per item: (its query's ids, its own ids)
    errors: list[str | None] = []
    for index, item in enumerate(items):
        what = f"item {index}"
        error = _check_ids(item.ids, vocab_size, what)
        if error is None:
            item, error = _cut_to(item, cfg.max_item_tokens, what)
        room = limit - query_fixed - (len(item.ids) - len(item.content))
        if error is None and len(query.ids) + len(item.ids) > limit and room < 0:
            error = (
                f"{what} cannot be truncated to {limit} tokens ({why}): the templates and special tokens "
                f"alone take {limit - room}"
            )
        elif error is None and len(query.ids) + len(item.ids) > limit and not (query.content or item.content):
            error = f"{what} cannot be truncated to {limit} tokens ({why}): it has no content tokens to cut"
        errors.append(error)
        if error is not None:
            kept.append(None)
            continue
        if cfg.item_first:
            keep_item, keep_query = longest_first_lengths(len(item.content), len(query.content), max(room, 0))
        else:
            keep_query, keep_item = longest_first_lengths(len(query.content), len(item.content), max(room, 0))
        kept.append((_keep_content(query, keep_query), _keep_content(item, keep_item)))
    lengths = [len(pair[0]) for pair in kept if pair is not None]
    if not lengths or min(lengths) == len(query.ids):  # no item cuts the query
        item_ids = [None if pair is None else pair[1] for pair in kept]
        return _checked_group(query.ids, item_ids, errors, cfg.item_first)
    if cfg.item_first:  # the query follows the item: each pair is all the item's
        item_ids = [None if pair is None else pair[1] + pair[0] for pair in kept]
        return _checked_group([], item_ids, errors, True)
    shortest = min(lengths)
    cut = query.content[len(query.content) - (len(query.ids) - shortest)]  # the first content token dropped
    shared = query.ids[:cut]
    item_ids = [None if pair is None else pair[0][cut:] + pair[1] for pair in kept]
    return _checked_group(shared, item_ids, errors, False)


def _query_head(
    query: _Encoded,
    items: list[_Encoded],
    cfg: ScoringConfig,
    max_pack_tokens: int,
    overhead: int,
    vocab_size: int,
    max_positions: int | None,
) -> TokenizedGroup:
    """truncate="query-head": the query's content loses tokens from its head until each (query, item) pair
    fits; items are never cut (docs/semantics.md, Truncation).

    The query is cut to its own limit, min(max_query_tokens or max_pack_tokens, max_pack_tokens − o); then,
    for each item alone, further until query + item fit the pair limit: max_pack_tokens − o, and the position
    limit. Each pair's cut depends on its own item only (never on the group's other items, so not on the
    window). An item over max_item_tokens, or longer than the pair limit less the query's template and
    special tokens, is an error. When items need different cuts, each item carries its own query's tokens
    after the part all of them share (query_ids + item_ids is exactly its cut pair), or, when they share no
    token (no template or special token before the query's content), its whole pair as one sequence.
    """
    n = len(items)
    pair_limit, why = max_pack_tokens - overhead, " (max_pack_tokens less the delimiters)"
    if max_positions is not None and max_positions < pair_limit:
        pair_limit, why = (
            max_positions,
            f", the model's position limit (max_position_embeddings {max_positions})",
        )
    error = _check_ids(query.ids, vocab_size, "query")
    base: list[int] = []
    if error is None:
        own = min(cfg.max_query_tokens or max_pack_tokens, max_pack_tokens - overhead)
        base, error = _fit(query, own, "query", "query-head", "query-head", "")
    if error is None and not query.ids and not cfg.item_first:
        error = "query is empty after tokenization (it needs at least one token)"
    if error is not None:
        return TokenizedGroup([], [None] * n, [error] * n, cfg.item_first)
    fixed = len(query.ids) - len(query.content)  # the query's tokens no cut removes
    pairs: list[tuple[list[int], list[int]] | None] = []  # per item: (its query's ids, its own ids)
    errors: list[str | None] = []
    for index, item in enumerate(items):
        what = f"item {index}"
        error = _check_ids(item.ids, vocab_size, what)
        if error is None and cfg.max_item_tokens is not None and len(item.ids) > cfg.max_item_tokens:
            error = (
                f"{what} has {len(item.ids)} tokens, over the limit of {cfg.max_item_tokens} (max_item_tokens; "
                "query-head cuts only the query: set truncate to item-tail or longest-first to cut the item)"
            )
        room = pair_limit - len(item.ids)  # the query's tokens this pair has room for
        if error is None and room < max(fixed, 0 if cfg.item_first else 1):
            error = (
                f"{what} has {len(item.ids)} tokens: with the query cut to its last content token the pair "
                f"passes the limit of {pair_limit}{why} (query-head cuts only the query: set truncate to "
                "longest-first to cut both)"
            )
        errors.append(error)
        if error is not None:
            pairs.append(None)
        elif len(base) <= room:
            pairs.append((base, item.ids))
        else:  # the query's first content tokens dropped until the pair fits
            dropped = set(query.content[: len(query.ids) - room])
            pairs.append(([t for i, t in enumerate(query.ids) if i not in dropped], item.ids))
    queries = [pair[0] for pair in pairs if pair is not None]
    if all(ids is base for ids in queries):  # no item cuts the query further: the usual group
        return _checked_group(base, [None if p is None else p[1] for p in pairs], errors, cfg.item_first)
    if cfg.item_first:  # item then query: the pair is all the item's
        return _checked_group([], [None if p is None else p[1] + p[0] for p in pairs], errors, True)
    shared = 0  # the tokens every item's query starts with
    while all(len(ids) > shared and ids[shared] == queries[0][shared] for ids in queries):
        shared += 1
    if shared == 0:  # nothing to share: each pair is one whole sequence (packed alone)
        return _checked_group([], [None if p is None else p[0] + p[1] for p in pairs], errors, True)
    item_ids = [None if p is None else p[0][shared:] + p[1] for p in pairs]
    return _checked_group(queries[0][:shared], item_ids, errors, False)


def _cut_to(encoded: _Encoded, limit: int | None, what: str) -> tuple[_Encoded, str | None]:
    """encoded within limit tokens (its content's tail cut), or an error when its content cannot absorb it."""
    if limit is None or len(encoded.ids) <= limit:
        return encoded, None
    excess = len(encoded.ids) - limit
    if len(encoded.content) < excess:
        return encoded, f"{what} cannot be truncated to {limit} tokens: its template alone is too long"
    keep = len(encoded.content) - excess
    # only tokens after the kept content are dropped: the kept ones keep their indices
    return _Encoded(_keep_content(encoded, keep), encoded.content[:keep]), None


def _keep_content(encoded: _Encoded, keep: int) -> list[int]:
    """encoded's ids with its content tokens after the first `keep` dropped."""
    dropped = set(encoded.content[keep:])
    return [token for i, token in enumerate(encoded.ids) if i not in dropped]


def _checked_group(
    query_ids: list[int], item_ids: list[list[int] | None], errors: list[str | None], item_first: bool
) -> TokenizedGroup:
    """A TokenizedGroup, with the empty-query errors tokenize_group gives."""
    if not query_ids and not item_first:
        message = "query is empty after tokenization (it needs at least one token)"
        return TokenizedGroup([], [None] * len(item_ids), [message] * len(item_ids), item_first)
    for index, ids in enumerate(item_ids):
        if item_first and ids is not None and not ids and not query_ids:
            item_ids[index], errors[index] = None, f"item {index} and the query are both empty"
    return TokenizedGroup(query_ids, item_ids, errors, item_first)
