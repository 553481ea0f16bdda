"""A window of input rows as columns: distinct queries by code, items back to back (the tokenizer's input), ids
and kept columns as read (Arrow), a row's error or None. Batches come in column by column (columnar_window,
either layout); records the columnar readers cannot take (lines that are not JSON objects, mixed types, bytes
that are not text) as rows.InputRow (`from_rows`)."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from score_batch.io_formats.columnar import nested_items, plain, typed_batch
from score_batch.io_formats.jsonl import BOM  # pyarrow skips one starting a block, Python's json refuses it
from score_batch.io_formats.rows import INT64_MAX, INT64_MIN, InputRow, convert, has_surrogate, value_error
from score_batch.io_formats.schema import ColumnMapping

# window_table's columns beside the input's (named so that no input column takes them)
ROW_COLUMN, ERROR_COLUMN, ITEM_ID_COLUMN = "__row_index", "__error", "__item_id"
TEXT_OR_IDS = pa.sparse_union([pa.field("text", pa.string()), pa.field("ids", pa.list_(pa.int64()))])
Values = pa.Array | list  # a column of a window: Arrow as read, or Python values (from records)


@dataclass(frozen=True)
class Window:
    """Input rows as columns (see the module): a reader's consecutive rows, or a Ray batch's (in input order)."""

    index: np.ndarray  # [rows] int64: each row's index in the input (JSONL: line number - 1)
    query_codes: np.ndarray  # [rows] int64: the row's query in query_values; -1 when the row has none
    query_values: list  # [distinct queries] str or list[int], in order of first appearance
    items: list  # [items] str, list[int] or None: every row's items back to back
    offsets: np.ndarray  # [rows + 1] int64: row r's items are items[offsets[r] : offsets[r + 1]]
    query_ids: Values | None  # [rows] the query ids (None: the input has no query-id column)
    kept: dict[str, Values]  # [rows] the kept (pass-through) columns, by name
    item_ids: Values  # [items] the item ids (the row index, long layout, or the position, nested, when none)
    errors: list  # [rows] why a row cannot be scored at all, else None
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_rows(self) -> int:
        return len(self.errors)

    @property
    def num_items(self) -> int:
        return len(self.items)

    @property
    def first(self) -> int:
        """The input row index of the first row."""
        return int(self.index[0])

    @property
    def last(self) -> int:
        """The input row index of the last row."""
        return int(self.index[-1])

    def item_rows(self) -> np.ndarray:
        """[items] int64: the window row each item belongs to."""
        if "item_rows" not in self._cache:
            counts = np.diff(self.offsets)
            self._cache["item_rows"] = np.repeat(np.arange(self.num_rows, dtype=np.int64), counts)
        return self._cache["item_rows"]

    def item_positions(self) -> np.ndarray:
        """[items] int64: each item's position within its row (0 in the long layout)."""
        return np.arange(self.num_items, dtype=np.int64) - self.offsets[self.item_rows()]

    def query(self, row: int) -> Any:
        """The query of one row (None when it has none)."""
        code = self.query_codes[row]
        return None if code < 0 else self.query_values[code]

    def query_id_values(self) -> list:
        """[rows] the query ids as Python values (None everywhere without a query-id column)."""
        return [None] * self.num_rows if self.query_ids is None else python(self.query_ids)

    def slice(self, start: int, stop: int) -> Window:
        """Rows start..stop-1 as a window of their own."""
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return Window(
            self.index[start:stop],
            self.query_codes[start:stop],
            self.query_values,
            self.items[lo:hi],
            self.offsets[start : stop + 1] - lo,
            None if self.query_ids is None else self.query_ids[start:stop],
            {name: values[start:stop] for name, values in self.kept.items()},
            self.item_ids[lo:hi],
            self.errors[start:stop],
        )


def pick(values: Values, positions: np.ndarray) -> Values:
    """A column's values at these positions (Arrow taken, Python lists indexed)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.take(pa.array(positions, pa.int64()))
    return [values[k] for k in positions.tolist()]


def concat(windows: Sequence[Window]) -> Window:
    """Consecutive windows as one (their distinct queries merged, codes renumbered)."""
    if len(windows) == 1:
        return windows[0]
    merged, values = encode_queries([query for window in windows for query in window.query_values])
    codes, start = [], 0
    for window in windows:  # each window's codes into the merged ones (code -1, no query, stays -1)
        remap = np.append(merged[start : start + len(window.query_values)], -1)
        codes.append(remap[window.query_codes])
        start += len(window.query_values)
    starts = np.cumsum([0] + [w.num_items for w in windows[:-1]])
    offsets = np.concatenate([windows[0].offsets[:1]] + [w.offsets[1:] + s for w, s in zip(windows, starts)])
    kept = {name: _join([w.kept[name] for w in windows]) for name in windows[0].kept}
    query_ids = None if windows[0].query_ids is None else _join([w.query_ids for w in windows])
    return Window(
        np.concatenate([w.index for w in windows]),
        np.concatenate(codes),
        values,
        [item for w in windows for item in w.items],
        offsets,
        query_ids,
        kept,
        _join([w.item_ids for w in windows]),
        [error for w in windows for error in w.errors],
    )


def _join(parts: list[Values]) -> Values:
    """Columns of consecutive windows as one (Arrow chunks combined; Python lists joined)."""
    if all(isinstance(p, (pa.Array, pa.ChunkedArray)) for p in parts):
        chunks = [c for p in parts for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])]
        return pa.chunked_array(chunks, type=chunks[0].type).combine_chunks()
    return [v for p in parts for v in (p.to_pylist() if not isinstance(p, list) else p)]


def encode_queries(queries: list) -> tuple[np.ndarray, list]:
    """Python queries → (codes, distinct values in order of first appearance); None → -1."""
    keys = (None if q is None else q if isinstance(q, str) else token_key(q) for q in queries)
    codes, firsts = first_appearance_codes(keys, len(queries))
    return codes, [queries[k] for k in firsts]


def appearance_codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n] each integer key's code, the distinct keys numbered in order of first appearance, and [distinct]
    where each code first appears (first_appearance_codes' numbering, in numpy)."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first)  # the distinct keys in order of first appearance
    rank = np.empty(len(first), np.int64)
    rank[order] = np.arange(len(first))
    return rank[inverse.reshape(-1)], first[order]


def first_appearance_codes(keys, count: int) -> tuple[np.ndarray, list[int]]:
    """[count] each key's code in order of first appearance (None: -1), and where each code first appears."""
    codes = np.full(count, -1, np.int64)
    index: dict = {}
    firsts: list[int] = []
    for position, key in enumerate(keys):
        if key is None:
            continue
        code = index.get(key)
        if code is None:
            code = index[key] = len(firsts)
            firsts.append(position)
        codes[position] = code
    return codes, firsts


def token_key(query: Any) -> Any:
    """A dict key for a query that is not text: its token ids as a tuple, else its JSON."""
    if isinstance(query, list) and all(type(v) is int for v in query):
        return tuple(query)
    return ("value", json.dumps(query, default=repr, sort_keys=True))


def from_rows(rows: list[InputRow], query_ids: bool, keep: tuple[str, ...]) -> Window:
    """Validated InputRows as a window (query_ids: the input has a query-id column; keep: the kept columns)."""
    codes, values = encode_queries([row.query for row in rows])
    counts = np.fromiter((len(row.items) for row in rows), np.int64, len(rows))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Window(
        np.fromiter((row.index for row in rows), np.int64, len(rows)),
        codes,
        values,
        [item for row in rows for item in row.items],
        offsets,
        [row.query_id for row in rows] if query_ids else None,
        {name: [row.kept.get(name) for row in rows] for name in keep},
        [item_id for row in rows for item_id in row.item_ids],
        [row.error for row in rows],
    )


def key_type(key: tuple[str, ...], types: dict[str, pa.DataType]) -> pa.DataType:
    """The query_id type of a composite key: a struct of its columns (a dictionary column by its values)."""
    return pa.struct([pa.field(name, plain(types.get(name) or pa.null())) for name in key])


def key_struct(columns: list[pa.Array], key: tuple[str, ...], types: dict) -> pa.StructArray:
    """A composite key's columns as one struct column (never null itself; its fields may be)."""
    fields = key_type(key, types)
    children = [c if c.type == f.type else c.cast(f.type) for c, f in zip(columns, fields)]
    return pa.StructArray.from_arrays(children, fields=list(fields))


def text_type(dtype: pa.DataType, nested: bool) -> pa.DataType:
    """How a query or item column's values travel in window_table: as text where the input's column holds text
    (nested: lists of text), else as text or token ids (TEXT_OR_IDS, a sparse union: token ids, a mix, nulls only)."""
    if nested:
        listed = (
            pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype)
        )
        dtype = dtype.value_type if listed else pa.null()
    return pa.string() if plain(dtype) in (pa.string(), pa.large_string()) else TEXT_OR_IDS


def columnar_window(
    first: int | np.ndarray, batch: pa.RecordBatch, partitions: dict[str, Any], mapping: ColumnMapping, types
) -> Window | None:
    """A batch column by column, as from_rows(to_row(...)) would give it (first: the first row's index, or
    [rows] each row's; partitions: the file's hive values), or None when it needs to_row's checks (not valid
    text, a type no cast gives as the input's)."""
    batch = typed_batch(batch, mapping, types)  # ids and kept columns as the input's types
    if batch is None:
        return None
    schema = batch.schema
    n = batch.num_rows
    queries, items = batch.column(mapping.query), batch.column(mapping.items)
    if not pa.types.is_dictionary(queries.type):
        queries = queries.dictionary_encode()
    indices = queries.indices.fill_null(-1) if queries.indices.null_count else queries.indices
    indices = indices.to_numpy()  # [rows] into the dictionary, -1 for a null
    held = np.flatnonzero(indices >= 0)  # a Parquet dictionary may hold queries of other batches
    codes = np.full(n, -1, np.int64)
    codes[held], starts = appearance_codes(indices[held])
    values = queries.dictionary.take(indices[held[starts]])  # [distinct queries of the batch]
    # Parquet's reader does not check UTF-8: a row with bytes that are not text, in any column that is read or
    # written, goes the per-record way (readers._batch_rows: that row's error)
    written = [batch.column(name) for name in mapping.typed_columns() if name in schema.names]
    try:
        for column in (values, items, *written):
            column.validate(full=True)
    except pa.ArrowInvalid:
        return None

    def column(name: str) -> pa.Array:
        if name in schema.names:
            return batch.column(name)
        return pa.array([convert(partitions.get(name), types.get(name))] * n, type=types.get(name))

    index = np.arange(first, first + n, dtype=np.int64) if isinstance(first, int) else first
    if mapping.layout == "long":
        texts, offsets, errors = items.to_pylist(), np.arange(n + 1, dtype=np.int64), [None] * n
        item_ids = column(mapping.item_id) if mapping.item_id else pa.array(index)
        unscored = items.is_null().to_numpy(zero_copy_only=False) if items.null_count else None
    else:
        ids = batch.column(mapping.item_id) if mapping.item_id else None
        texts, offsets, item_ids, errors, unscored = nested_items(items, ids, mapping)
    for k in np.flatnonzero(codes < 0).tolist():  # a row's own error first, then a missing query, then item
        errors[k] = errors[k] or value_error(None, mapping.query)
    for k in [] if unscored is None else np.flatnonzero(unscored).tolist():
        errors[k] = errors[k] or value_error(None, mapping.items)
    return Window(
        index,
        codes,
        values.to_pylist(),
        texts,
        offsets,
        key_struct([column(name) for name in mapping.query_key], mapping.query_key, types)
        if mapping.query_key
        else column(mapping.query_id)
        if mapping.query_id
        else None,
        {name: column(name) for name in mapping.keep},
        item_ids,
        errors,
    )


def window_table(
    window: Window, mapping: ColumnMapping, types, texts: tuple[pa.DataType, pa.DataType]
) -> pa.Table:
    """A window as the input's own columns (ids and kept columns typed as `types`, hive values among them, a
    composite key as its columns; texts: the query's and the items' text_type, a text query dictionary-encoded)
    with each row's index and error (and item ids where the input has none: positions, row indexes, null for a
    line that is not JSON): what a Ray run moves. readers.table_window reads it back as a local run a batch."""
    codes, nested = window.query_codes, mapping.layout == "nested"  # [rows]
    if texts[0] == pa.string():  # dictionary-encoded: each distinct query held once
        distinct = _texts(window.query_values, pa.string())
        queries = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), distinct)
    else:
        queries = _texts([window.query_values[c] if c >= 0 else None for c in codes.tolist()], texts[0])
    offsets = pa.array(window.offsets.astype(np.int32))
    items = _texts(window.items, texts[1])
    columns = {
        ROW_COLUMN: pa.array(window.index),
        mapping.query: queries,
        mapping.items: pa.ListArray.from_arrays(offsets, items) if nested else items,
    }
    if mapping.query_key:
        key = _typed(window.query_ids, key_type(mapping.query_key, types))
        columns.update(zip(mapping.query_key, key.flatten()))
    elif mapping.query_id:
        columns[mapping.query_id] = _typed(window.query_ids, types[mapping.query_id])
    id_type = types[mapping.item_id] if mapping.item_id else pa.int64()  # nested: the lists' element type
    ids = _typed(window.item_ids, id_type)
    columns[mapping.item_id or ITEM_ID_COLUMN] = pa.ListArray.from_arrays(offsets, ids) if nested else ids
    columns.update((name, _typed(window.kept[name], types[name])) for name in mapping.keep)
    columns[ERROR_COLUMN] = pa.array(window.errors, pa.string())
    return pa.table(columns)


def _typed(values: Values, dtype: pa.DataType) -> pa.Array:
    """A column's values as its input type (a dictionary one as its values' type)."""
    dtype = plain(dtype)
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values if values.type == dtype else values.cast(dtype)
    return pa.array(values, dtype)


def _texts(values: list, dtype: pa.DataType) -> pa.Array:
    """Queries or items as text (pa.string()) or TEXT_OR_IDS; a value neither can hold (a row's error) is null."""
    if dtype == pa.string():
        try:
            return pa.array(values, dtype)
        except (pa.ArrowException, UnicodeError):
            return pa.array([v if _is_text(v) else None for v in values], dtype)
    text = [_is_text(v) for v in values]  # [values]
    children = [
        pa.array([v if t else None for v, t in zip(values, text)], pa.string()),
        pa.array([v if not t and _is_ids(v) else None for v, t in zip(values, text)], dtype[1].type),
    ]  # sparse: Ray's serializer takes slices of it (not of a dense union)
    return pa.UnionArray.from_sparse(pa.array(np.logical_not(text), pa.int8()), children, ["text", "ids"])


def _is_text(value: Any) -> bool:
    """Text Arrow holds (a lone surrogate is the row's error)."""
    return isinstance(value, str) and not has_surrogate(value)


def _is_ids(value: Any) -> bool:
    """Token ids Arrow's int64 holds (a value out of range is the row's error)."""
    return isinstance(value, list) and all(type(v) is int and INT64_MIN <= v <= INT64_MAX for v in value)


def json_window(
    first: int, lines: list[bytes], partitions: dict[str, Any], mapping: ColumnMapping, types
) -> Window | None:
    """A JSONL block parsed by pyarrow into the input's types, as the per-line path would give it, or None when
    a line needs that path (another type, a repeated key, a lone surrogate escape, bad UTF-8 anywhere in it, a
    byte order mark, a column partition values fill, a negative zero in a float column or item id). Only for an
    input whose first pass read every line as one JSON object (JsonlReader.all_objects): else a line Python's
    json refuses may be one pyarrow reads (Inf, deep nesting), and an object over two lines beside two objects
    on one line would shift the rows by one."""
    import pyarrow.json as pj  # imported here: only JSONL inputs need it

    typed, nested = mapping.typed_columns(), mapping.layout == "nested"
    if any(name in partitions for name in (mapping.query, mapping.items, *typed)):
        return None
    raw = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
    if raw.startswith(BOM):
        return None  # pyarrow skips it, Python's json refuses it
    # pyarrow checks the UTF-8 of the values it reads only, Python's json every byte (ASCII is UTF-8); a lone
    # surrogate escape, the row's error in Python's json, fails pyarrow's parse of the block, in any field
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def listed(dtype: pa.DataType) -> pa.DataType:  # the nested layout's items and item ids: lists
        return pa.list_(dtype) if nested else dtype

    fields = [(mapping.query, pa.string()), (mapping.items, listed(pa.string()))]
    fields += [(n, listed(types[n]) if n == mapping.item_id else types[n]) for n in typed]
    options = pj.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(
            io.BytesIO(raw), pj.ReadOptions(use_threads=False, block_size=len(raw) + 1), options
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    table = table.combine_chunks()
    floats = list(table.columns)  # and the nested layout's item ids, typed as the lists' elements
    floats += [table[mapping.item_id].combine_chunks().flatten()] if nested and mapping.item_id else []
    if table.num_rows != len(lines) or any(map(_negative_zero, floats)):
        return None
    return columnar_window(first, table.to_batches()[0], {}, mapping, types)


def _negative_zero(column: pa.Array | pa.ChunkedArray) -> bool:
    """Whether a float column holds -0.0: pyarrow's for an integer -0, which Python's json reads as 0."""
    if not pa.types.is_floating(column.type) or not len(column):
        return False
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    values = column.fill_null(1.0).to_numpy(zero_copy_only=False)
    return bool(np.any(np.signbit(values) & (values == 0)))


def python(values: Values) -> list:
    """A column's values as a Python list."""
    return values.to_pylist() if isinstance(values, (pa.Array, pa.ChunkedArray)) else list(values)
