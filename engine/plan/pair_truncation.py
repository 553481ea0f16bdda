"""Requests' own truncation settings applied to (query, item) pairs, as vLLM and TEI apply them.

vLLM's max_tokens_per_query / max_tokens_per_doc cut texts (cut_texts), its truncate_prompt_tokens keeps N
tokens of each whole pair (truncated_pairs), and TEI's truncate cuts a pair over the model's length longest
first (tei_truncated_pairs). A cut pair becomes its own Group (token ids for decoders, texts for encoder
cross-encoders); a pair that cannot be cut gets the reason instead.
"""

from __future__ import annotations

import dataclasses

from score_batch.engine.plan.planner import Planner
from score_batch.engine.text.tokenize import MIS_DELIMITERS_PER_ITEM
from score_batch.engine.types import Group

UNLIMITED = 1 << 40  # token limits of the planner that measures whole pairs for truncation


def truncate_text_to_tokens(text: str, tokenizer, max_tokens: int) -> str:
    """text cut after its first max_tokens tokens (the tokenizer's, special tokens not added), at the end offset
    of the last token kept; text itself when it has no more. vLLM's truncate_text_to_tokens
    (vllm/entrypoints/pooling/scoring/utils.py), the rule of its max_tokens_per_query / max_tokens_per_doc."""
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if len(encoding["input_ids"]) <= max_tokens:
        return text
    return text[: encoding["offset_mapping"][max_tokens - 1][1]]


class RequestRefused(ValueError):
    """A request's truncation setting this run cannot honour: the batch error code and the message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def cut_texts(
    query: str, items: list[str], max_query: int | None, max_doc: int | None, planner: Planner
) -> tuple[str, list[str]]:
    """vLLM's max_tokens_per_query / max_tokens_per_doc: the texts cut (truncate_text_to_tokens) before any
    template wraps them. RequestRefused for a limit not below the model's length (vLLM's
    _validate_token_limit), or a slow tokenizer (it has no offset mapping to cut the text by)."""
    limit = model_length(planner.limits)
    for name, value in (("max_tokens_per_query", max_query), ("max_tokens_per_doc", max_doc)):
        if value and value >= limit:
            raise RequestRefused(
                "invalid_body", f"body.{name} ({value}) must be less than the model's length ({limit})"
            )
    try:
        if max_query:
            query = truncate_text_to_tokens(query, planner.tokenizer, max_query)
        if max_doc:
            items = [truncate_text_to_tokens(item, planner.tokenizer, max_doc) for item in items]
    except NotImplementedError:
        raise RequestRefused(
            "unsupported_parameter",
            "max_tokens_per_query / max_tokens_per_doc need a fast tokenizer (its offset mapping cuts the text)",
        ) from None
    return query, items


def model_length(limits) -> int:
    """The longest sequence this run scores (vLLM's max_model_len, TEI's max_input_length): an encoder's pair
    limit; for a decoder its position limit and what one pack holds beside the delimiters."""
    if limits.pair_max_length is not None:
        return limits.pair_max_length
    longest = limits.max_pack_tokens
    return longest if limits.max_positions is None else min(longest, limits.max_positions)


def _measured(query: str, items: list[str], planner: Planner):
    """The group as the run tokenizes it (templates included), with no limit or truncation applied."""
    limits = dataclasses.replace(
        planner.limits,
        max_pack_tokens=UNLIMITED,
        max_positions=None,
        pair_max_length=None if planner.limits.pair_max_length is None else UNLIMITED,
    )
    cfg = dataclasses.replace(planner.cfg, max_query_tokens=None, max_item_tokens=None, truncate="error")
    return dataclasses.replace(planner, cfg=cfg, limits=limits).plan([Group(query, items)]).tokenized[0]


def truncated_pairs(
    query: str, items: list[str], keep: int, side: str, planner: Planner
) -> dict[int, Group | str]:
    """Per item whose whole (query, item) sequence is over keep tokens: keep of its tokens as a token-id group,
    the last ones (side "left", vLLM's default) or the first ones ("right"); or why it cannot be cut."""
    measured = _measured(query, items, planner)
    cut: dict[int, Group | str] = {}
    for k, ids in enumerate(measured.item_ids):
        if ids is None:
            continue  # the run's own planning reports why
        if planner.limits.pair_max_length is not None:
            if len(ids) > keep:
                cut[k] = (
                    f"truncate_prompt_tokens {keep}: the pair has {len(ids)} tokens, and an encoder "
                    "cross-encoder's pairs cannot be cut to a part of their tokens (the run's truncate policy item-tail "
                    "cuts items to fit)"
                )
            continue
        sequence = measured.reference_sequence(k)
        if len(sequence) <= keep:
            continue
        tail = sequence[-keep:]
        query_len = len(measured.query_ids)
        if side == "right":
            cut[k] = _head_group(sequence[:keep], query_len, len(ids), measured.item_first, keep)
        elif measured.item_first:  # item then query: the query keeps its last tokens
            split = len(tail) - min(query_len, keep)
            cut[k] = Group(tail[split:], [tail[:split]])
        else:  # query then item: what is left of the query (at least one token) leads
            lead = max(1, query_len - (len(sequence) - keep))
            cut[k] = Group(tail[:lead], [tail[lead:]])
    return cut


def _head_group(head: list[int], query_len: int, item_len: int, item_first: bool, keep: int) -> Group | str:
    """The first keep tokens of a reference sequence as a token-id group, when both parts keep a token."""
    first_len = item_len if item_first else query_len
    if len(head) <= first_len:
        what = "item" if item_first else "query"
        return (
            f"truncate_prompt_tokens {keep} with truncation_side right keeps only tokens of the {what} "
            f"({first_len} tokens): nothing of the {'query' if item_first else 'item'} would be scored"
        )
    if item_first:
        return Group(head[first_len:], [head[:first_len]])
    return Group(head[:first_len], [head[first_len:]])


def tei_truncated_pairs(
    query: str, items: list[str], direction: str, planner: Planner
) -> dict[int, Group | str]:
    """TEI's truncate: per item whose (query, item) pair is over the run's length, the pair cut as TEI cuts it
    (core/src/tokenization.rs encode_input: the tokenizer's own longest_first truncation to max_input_length,
    special tokens counted, in the given direction), or why it cannot be.

    Decoders get TEI's kept tokens as a token-id group (the query's special tokens in front); an encoder gets
    the texts cut at the kept tokens' offsets, when they encode back to exactly TEI's tokens (_tei_text_pair).
    """
    cfg, limits = planner.cfg, planner.limits
    encoder = limits.pair_max_length is not None
    length = model_length(limits)
    if not encoder and cfg.packing != "single" and not cfg.item_first:
        length = min(length, limits.max_pack_tokens - MIS_DELIMITERS_PER_ITEM)
    measured = _measured(query, items, planner)
    over = [
        k
        for k, ids in enumerate(measured.item_ids)
        if ids is not None and len(ids if encoder else measured.reference_sequence(k)) > length
    ]
    if not over:
        return {}
    refusal = None
    if cfg.query_template is not None or cfg.item_template is not None:
        refusal = (
            "TEI's truncate cuts the raw (query, text) pair; this run wraps them in templates (given, a "
            "profile's or the model's chat template: docs/semantics.md, Which text is scored)"
        )
    elif cfg.item_first:
        refusal = "TEI's truncate cuts the (query, text) pair; this run puts the item first"
    elif getattr(planner.tokenizer, "backend_tokenizer", None) is None:
        refusal = "TEI's truncate needs a fast tokenizer (TEI's own tokenizers library)"
    if refusal is not None:
        return {
            k: f"truncate: the pair is over the run's length of {length} tokens, and {refusal}" for k in over
        }
    from tokenizers import Tokenizer

    cutter = Tokenizer.from_str(planner.tokenizer.backend_tokenizer.to_str())
    cutter.no_padding()
    cutter.enable_truncation(length, stride=0, strategy="longest_first", direction=direction)
    cut: dict[int, Group | str] = {}
    for k in over:
        encoding = cutter.encode(query, items[k])  # add_special_tokens: TEI encodes with them
        if encoder:
            cut[k] = _tei_text_pair(query, items[k], encoding, direction, planner.tokenizer)
        else:
            cut[k] = _tei_id_pair(query, encoding, planner.tokenizer)
    return cut


def _tei_id_pair(query: str, encoding, tokenizer) -> Group:
    """A decoder's pair cut by TEI as a token-id group: the query's own special tokens (as the run adds them)
    around its kept tokens, then the item's kept tokens."""
    kept_query = [t for t, s in zip(encoding.ids, encoding.sequence_ids) if s == 0]
    kept_item = [t for t, s in zip(encoding.ids, encoding.sequence_ids) if s == 1]
    own = tokenizer(query, return_special_tokens_mask=True)
    mask = own["special_tokens_mask"]
    content = [i for i, special in enumerate(mask) if not special]
    first, last = (content[0], content[-1]) if content else (len(mask), len(mask) - 1)
    ids = own["input_ids"]
    return Group(ids[:first] + kept_query + ids[last + 1 :], [kept_item])


def _tei_text_pair(query: str, item: str, encoding, direction: str, tokenizer) -> Group | str:
    """An encoder's pair cut by TEI, as the texts of the kept tokens, when they encode back to TEI's tokens."""

    def kept_text(text: str, sequence: int) -> str:
        offsets = [o for o, s in zip(encoding.offsets, encoding.sequence_ids) if s == sequence]
        if not offsets:
            return ""
        return text[: offsets[-1][1]] if direction == "right" else text[offsets[0][0] :]

    cut_query, cut_item = kept_text(query, 0), kept_text(item, 1)
    if list(tokenizer(cut_query, cut_item)["input_ids"]) != list(encoding.ids):
        return (
            f"truncate (direction {direction}): TEI keeps {len(encoding.ids)} tokens of this pair, cutting inside "
            "a word, and an encoder cross-encoder takes text: the cut texts do not encode to those tokens"
        )
    return Group(cut_query, [cut_item])
