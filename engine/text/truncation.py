"""The truncation policies that cut a (query, item) pair to fit (docs/semantics.md, Truncation)."""

from __future__ import annotations

from score_batch.engine.config import ScoringConfig
from score_batch.engine.text.encode import Encoded
from score_batch.engine.types import TokenizedGroup

# A value of model_max_length that means "no limit" (transformers' VERY_LARGE_INTEGER is 1e30).
UNLIMITED = int(1e29)
EMPTY_QUERY = "query is empty after tokenization (it needs at least one token)"
Pairs = list[
    tuple[list[int], list[int]] | None
]  # per item: (its query's ids, its own ids), None if it failed


def failed(n: int, error: str, item_first: bool) -> TokenizedGroup:
    """A group whose n items all fail with one error."""
    return TokenizedGroup([], [None] * n, [error] * n, item_first)


def check_ids(ids: list[int], vocab_size: int, what: str) -> str | None:
    """Return an error message when a token id is out of the model's vocabulary."""
    if ids and set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < vocab_size:
        return None  # the common case, checked at C speed
    for token in ids:
        if not isinstance(token, int) or token < 0 or token >= vocab_size:
            return f"{what} has token id {token!r} outside the vocabulary [0, {vocab_size})"
    return None


def fit(
    encoded: Encoded, limit: int, what: str, truncate: str, cut: str, why: str
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


def query_within(
    query: Encoded, cfg: ScoringConfig, pair_limit: int, vocab_size: int, max_positions: int | None
) -> tuple[list[int], str | None]:
    """The query's ids within its own limit (max_query_tokens, the pack less the delimiters: pair_limit, the
    position limit), cut from the head under truncate query-head; or its error (an empty query too, unless
    item_first)."""
    error = check_ids(query.ids, vocab_size, "query")
    if error is not None:
        return [], error
    limit, why = min(cfg.max_query_tokens or pair_limit, pair_limit), ""
    if max_positions is not None and max_positions < limit:
        limit, why = max_positions, f", the model's position limit (max_position_embeddings {max_positions})"
    ids, error = fit(query, limit, "query", cfg.truncate, "query-head", why)
    return ids, EMPTY_QUERY if error is None and not ids and not cfg.item_first else error


def longest_first(
    query: Encoded,
    items: list[Encoded],
    tokenizer,
    cfg: ScoringConfig,
    pack_limit: int,
    vocab_size: int,
    max_positions: int | None,
) -> TokenizedGroup:
    """truncate="longest-first": each (query, item) pair cut by a Hugging Face tokenizer's longest_first."""
    # A pair may hold the smallest of pack_limit (max_pack_tokens less the item's delimiters), the position
    # limit and the tokenizer's model_max_length (CrossEncoder's limit). max_query_tokens / max_item_tokens,
    # when set, first cut that side's content tail. Then, as the tokenizer truncates a pair
    # (longest_first_lengths), the longer content loses its tail until the pair fits, both when both must
    # (the shorter keeps half the room); templates and special tokens are kept. Under item_first the whole
    # pair is the item's and the shared query is empty.
    limit, why = pack_limit, "the pack limit (max_pack_tokens less the delimiters)"
    if max_positions is not None and max_positions < limit:
        limit, why = max_positions, f"the model's position limit (max_position_embeddings {max_positions})"
    model_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(model_max, int) and model_max < min(limit, UNLIMITED):
        limit, why = model_max, f"the tokenizer's model_max_length ({model_max})"
    error = check_ids(query.ids, vocab_size, "query")
    if error is None:
        query, error = _cut_to(query, cfg.max_query_tokens, "query")
    if error is not None:
        return failed(len(items), error, cfg.item_first)
    cuts = [
        _longest_first_pair(query, item, f"item {i}", cfg, limit, why, vocab_size)
        for i, item in enumerate(items)
    ]
    pairs, errors = [pair for pair, _ in cuts], [error for _, error in cuts]
    if (group := _uncut_or_whole(query.ids, pairs, errors, cfg.item_first)) is not None:
        return group
    shortest = min(len(pair[0]) for pair in pairs if pair is not None)
    cut = query.content[len(query.content) - (len(query.ids) - shortest)]  # the first content token dropped
    return _split_at(query.ids[:cut], pairs, errors)


def _longest_first_pair(
    query: Encoded, item: Encoded, what: str, cfg: ScoringConfig, limit: int, why: str, vocab_size: int
) -> tuple[tuple[list[int], list[int]] | None, str | None]:
    """One item's (query ids, item ids) cut to limit by longest_first_lengths, or its error."""
    error = check_ids(item.ids, vocab_size, what)
    if error is None:
        item, error = _cut_to(item, cfg.max_item_tokens, what)
    room = limit - (len(query.ids) - len(query.content)) - (len(item.ids) - len(item.content))
    over = len(query.ids) + len(item.ids) > limit
    if error is None and over and room < 0:
        error = (
            f"{what} cannot be truncated to {limit} tokens ({why}): the templates and special tokens "
            f"alone take {limit - room}"
        )
    elif error is None and over and not (query.content or item.content):
        error = f"{what} cannot be truncated to {limit} tokens ({why}): it has no content tokens to cut"
    if error is not None:
        return None, error
    if cfg.item_first:
        keep_item, keep_query = longest_first_lengths(len(item.content), len(query.content), max(room, 0))
    else:
        keep_query, keep_item = longest_first_lengths(len(query.content), len(item.content), max(room, 0))
    return (_keep_content(query, keep_query), _keep_content(item, keep_item)), None


def query_head(
    query: Encoded,
    items: list[Encoded],
    cfg: ScoringConfig,
    max_pack_tokens: int,
    overhead: int,
    vocab_size: int,
    max_positions: int | None,
) -> TokenizedGroup:
    """truncate="query-head": the query's content loses head tokens until each pair fits (items never cut)."""
    # The query is cut to its own limit, min(max_query_tokens or max_pack_tokens, max_pack_tokens − o); then,
    # for each item alone, further until query + item fit the pair limit: max_pack_tokens − o, and the position
    # limit. Each pair's cut depends on its own item only (never on the window). An item over max_item_tokens,
    # or longer than the pair limit less the query's template and special tokens, is an error.
    pair_limit, why = max_pack_tokens - overhead, " (max_pack_tokens less the delimiters)"
    if max_positions is not None and max_positions < pair_limit:
        pair_limit = max_positions
        why = f", the model's position limit (max_position_embeddings {max_positions})"
    base, error = query_within(query, cfg, max_pack_tokens - overhead, vocab_size, None)  # no position cap
    if error is not None:
        return failed(len(items), error, cfg.item_first)
    cuts = [
        _query_head_pair(query, base, item, f"item {i}", cfg, pair_limit, why, vocab_size)
        for i, item in enumerate(items)
    ]
    pairs, errors = [pair for pair, _ in cuts], [error for _, error in cuts]
    if (group := _uncut_or_whole(base, pairs, errors, cfg.item_first)) is not None:
        return group
    queries = [pair[0] for pair in pairs if pair is not None]
    shared = 0  # the tokens every item's query starts with
    while all(len(ids) > shared and ids[shared] == queries[0][shared] for ids in queries):
        shared += 1
    if shared == 0:  # nothing to share: each pair is one whole sequence (packed alone)
        return checked_group([], [None if p is None else p[0] + p[1] for p in pairs], errors, True)
    return _split_at(queries[0][:shared], pairs, errors)


def _query_head_pair(
    query: Encoded,
    base: list[int],
    item: Encoded,
    what: str,
    cfg: ScoringConfig,
    limit: int,
    why: str,
    vocab: int,
) -> tuple[tuple[list[int], list[int]] | None, str | None]:
    """One item's (query ids, item ids): base, or the query's head cut until the pair fits; or its error."""
    error = check_ids(item.ids, vocab, what)
    if error is None and cfg.max_item_tokens is not None and len(item.ids) > cfg.max_item_tokens:
        error = (
            f"{what} has {len(item.ids)} tokens, over the limit of {cfg.max_item_tokens} (max_item_tokens; "
            "query-head cuts only the query: set truncate to item-tail or longest-first to cut the item)"
        )
    room = limit - len(item.ids)  # the query's tokens this pair has room for
    fixed = len(query.ids) - len(query.content)  # the query's tokens no cut removes
    if error is None and room < max(fixed, 0 if cfg.item_first else 1):
        error = (
            f"{what} has {len(item.ids)} tokens: with the query cut to its last content token the pair "
            f"passes the limit of {limit}{why} (query-head cuts only the query: set truncate to "
            "longest-first to cut both)"
        )
    if error is not None:
        return None, error
    if len(base) <= room:
        return (base, item.ids), None
    dropped = set(query.content[: len(query.ids) - room])  # the query's first content tokens
    return ([t for i, t in enumerate(query.ids) if i not in dropped], item.ids), None


def _uncut_or_whole(
    base: list[int], pairs: Pairs, errors: list[str | None], item_first: bool
) -> TokenizedGroup | None:
    """The group when no item cut the query (base shared) or under item_first (pairs whole); else None."""
    if all(pair is None or len(pair[0]) == len(base) for pair in pairs):
        return checked_group(base, [None if p is None else p[1] for p in pairs], errors, item_first)
    if item_first:  # item then query: the pair is all the item's
        return checked_group([], [None if p is None else p[1] + p[0] for p in pairs], errors, True)
    return None


def _split_at(shared: list[int], pairs: Pairs, errors: list[str | None]) -> TokenizedGroup:
    """Items whose pairs cut the query differently: the query tokens all share are the group's, and each item
    carries the rest of its own query at its head (query_ids + item_ids is exactly its cut pair)."""
    item_ids = [None if p is None else p[0][len(shared) :] + p[1] for p in pairs]
    return checked_group(shared, item_ids, errors, False)


def _cut_to(encoded: Encoded, limit: int | None, what: str) -> tuple[Encoded, str | None]:
    """encoded within limit tokens (its content's tail cut), or an error when its content cannot absorb it."""
    if limit is None or len(encoded.ids) <= limit:
        return encoded, None
    excess = len(encoded.ids) - limit
    if len(encoded.content) < excess:
        return encoded, f"{what} cannot be truncated to {limit} tokens: its template alone is too long"
    keep = len(encoded.content) - excess
    # only tokens after the kept content are dropped: the kept ones keep their indices
    return Encoded(_keep_content(encoded, keep), encoded.content[:keep]), None


def _keep_content(encoded: Encoded, keep: int) -> list[int]:
    """encoded's ids with its content tokens after the first `keep` dropped."""
    dropped = set(encoded.content[keep:])
    return [token for i, token in enumerate(encoded.ids) if i not in dropped]


def checked_group(
    query_ids: list[int], item_ids: list[list[int] | None], errors: list[str | None], item_first: bool
) -> TokenizedGroup:
    """A TokenizedGroup, with the empty-query errors tokenize_group gives."""
    if not query_ids and not item_first:
        return failed(len(item_ids), EMPTY_QUERY, item_first)
    for index, ids in enumerate(item_ids):
        if item_first and ids is not None and not ids and not query_ids:
            item_ids[index], errors[index] = None, f"item {index} and the query are both empty"
    return TokenizedGroup(query_ids, item_ids, errors, item_first)


def longest_first_lengths(first: int, second: int, limit: int) -> tuple[int, int]:
    """How many tokens of each sequence a Hugging Face (Rust) tokenizer keeps under truncation=longest_first.
    limit is the maximum length less the special tokens the pair adds. The shorter sequence is kept whole when
    the longer one alone can absorb the excess; otherwise the shorter keeps limit // 2 and the longer the rest
    (on equal lengths, the second keeps the odd token). Both are cut at their end."""
    if first + second <= limit:
        return first, second
    if limit <= 0:
        return 0, 0
    shorter = min(first, second)
    if 2 * shorter > limit:  # both are cut
        shorter_keeps, longer_keeps = limit // 2, limit - limit // 2
    else:  # the longer alone absorbs the excess
        shorter_keeps, longer_keeps = shorter, limit - shorter
    if first > second:
        return min(first, longer_keeps), min(second, shorter_keeps)
    return min(first, shorter_keeps), min(second, longer_keeps)
