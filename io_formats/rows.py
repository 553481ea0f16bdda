"""Input rows: one record (a Parquet row, a JSONL object or an unreadable line) → a validated InputRow, its
problems the row's `error`, never an exception; the Arrow type that holds several files' or lines' values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from score_batch.io_formats.schema import ColumnMapping

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_KINDS = {bool: "bool", int: "int", float: "float", str: "text", list: "list"}  # value_kind by exact type


@dataclass
class InputRow:
    """One input row: a query with one item (long layout) or a list of items (nested layout)."""

    index: int  # 0-based row index in the input (JSONL: line number - 1)
    query: Any
    items: list[Any]
    query_id: Any
    item_ids: list[Any]
    kept: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the row cannot be scored at all


@dataclass(frozen=True)
class BadLine:
    """A JSONL line that could not be parsed into an object."""

    line: str  # "N", or "N of FILE" when the input has several files
    message: str


Record = dict | BadLine  # what a reader yields per row


def to_row(index: int, record: Record, mapping: ColumnMapping, types: dict[str, pa.DataType]) -> InputRow:
    """Validate one record against the mapping; problems become the row's error, not an exception."""
    if isinstance(record, BadLine):
        return InputRow(index, None, [None], None, [None], {}, f"line {record.line}: {record.message}")
    problems: list[str] = []

    def value(name: str, raw: Any) -> Any:
        """A value that will be written: converted to its column's type; a lone surrogate → None + error."""
        if has_surrogate(raw):
            problems.append(f"column {name!r} holds a lone surrogate, which cannot be written as UTF-8")
            return None
        return convert(raw, types.get(name))

    kept = {name: value(name, record.get(name)) for name in mapping.keep}
    query = record.get(mapping.query)
    query_id = value(mapping.query_id, record.get(mapping.query_id)) if mapping.query_id else None
    if mapping.query_key:  # a composite key: the values of its columns by name
        query_id = {name: value(name, record.get(name)) for name in mapping.query_key}
    if mapping.layout == "long":
        items = [record.get(mapping.items)]
        item_ids = [value(mapping.item_id, record.get(mapping.item_id)) if mapping.item_id else index]
    else:
        items = record.get(mapping.items)
        shape_error = None
        if items is None:
            shape_error = f"column {mapping.items!r} is null"
        elif not isinstance(items, list):
            shape_error = f"column {mapping.items!r} is not a list"
        elif not items:
            shape_error = f"column {mapping.items!r} is an empty list (no items to score)"
        if shape_error is not None:
            return InputRow(index, query, [None], query_id, [None], kept, shape_error)
        if mapping.item_id:
            raw_ids = record.get(mapping.item_id)
            if not isinstance(raw_ids, list) or len(raw_ids) != len(items):
                error = f"column {mapping.item_id!r} must be a list as long as {mapping.items!r}"
                return InputRow(index, query, items, query_id, [None] * len(items), kept, error)
            item_ids = [value(mapping.item_id, raw) for raw in raw_ids]  # typed as the lists' elements
        else:
            item_ids = list(range(len(items)))
    error = value_error(query, mapping.query) or next(
        (e for e in (value_error(item, mapping.items) for item in items) if e), None
    )
    if error is None and problems:
        error = problems[0]
    return InputRow(index, query, items, query_id, item_ids, kept, error)


def convert(value: Any, dtype: pa.DataType | None) -> Any:
    """An integer in a float64 column as a float (so equal ids compare and group equal); else as is."""
    is_integer = isinstance(value, int) and not isinstance(value, bool)
    return float(value) if is_integer and dtype is not None and pa.types.is_floating(dtype) else value


def value_kind(value: Any) -> str | None:
    """The JSON kind of a value parsed from JSON (None for null; dicts, and other types, are objects)."""
    return None if value is None else _KINDS.get(type(value), "object")


def has_surrogate(value: Any) -> bool:
    """Whether a value holds a string that UTF-8 cannot encode (a lone surrogate from a JSON escape), at any
    depth (walked without recursion: a value may nest as deeply as its reader takes)."""
    if isinstance(value, str):
        return not value.isascii() and not _encodes(value)  # isascii: a flag of the string, no scan
    todo = [value]
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            if not value.isascii() and not _encodes(value):
                return True
        elif isinstance(value, list):
            todo.extend(value)
        elif isinstance(value, dict):
            todo.extend(value)  # the keys
            todo.extend(value.values())
    return False


def _encodes(text: str) -> bool:
    """Whether UTF-8 can encode a string."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def value_error(value: Any, column: str) -> str | None:
    """Why a query/item value is unusable (null, wrong type, bad token ids, unencodable text), or None."""
    if value is None:
        return f"column {column!r} is null"
    if isinstance(value, str):
        if has_surrogate(value):
            return f"column {column!r} holds a lone surrogate, which is not valid text"
        return None
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if all(0 <= v <= INT64_MAX for v in value):
            return None
        return f"column {column!r} holds a token id outside 0..2^63-1"
    return f"column {column!r} must hold text or a list of integer token ids, got {type(value).__name__}"


def unify(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type that holds the values of both a and b without loss, or None."""
    if a == b:
        return a
    try:
        merged = (
            pa.unify_schemas([pa.schema([("c", a)]), pa.schema([("c", b)])], promote_options="permissive")
            .field("c")
            .type
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    return merged if _holds(merged, a) and _holds(merged, b) else None


def _holds(wide: pa.DataType, narrow: pa.DataType) -> bool:
    """Whether every integer value of narrow fits in wide (other promotions are trusted to pyarrow)."""
    if not (pa.types.is_integer(wide) and pa.types.is_integer(narrow)):
        return True
    if pa.types.is_signed_integer(narrow):
        return pa.types.is_signed_integer(wide) and wide.bit_width >= narrow.bit_width
    return wide.bit_width > narrow.bit_width or (
        pa.types.is_unsigned_integer(wide) and wide.bit_width == narrow.bit_width
    )
