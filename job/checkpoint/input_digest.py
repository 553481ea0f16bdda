"""The input's digest (InputDigest): every window a run reads, hashed column by column as bytes, the same
however the input is cut into windows. The digest of the input up to a window is that window's checkpoint
part's check on --resume (each byte is hashed once; a part's check thus sees its earlier windows too); VERSION
also names where windows end (between query groups, io_formats/cuts), as a part's check holds for that cut.

Each column is hashed as streams that a window only appends to: a tag byte per value (null, integer, float,
text, other), the integers as little-endian int64, the floats as float64, the UTF-8 byte lengths (int64) of
the texts and the texts back to back. A value that is none of these (nested, a date, token ids, a boolean)
counts as text: its JSON, tagged apart. An Arrow column gives its Python values' streams, mostly without
copies.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pyarrow as pa

from score_batch.io_formats.rows import INT64_MAX, INT64_MIN
from score_batch.io_formats.window import Values, Window

NULL, INT, FLOAT, TEXT, JSON = range(5)  # a value's tag
Streams = dict[str, list]  # a column's streams by name: the bytes-like parts to append, in order


class InputDigest:
    """A digest of everything read, the same however the input is cut into windows (see the module): one hash
    per stream of each column, combined at the end."""

    VERSION = b"score-batch input digest 4"

    def __init__(self) -> None:
        self._hashes: dict[bytes, Any] = {}

    def add(self, window: Window) -> str:
        """Feed one window's rows (the windows in input order); the digest of every window added so far."""
        if window.num_rows == 0:
            return self.hexdigest()
        # a slice's rows use some of its distinct queries; a row without one (code -1) hashes 32 zero bytes
        used, rows = np.unique(window.query_codes, return_inverse=True)
        distinct = [query_digest(window.query_values[code]) for code in used.tolist() if code >= 0]
        digests = np.frombuffer((bytes(32) if used[0] < 0 else b"") + b"".join(distinct), np.uint8)
        columns: dict[str, Streams] = {  # row numbers as int64, each row's query as its 32-byte digest
            "index": {"raw": [window.index.astype("<i8", copy=False)]},
            "query": {"raw": [digests.reshape(-1, 32)[rows.reshape(-1)]]},
            "offsets": {"raw": [np.diff(window.offsets).astype("<i8")]},
            "items": streams(window.items),
            "item_ids": streams(window.item_ids),
            "errors": streams(window.errors),
        }
        if window.query_ids is not None:
            columns["query_ids"] = streams(window.query_ids)
        columns.update((f"kept {name}", streams(values)) for name, values in window.kept.items())
        for column, named in columns.items():
            for stream, parts in named.items():
                key = json.dumps([column, stream]).encode()
                for part in parts:
                    if len(part):  # an empty stream is none, in any window
                        state = self._hashes.get(key) or self._hashes.setdefault(key, hashlib.sha256())
                        state.update(part)
        return self.hexdigest()

    def hexdigest(self) -> str:
        """The digest of every window added so far."""
        total = hashlib.sha256(self.VERSION)
        for key in sorted(self._hashes):
            total.update(key + self._hashes[key].digest())
        return total.hexdigest()


def query_digest(query: Any) -> bytes:
    """A query's 32-byte SHA-256: text as UTF-8 behind a tag byte, token ids as their JSON."""
    if isinstance(query, str):
        return hashlib.sha256(b"t" + query.encode("utf-8", "surrogatepass")).digest()
    return hashlib.sha256(b"i" + json.dumps(query, default=repr).encode()).digest()


def streams(values: Values) -> Streams:
    """A column's streams (see the module): an Arrow column's as its Python values' would be."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return _arrow(values) if isinstance(values, pa.Array) else _python(values)


def _arrow(values: pa.Array) -> Streams:
    """An Arrow column's streams: numbers and text from its buffers, other types as their Python values."""
    dtype = values.type
    if pa.types.is_dictionary(dtype):
        values, dtype = values.dictionary_decode(), dtype.value_type
    if pa.types.is_null(dtype):
        return {"tags": [bytes(len(values))]}
    if pa.types.is_integer(dtype) and dtype != pa.uint64():  # uint64 may pass int64: as Python values
        tag, name, wide, little = INT, "ints", pa.int64(), "<i8"
    elif dtype in (pa.float32(), pa.float64()):
        tag, name, wide, little = FLOAT, "floats", pa.float64(), "<f8"
    elif dtype in (pa.string(), pa.large_string()):
        tag, name, wide, little = TEXT, "", None, ""
    else:
        return _python(values.to_pylist())
    valid = values.drop_null() if values.null_count else values
    if values.null_count:
        tags = np.where(values.is_valid().to_numpy(zero_copy_only=False), tag, NULL).astype(np.uint8)
    else:
        tags = bytes([tag]) * len(values)
    if wide is not None:
        return {"tags": [tags], name: [valid.cast(wide).to_numpy().astype(little, copy=False)]}
    _, offsets, data = valid.buffers()
    width = np.int32 if dtype == pa.string() else np.int64
    ends = np.frombuffer(offsets, width, len(valid) + 1, valid.offset * np.dtype(width).itemsize)
    text = memoryview(data)[int(ends[0]) : int(ends[-1])] if data is not None else b""
    return {"tags": [tags], "lengths": [np.diff(ends).astype("<i8")], "data": [text]}


def _python(values: list) -> Streams:
    """Python values' streams (the record path's columns, the items, the errors)."""
    try:  # the items, most of the time: text only
        return {"tags": [bytes([TEXT]) * len(values)], **_texts(values, "".join(values))}
    except TypeError:
        pass
    if values.count(None) == len(values):  # the errors, most of the time
        return {"tags": [bytes(len(values))]}
    if set(map(type, values)) == {int}:
        try:
            return {"tags": [bytes([INT]) * len(values)], "ints": [np.array(values, "<i8")]}
        except OverflowError:
            pass
    tags, ints, floats, texts = bytearray(len(values)), [], [], []
    for k, value in enumerate(values):
        kind = type(value)
        if value is None:
            continue
        if kind is int and INT64_MIN <= value <= INT64_MAX:
            tags[k] = INT
            ints.append(value)
        elif kind is float:
            tags[k] = FLOAT
            floats.append(value)
        elif isinstance(value, str):
            tags[k] = TEXT
            texts.append(value)
        else:
            tags[k] = JSON
            texts.append(json.dumps(value, default=repr, sort_keys=True, ensure_ascii=False))
    ints_, floats_ = np.array(ints, "<i8"), np.array(floats, "<f8")
    return {"tags": [bytes(tags)], "ints": [ints_], "floats": [floats_], **_texts(texts, "".join(texts))}


def _texts(texts: list[str], joined: str) -> Streams:
    """Texts' UTF-8 byte lengths (int64) and bytes back to back (a lone surrogate as JSON let it in)."""
    data = joined.encode("utf-8", "surrogatepass")
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    if len(data) != len(joined):  # not all ASCII: characters are not bytes
        lengths = np.fromiter((len(t.encode("utf-8", "surrogatepass")) for t in texts), np.int64, len(texts))
    return {"lengths": [lengths.astype("<i8", copy=False)], "data": [data]}
