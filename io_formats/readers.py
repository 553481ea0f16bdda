"""Input sources (Parquet file or directory, JSONL file, stdin) → windows of validated input rows."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from io_formats.errors import InputError
from io_formats.schema import ColumnMapping, ColumnOverrides, resolve_columns

STDIN = "-"


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
class InputSource:
    """An input path with its format, the files behind it and their identity (for resume checks)."""

    path: str
    format: str  # "parquet" or "jsonl"
    files: tuple[Path, ...]

    @property
    def label(self) -> str:
        """How messages name the input."""
        return "stdin" if self.path == STDIN else self.path

    def identity(self) -> list:
        """Paths, sizes and modification times of the input files (stdin has none)."""
        return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in self.files]

    def total_rows(self) -> int | None:
        """Row count when cheap to know (Parquet metadata), else None."""
        if self.format != "parquet":
            return None
        return sum(pq.ParquetFile(f).metadata.num_rows for f in self.files)


def open_source(path: str) -> InputSource:
    """Check an INPUT argument and say which format and files it means."""
    if path == STDIN:
        return InputSource(path, "jsonl", ())
    p = Path(path)
    if not p.exists():
        raise InputError(f"input {path!r} does not exist")
    if p.is_dir():
        files = tuple(sorted(p.glob("*.parquet")))
        if not files:
            raise InputError(f"input directory {path!r} holds no .parquet files")
        return InputSource(path, "parquet", files)
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        return InputSource(path, "parquet", (p,))
    if suffix in (".jsonl", ".ndjson", ".json"):
        return InputSource(path, "jsonl", (p,))
    raise InputError(
        f"input {path!r}: unknown format {suffix!r}; give a .parquet or .jsonl file, a directory of .parquet files, or - for JSONL on stdin"
    )


def read_windows(
    source: InputSource, overrides: ColumnOverrides, window_rows: int
) -> tuple[ColumnMapping, Iterator[list[InputRow]]]:
    """The column mapping and an iterator over windows of at most window_rows input rows."""
    raw = _raw_rows(source)
    first = next(raw, None)
    columns = _columns(source, first)
    mapping = resolve_columns(columns, overrides, source.label)

    def windows() -> Iterator[list[InputRow]]:
        window: list[InputRow] = []
        index = 0
        pending = [first] if first is not None else []
        for record in _chain(pending, raw):
            window.append(_to_row(index, record, mapping))
            index += 1
            if len(window) == window_rows:
                yield window
                window = []
        if window:
            yield window

    return mapping, windows()


@dataclass(frozen=True)
class ReadUnit:
    """A piece of the input that one distributed worker reads: a Parquet row group or a whole JSONL file."""

    source: InputSource
    file: Path
    row_group: int | None  # None: the whole JSONL file
    first_row: int  # input row index of the unit's first row


def input_mapping(source: InputSource, overrides: ColumnOverrides) -> ColumnMapping:
    """The column mapping of an input, from its schema (Parquet) or its first record (JSONL)."""
    first = next(_raw_rows(source), None)
    return resolve_columns(_columns(source, first), overrides, source.label)


def read_units(source: InputSource) -> list[ReadUnit]:
    """The input split into independently readable units, in input order, with their first row index."""
    if source.path == STDIN:
        raise InputError("distributed runs read files, not stdin")
    if source.format != "parquet":
        return [ReadUnit(source, source.files[0], None, 0)]
    units, offset = [], 0
    for file in source.files:
        metadata = pq.ParquetFile(file).metadata
        for group in range(metadata.num_row_groups):
            units.append(ReadUnit(source, file, group, offset))
            offset += metadata.row_group(group).num_rows
    return units


def read_unit(unit: ReadUnit, mapping: ColumnMapping) -> list[InputRow]:
    """The validated rows of one unit, indexed as in a whole-input read."""
    if unit.row_group is None:
        records = _raw_rows(unit.source)
    else:
        records = iter(pq.ParquetFile(unit.file).read_row_group(unit.row_group).to_pylist())
    return [_to_row(unit.first_row + i, record, mapping) for i, record in enumerate(records)]


def _chain(first: list, rest: Iterator) -> Iterator:
    """Yield the already-read first record, then the rest."""
    yield from first
    yield from rest


def _columns(source: InputSource, first: dict | None) -> list[str]:
    """Column names: from the Parquet schema, else from the first JSONL record."""
    if source.format == "parquet":
        return list(pq.ParquetFile(source.files[0]).schema_arrow.names)
    if first is None:
        raise InputError(f"input {source.label} is empty")
    if isinstance(first, _BadLine):
        raise InputError(
            f"{source.label} line {first.line}: {first.message}; the first line must be a JSON object"
        )
    return list(first.keys())


@dataclass(frozen=True)
class _BadLine:
    """A JSONL line that could not be parsed into an object."""

    line: int
    message: str


def _raw_rows(source: InputSource) -> Iterator[dict | _BadLine]:
    """Records as dicts, in input order; unparsable JSONL lines as _BadLine markers."""
    if source.format == "parquet":
        for file in source.files:
            for batch in pq.ParquetFile(file).iter_batches(batch_size=1024):
                yield from batch.to_pylist()
        return
    stream = sys.stdin if source.path == STDIN else open(source.files[0], encoding="utf-8")
    try:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                yield _BadLine(number, f"not valid JSON ({error.msg} at column {error.colno})")
                continue
            yield record if isinstance(record, dict) else _BadLine(number, "not a JSON object")
    finally:
        if stream is not sys.stdin:
            stream.close()


def _to_row(index: int, record: dict | _BadLine, mapping: ColumnMapping) -> InputRow:
    """Validate one record against the mapping; problems become the row's error, not an exception."""
    if isinstance(record, _BadLine):
        return InputRow(index, None, [None], None, [None], {}, f"line {record.line}: {record.message}")
    kept = {name: record.get(name) for name in mapping.keep}
    query = record.get(mapping.query)
    query_id = record.get(mapping.query_id) if mapping.query_id else None
    if mapping.layout == "long":
        items = [record.get(mapping.items)]
        item_ids = [record.get(mapping.item_id) if mapping.item_id else index]
    else:
        items = record.get(mapping.items)
        if items is None:
            items = []
        if not isinstance(items, list):
            return InputRow(
                index, query, [None], query_id, [None], kept, f"column {mapping.items!r} is not a list"
            )
        item_ids = record.get(mapping.item_id) if mapping.item_id else list(range(len(items)))
        if not isinstance(item_ids, list) or len(item_ids) != len(items):
            return InputRow(
                index,
                query,
                items or [None],
                query_id,
                [None] * max(len(items), 1),
                kept,
                f"column {mapping.item_id!r} must be a list as long as {mapping.items!r}",
            )
    error = _value_error(query, mapping.query) or next(
        (_value_error(item, mapping.items) for item in items if _value_error(item, mapping.items)), None
    )
    return InputRow(index, query, items, query_id, item_ids, kept, error)


def _value_error(value: Any, column: str) -> str | None:
    """Why a query/item value is unusable (null, wrong type, non-integer token ids), or None."""
    if value is None:
        return f"column {column!r} is null"
    if isinstance(value, str):
        return None
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return f"column {column!r} must hold text or a list of integer token ids, got {type(value).__name__}"
