"""Texts → token ids under a template, each knowing which of its tokens are the content's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from score_batch.engine.config import ScoringConfig
from score_batch.engine.types import FlatItems, Group


class Encoded:
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


def given_ids(ids) -> Encoded:
    """Token ids given as input: all content."""
    ids = list(ids)
    return Encoded(ids, list(range(len(ids))))


def encode_groups(groups: list[Group], tokenizer, cfg: ScoringConfig) -> list[tuple | None]:
    """Per group, its (query, items) encoded, the text of every group in two tokenizer calls (the distinct
    queries, then all items); None for a group that is not all text (tokenize_group handles it)."""
    texts = [isinstance(g.query, str) and all(isinstance(item, str) for item in g.items) for g in groups]
    query_index: dict[str, int] = {}
    for g, is_text in zip(groups, texts):
        if is_text:
            query_index.setdefault(g.query, len(query_index))
    queries = encode_texts(tokenizer, cfg.query_template, "{query}", list(query_index), not cfg.item_first)
    item_texts = [item for g, is_text in zip(groups, texts) if is_text for item in g.items]
    items = encode_texts(tokenizer, cfg.item_template, "{item}", item_texts, cfg.item_first)
    out: list[tuple | None] = []
    at = 0
    for g, is_text in zip(groups, texts):
        if is_text:
            out.append((queries[query_index[g.query]], items[at : at + len(g.items)]))
            at += len(g.items)
        else:
            out.append(None)
    return out


def encode_texts(
    tokenizer, template: str | None, placeholder: str, contents: list[str], add_special_tokens: bool
) -> EncodedTexts:
    """Encode each content wrapped in a template, in one tokenizer call; each encoding knows which of its
    tokens are the content's (a fast tokenizer's offsets; a slow one's: none)."""
    if not contents:
        return EncodedTexts(_Call([], [], [], 0), 0, 0)
    prefix, suffix = template.split(placeholder, 1) if template else ("", "")
    texts = [prefix + content + suffix for content in contents] if template else contents
    if not getattr(tokenizer, "is_fast", False):
        ids = [tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"] for text in texts]
        return EncodedTexts(_Call(ids, None, contents, len(prefix)), 0, len(ids))
    encodings = backend_encode(tokenizer, texts, add_special_tokens)
    if encodings is None:  # a tokenizer class of its own: through its __call__
        batch = tokenizer(texts, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        encodings = [Offsets(*pair) for pair in zip(batch["input_ids"], batch["offset_mapping"])]
    return EncodedTexts(_Call(None, encodings, contents, len(prefix)), 0, len(encodings))


class EncodedTexts(Sequence):
    """The Encoded texts of one tokenizer call (or a slice of them), each made when indexed: the common case
    reads only the ids (`ids`, or `tokens` as arrays), the offsets only where truncation or chunking asks. The
    ids lists are made on first use, by the thread that uses them (a pipeline's planner, not its tokenizer)."""

    def __init__(self, call: _Call, lo: int, hi: int) -> None:
        self._call, self._lo, self._hi = call, lo, hi
        self._ids: list[list[int]] | None = None

    @property
    def ids(self) -> list[list[int]]:
        """[texts] each text's token ids (the same list object on every read)."""
        if self._ids is None:
            whole = self._call.ids()
            self._ids = whole if (self._lo, self._hi) == (0, len(whole)) else whole[self._lo : self._hi]
        return self._ids

    def tokens(self) -> FlatItems:
        """The texts' ids as arrays, views of one flattening of the whole call's ids."""
        flat, bounds = self._call.flat()
        return FlatItems(flat.tokens[bounds[self._lo] : bounds[self._hi]], flat.lens[self._lo : self._hi])

    def __len__(self) -> int:
        return self._hi - self._lo

    def __getitem__(self, index):
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self))
            if step != 1:
                raise ValueError("EncodedTexts slices are contiguous")
            return EncodedTexts(self._call, self._lo + lo, self._lo + max(lo, hi))
        index = range(self._lo, self._hi)[index]
        return self._call.encoded(index)


class _Call:
    """One tokenizer call's results: Encodings (or, from a slow tokenizer, ids lists) and the contents."""

    def __init__(self, ids: list[list[int]] | None, encodings: list | None, contents: list[str], start: int):
        self._ids = ids  # None until made from the encodings
        self._encodings = encodings  # None: a slow tokenizer, no offsets (no content tokens)
        self._contents = contents
        self._start = start  # where each content begins in its templated text (after the template's prefix)
        self._flat: tuple[FlatItems, np.ndarray] | None = None

    def ids(self) -> list[list[int]]:
        if self._ids is None:
            self._ids = [encoding.ids for encoding in self._encodings]
        return self._ids

    def flat(self) -> tuple[FlatItems, np.ndarray]:
        """Every text's ids flattened, and [texts + 1] int64 each text's first token, then the end."""
        if self._flat is None:
            flat = FlatItems.of(self.ids())
            self._flat = flat, np.concatenate([[0], np.cumsum(flat.lens)]).astype(np.int64)
        return self._flat

    def encoded(self, index: int) -> Encoded:
        if self._encodings is None:
            return Encoded(self.ids()[index], [])
        span = (self._start, self._start + len(self._contents[index]))
        return Encoded(self.ids()[index], None, self._encodings[index], span)


@dataclass(frozen=True)
class Offsets:
    """Ids and offsets as transformers returns them, in the shape of a tokenizers Encoding."""

    ids: list[int]
    offsets: list[tuple[int, int]]


def backend_encode(tokenizer, texts: list[str], add_special_tokens: bool) -> list | None:
    """The fast tokenizer's Rust backend called as transformers' own __call__ calls it (no truncation, no
    padding, its split_special_tokens), without building Python lists per token: tokenizers Encodings (the
    GIL released while it runs), or None for a tokenizer class that encodes its own way."""
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
