"""A batch read as columns (window.columnar_window): whether its columns are typed as read (else the record path,
rows.to_row, converts or fails them), and the nested layout's item lists through their Arrow offsets, as to_row
gives them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from score_batch.io_formats.rows import value_error
from score_batch.io_formats.schema import ColumnMapping

TEXT = (pa.string(), pa.large_string())


def nested_items(items: pa.Array, ids: pa.Array | None, mapping: ColumnMapping):
    """A nested batch's item lists through their offsets, as to_row gives them: ([items] the texts, a row
    without items holding one None; [rows + 1] offsets; [items] the ids, else positions, null where a row's are
    unusable; [rows] the rows' list errors; [rows] whether a row holds a null item)."""
    n = len(items)
    valid = items.is_valid().to_numpy(zero_copy_only=False)  # [rows]
    starts = items.offsets.to_numpy().astype(np.int64)  # [rows + 1] into items.values (a slice's too)
    lengths = np.where(valid, np.diff(starts), 0)
    empty = lengths == 0  # [rows] null or []: one null item, the row's error
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.where(empty, 1, lengths), out=offsets[1:])
    rows = np.repeat(np.arange(n), np.diff(offsets))  # [items] each item's row
    position = np.arange(offsets[-1]) - offsets[rows]  # [items] within its row
    texts = _take(items, starts[rows] + position, empty[rows])
    errors: list = [None] * n
    for k in np.flatnonzero(empty).tolist():
        empty_list = f"column {mapping.items!r} is an empty list (no items to score)"
        errors[k] = value_error(None, mapping.items) if not valid[k] else empty_list
    if ids is None:
        item_ids = pa.array(position, pa.int64(), mask=empty[rows])
    else:
        id_starts = ids.offsets.to_numpy().astype(np.int64)  # [rows + 1] into ids.values
        id_lengths = np.where(ids.is_valid().to_numpy(zero_copy_only=False), np.diff(id_starts), -1)
        unequal = ~empty & (id_lengths != lengths)  # [rows] no id list, or one of another length
        for k in np.flatnonzero(unequal).tolist():
            errors[k] = f"column {mapping.item_id!r} must be a list as long as {mapping.items!r}"
        item_ids = _take(ids, id_starts[rows] + position, (empty | unequal)[rows])
    unscored = np.zeros(n, bool)
    if texts.null_count:
        unscored[rows[texts.is_null().to_numpy(zero_copy_only=False)]] = True
    return texts.to_pylist(), offsets, item_ids, errors, unscored


def _take(lists: pa.Array, positions: np.ndarray, absent: np.ndarray) -> pa.Array:
    """[positions] a list column's values at these positions of its values, null where absent."""
    positions = np.where(absent, 0, positions)
    return lists.values.take(pa.array(positions, pa.int64(), mask=absent))


def typed_batch(batch: pa.RecordBatch, mapping: ColumnMapping, types) -> pa.RecordBatch | None:
    """The batch with its id and kept columns as the input's types (to_row's values: an integer id in a float
    column as a float, an int32 column of an int64 input widened), or None where its query and items are not
    text (nested: lists of text, with lists of item ids) or a cast would change a value (to_row's record path
    then converts or fails them: a number where text goes, an id float64 cannot hold exactly)."""
    schema = batch.schema
    if mapping.query not in schema.names or mapping.items not in schema.names:
        return None
    nested, item_type = mapping.layout == "nested", schema.field(mapping.items).type
    if nested and not _listed(item_type):
        return None
    if plain(schema.field(mapping.query).type) not in TEXT or plain(_element(item_type, nested)) not in TEXT:
        return None
    ids = schema.field(mapping.item_id).type if mapping.item_id in schema.names else None
    if nested and mapping.item_id and not (ids is not None and _listed(ids)):
        return None  # to_row: each row's error (ids not a list), or a partition's value
    for name in [name for name in mapping.typed_columns() if name in schema.names]:
        dtype, listed = schema.field(name).type, nested and name == mapping.item_id
        want = plain(types.get(name) or pa.null())
        if plain(_element(dtype, listed)) == want:
            continue
        if listed:  # the nested layout's item ids: the same kind of list of the input's type
            want = pa.large_list(want) if pa.types.is_large_list(dtype) else pa.list_(want)
        try:
            column = batch.column(name).cast(want)  # safe: a cast that would change a value fails
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        batch = pa.record_batch(
            [column if n == name else c for n, c in zip(batch.schema.names, batch.columns)],
            names=batch.schema.names,
        )
    return batch


def _listed(dtype: pa.DataType) -> bool:
    """Whether a type is a list with offsets."""
    return pa.types.is_list(dtype) or pa.types.is_large_list(dtype)


def _element(dtype: pa.DataType, listed: bool) -> pa.DataType:
    """A list type's values' type where listed, else the type."""
    return dtype.value_type if listed else dtype


def plain(dtype: pa.DataType) -> pa.DataType:
    """A dictionary (pandas categorical) type as its values' type; any other as is."""
    return dtype.value_type if pa.types.is_dictionary(dtype) else dtype
