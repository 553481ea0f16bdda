"""Arrow types as an input holds them → the plain types every kernel the job uses takes (views as their plain
types, run-end encoded columns decoded, extension types as their storage, at any depth; dictionaries kept,
their values plain), and how deep a value may nest (walked without recursion)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from score_batch.io_formats.errors import InputError

MAX_DEPTH = 128  # levels a value may nest (a JSONL line's brackets, a column's type), as serde_json's default
_VIEWS = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}


def type_depth(dtype: pa.DataType) -> int:
    """How many levels a type nests (a flat type: 0, list<int64>: 1), walked without recursion."""
    deepest, todo = 0, [(dtype, 0)]
    while todo:
        dtype, depth = todo.pop()
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in _children(dtype))
    return deepest


def _children(dtype: pa.DataType) -> list[pa.DataType]:
    """The types a type holds: fields, values, a dictionary's values, an extension's storage."""
    if isinstance(dtype, pa.BaseExtensionType):
        return [dtype.storage_type]
    if pa.types.is_dictionary(dtype):
        return [dtype.value_type]
    if pa.types.is_run_end_encoded(dtype):
        return [dtype.value_type]
    return [dtype.field(k).type for k in range(dtype.num_fields)]


def plain_type(dtype: pa.DataType, name: str = "?") -> pa.DataType:
    """The plain type of an input type (see the module); InputError naming the column for one nested deeper
    than MAX_DEPTH."""
    depth = type_depth(dtype)
    if depth > MAX_DEPTH:
        raise InputError(
            f"column {name!r} nests {depth} levels deep ({str(dtype)[:60]}…); score-batch reads values "
            f"nested at most {MAX_DEPTH} levels deep: leave the column out or flatten it"
        )
    return _plain(dtype)


def _plain(dtype: pa.DataType) -> pa.DataType:
    """plain_type below the depth check (recursion bounded by MAX_DEPTH)."""
    if isinstance(dtype, pa.BaseExtensionType):
        return _plain(dtype.storage_type)
    if dtype in _VIEWS:
        return _VIEWS[dtype]
    if pa.types.is_run_end_encoded(dtype):
        return _plain(dtype.value_type)
    if pa.types.is_dictionary(dtype):
        values = _plain(dtype.value_type)
        return values if pa.types.is_dictionary(values) else pa.dictionary(dtype.index_type, values)
    if pa.types.is_list_view(dtype) or pa.types.is_list(dtype):
        return pa.list_(_plain_field(dtype.value_field))
    if pa.types.is_large_list_view(dtype) or pa.types.is_large_list(dtype):
        return pa.large_list(_plain_field(dtype.value_field))
    if pa.types.is_fixed_size_list(dtype):
        return pa.list_(_plain_field(dtype.value_field), dtype.list_size)
    if pa.types.is_map(dtype):
        return pa.map_(_plain(dtype.key_type), _plain_field(dtype.item_field), dtype.keys_sorted)
    if pa.types.is_struct(dtype):
        return pa.struct([_plain_field(dtype.field(k)) for k in range(dtype.num_fields)])
    return dtype


def _plain_field(field: pa.Field) -> pa.Field:
    return field.with_type(_plain(field.type))


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """A schema with every column's type plain (plain_type: InputError for one nested too deeply)."""
    return pa.schema(
        [field.with_type(plain_type(field.type, field.name)) for field in schema], schema.metadata
    )


def plain_array(array: pa.Array, dtype: pa.DataType, name: str = "?") -> pa.Array:
    """An input column as its plain type (plain_type(array.type)), rebuilt level by level where a child changes
    (Arrow's cast of a list view gives an invalid array; the levels are plain_type's, at most MAX_DEPTH);
    InputError naming the column where Arrow has no such cast."""
    if array.type == dtype:
        return array
    kind = array.type
    try:
        if isinstance(kind, pa.BaseExtensionType):
            return plain_array(array.storage, dtype, name)
        if pa.types.is_run_end_encoded(kind):  # each row's run, its value plain (Arrow decodes no views)
            ends = array.run_ends.to_numpy()  # [runs] where each run ends, in logical rows
            runs = np.searchsorted(ends, np.arange(array.offset, array.offset + len(array)), side="right")
            return plain_array(array.values, dtype, name).take(pa.array(runs, pa.int64()))
        if pa.types.is_dictionary(kind):
            values = plain_array(array.dictionary, dtype.value_type, name)
            return pa.DictionaryArray.from_arrays(array.indices, values)
        if pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind) or _is_list(kind):
            return _plain_list(array, dtype, name)
        if pa.types.is_struct(kind):
            children = [plain_array(child, field.type, name) for child, field in zip(array.flatten(), dtype)]
            return pa.StructArray.from_arrays(children, fields=list(dtype), mask=_nulls(array))
        return array.cast(dtype)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise InputError(f"column {name!r}: its type {array.type} cannot be read ({error})") from None


def _is_list(dtype: pa.DataType) -> bool:
    return pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype)


def _plain_list(array: pa.Array, dtype: pa.DataType, name: str) -> pa.Array:
    """A list, list view or fixed-size list column as dtype (a list, large list or fixed-size list): its
    non-null lists' values in order, offsets from their lengths (a fixed-size list: its values as they are)."""
    if pa.types.is_fixed_size_list(dtype):  # [rows * size] values, a null row's too
        size = dtype.list_size
        values = plain_array(
            array.values.slice(array.offset * size, len(array) * size), dtype.value_type, name
        )
        return pa.FixedSizeListArray.from_arrays(values, type=dtype, mask=_nulls(array))
    values = plain_array(array.flatten(), dtype.value_type, name)  # [values of the non-null lists]
    lengths = array.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)  # [rows]
    offsets = np.concatenate([[0], np.cumsum(lengths)])  # [rows + 1]
    large = pa.types.is_large_list(dtype)
    kind, width = (pa.LargeListArray, pa.int64()) if large else (pa.ListArray, pa.int32())
    return kind.from_arrays(pa.array(offsets, width), values, dtype, mask=_nulls(array))


def _nulls(array: pa.Array) -> pa.Array | None:
    """[rows] bool: the null rows, or None when there are none."""
    return array.is_null() if array.null_count else None


def plain_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A record batch with its columns as the plain schema's types (the batch's names, in its order)."""
    if batch.schema == schema:
        return batch
    columns = [
        plain_array(column, schema.field(field.name).type, field.name)
        for field, column in zip(batch.schema, batch.columns)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
