"""Texts → token ids under a template, each knowing which of its tokens are the content's."""

from __future__ import annotations

import bisect
import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from score_batch.engine.config import ScoringConfig
from score_batch.engine.text.backend_tokenizer import BackendTokenizer
from score_batch.engine.types import Group


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
        return EncodedTexts([], [], [], 0)
    prefix, suffix = template.split(placeholder, 1) if template else ("", "")
    texts = [prefix + content + suffix for content in contents] if template else contents
    if not getattr(tokenizer, "is_fast", False):
        ids = [tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"] for text in texts]
        return EncodedTexts(ids, None, contents, len(prefix))
    encoded = backend_encode(tokenizer, texts, add_special_tokens)
    if encoded is None:  # a tokenizer class of its own: through its __call__
        batch = tokenizer(texts, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        encoded = (
            batch["input_ids"],
            [Offsets(*pair) for pair in zip(batch["input_ids"], batch["offset_mapping"])],
        )
    return EncodedTexts(*encoded, contents, len(prefix))


class EncodedTexts(Sequence):
    """The Encoded texts of one tokenizer call, each made when indexed: the ids lists are there at once (the
    common case reads only them: `ids`), the offsets only where truncation or chunking asks."""

    def __init__(self, ids: list[list[int]], encodings: list | None, contents: list[str], start: int) -> None:
        self.ids = ids  # [texts] each text's token ids
        self._encodings = encodings  # None: a slow tokenizer, no offsets (no content tokens)
        self._contents = contents
        self._start = start  # where each content begins in its templated text (after the template's prefix)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index):
        if isinstance(index, slice):
            encodings = None if self._encodings is None else self._encodings[index]
            return EncodedTexts(self.ids[index], encodings, self._contents[index], self._start)
        if self._encodings is None:
            return Encoded(self.ids[index], [])
        span = (self._start, self._start + len(self._contents[index]))
        return Encoded(self.ids[index], None, self._encodings[index], span)


@dataclass(frozen=True)
class Offsets:
    """Ids and offsets as transformers returns them, in the shape of a tokenizers Encoding."""

    ids: list[int]
    offsets: list[tuple[int, int]]


def backend_encode(tokenizer, texts: list[str], add_special_tokens: bool) -> tuple[list, Sequence] | None:
    """The fast tokenizer's Rust backend called as transformers' own __call__ calls it (no truncation, no
    padding, its split_special_tokens): (each text's ids, each text's offsets), or None for a tokenizer class
    that encodes its own way. The GIL is released while the backend runs."""
    backend = _backend(tokenizer)
    if backend is None:
        return None
    # chunks too few to keep the backend's threads busy, or offsets only texts encoded one by one keep
    few = len(texts) < 8 * (os.cpu_count() or 1) or _keeps_first_space(backend.post_processor)
    if few or (add_special_tokens and backend.num_special_tokens_to_add(False)):  # or each text's specials
        encodings = backend.encode_batch(texts, add_special_tokens=add_special_tokens, is_pretokenized=False)
        return [encoding.ids for encoding in encodings], encodings
    return encode_in_chunks(backend, texts, add_special_tokens)


def _keeps_first_space(processor) -> bool:
    """Whether a post-processor (ByteLevel or RobertaProcessing, alone or in a Sequence) trims offsets but
    keeps the one leading space of a sequence's first token: it takes a token for the first when its offsets
    start at 0, which a text's first token in a chunk fails where the normalizer dropped the text's first
    characters (" b" stripped to "b": (1, 2) on its own, (2, 2) as a chunk's second word)."""
    if processor is None:
        return False
    stack = [json.loads(processor.__getstate__())]
    while stack:
        state = stack.pop()
        stack.extend(state.get("processors", ()))
        if state.get("trim_offsets") and state.get("add_prefix_space"):
            return True
    return False


def encode_in_chunks(backend, texts: list[str], add_special_tokens: bool) -> tuple[list, Sequence]:
    """Texts encoded as the words of a few pre-tokenized sequences, each word exactly as on its own (the
    backend extracts added tokens, normalizes, pre-tokenizes and tokenizes each word apart, then merges):
    one Encoding and one ids list per chunk, not per text; each text's ids sliced out by its word index."""
    size = max(1, min(512, -(-len(texts) // (4 * (os.cpu_count() or 1)))))  # ~4 chunks per thread
    chunks = [texts[at : at + size] for at in range(0, len(texts), size)]
    encodings = backend.encode_batch(chunks, add_special_tokens=add_special_tokens, is_pretokenized=True)
    ids: list[list[int]] = []
    spans = []  # per chunk: each of its texts' token ends
    for chunk, encoding in zip(chunks, encodings):
        flat = encoding.ids
        words = np.fromiter(encoding.word_ids, np.int64, len(flat))  # [chunk tokens] each token's text
        ends = np.cumsum(np.bincount(words, minlength=len(chunk))).tolist()
        ids.extend(map(flat.__getitem__, map(slice, [0, *ends[:-1]], ends)))
        spans.append(ends)
    return ids, ChunkOffsets(encodings, spans)


class ChunkOffsets(Sequence):
    """Each text's token offsets (an object with .offsets), cut from its chunk's Encoding on first read."""

    def __init__(
        self, encodings: list, spans: list[list[int]], index: range | None = None, cache=None
    ) -> None:
        self._encodings = encodings
        self._spans = spans
        self._firsts = list(itertools.accumulate((len(ends) for ends in spans), initial=0))
        self._index = range(self._firsts[-1]) if index is None else index
        self._cache: dict[int, list] = {} if cache is None else cache  # chunk → its offsets, once read

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ChunkOffsets(self._encodings, self._spans, self._index[index], self._cache)
        return _TextOffsets(self, self._index[index])

    def offsets(self, at: int) -> list[tuple[int, int]]:
        """The offsets of text `at` (an index of the whole call)."""
        chunk = bisect.bisect_right(self._firsts, at) - 1
        ends, word = self._spans[chunk], at - self._firsts[chunk]
        if chunk not in self._cache:
            self._cache[chunk] = self._encodings[chunk].offsets
        return self._cache[chunk][ends[word - 1] if word else 0 : ends[word]]


@dataclass(frozen=True)
class _TextOffsets:
    """One text's offsets, read from its ChunkOffsets when asked."""

    chunks: ChunkOffsets
    at: int

    @property
    def offsets(self) -> list[tuple[int, int]]:
        return self.chunks.offsets(self.at)


def _backend(tokenizer):
    """The tokenizers.Tokenizer a fast tokenizer's __call__ runs, set as that call sets it; None for a class
    that encodes its own way."""
    if isinstance(tokenizer, BackendTokenizer):  # tokenizer.json alone, as transformers would run it
        return tokenizer.backend_tokenizer
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
    return backend
