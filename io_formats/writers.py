"""Output tables: the score schema, streaming Parquet/JSONL writers with atomic rename, stdout JSONL."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from io_formats.errors import InputError

STDOUT = "-"
OUTPUT_FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def output_format(path: str) -> str:
    """'parquet' or 'jsonl' from the output path ('-' is JSONL on stdout)."""
    if path == STDOUT:
        return "jsonl"
    fmt = OUTPUT_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InputError(f"output {path!r}: give a .parquet or .jsonl path, or - for JSONL on stdout")
    return fmt


def build_schema(
    id_types: tuple[pa.DataType, pa.DataType],
    kept: list[tuple[str, pa.DataType]],
    pooled_dim: int | None,
    with_error: bool,
) -> pa.Schema:
    """The output schema: ids, score, scores, optional pooled vector, kept columns, optional error."""
    fields = [
        pa.field("query_id", id_types[0]),
        pa.field("item_id", id_types[1]),
        pa.field("score", pa.float32()),
        pa.field("scores", pa.list_(pa.float32())),
    ]
    if pooled_dim is not None:
        fields.append(pa.field("pooled_hidden_state", pa.list_(pa.float32(), pooled_dim)))
    fields.extend(pa.field(name, dtype) for name, dtype in kept)
    if with_error:
        fields.append(pa.field("error", pa.string()))
    return pa.schema(fields)


def infer_type(values: list[Any], default: pa.DataType) -> pa.DataType:
    """Arrow type of a column's Python values (default when all are null)."""
    inferred = pa.array(values).type
    return default if pa.types.is_null(inferred) else inferred


def rows_to_table(columns: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    """Build a table of the output schema from column lists, naming the column that does not fit."""
    arrays = []
    for field in schema:
        try:
            arrays.append(pa.array(columns[field.name], type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise InputError(
                f"column {field.name!r} changes type within the input (expected {field.type}): {error}"
            ) from error
    return pa.Table.from_arrays(arrays, schema=schema)


def temporary_sibling(path: Path) -> Path:
    """A hidden name beside path for writing before an atomic rename."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


class AtomicTableWriter:
    """Writes tables to a temporary file beside the destination and renames it there on commit."""

    def __init__(self, path: str | Path, schema: pa.Schema, fmt: str) -> None:
        self.path = Path(path)
        self.fmt = fmt
        self.schema = schema
        self.tmp = temporary_sibling(self.path)
        self._parquet = pq.ParquetWriter(self.tmp, schema) if fmt == "parquet" else None
        self._text = open(self.tmp, "w", encoding="utf-8") if fmt == "jsonl" else None

    def write(self, table: pa.Table) -> None:
        """Append a table (one Parquet row group, or JSONL lines)."""
        if self._parquet is not None:
            self._parquet.write_table(table)
        else:
            write_jsonl(table, self._text)

    def commit(self) -> None:
        """Close and move the finished file to its destination."""
        self._close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        """Close and delete the temporary file; the destination is untouched."""
        self._close()
        self.tmp.unlink(missing_ok=True)

    def _close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self._text is not None:
            self._text.close()
            self._text = None


class StdoutJsonlWriter:
    """Streams JSONL lines to stdout as results arrive (nothing to commit)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def write(self, table: pa.Table) -> None:
        """Print the table's rows as JSON lines and flush."""
        write_jsonl(table, sys.stdout)
        sys.stdout.flush()

    def commit(self) -> None:
        """Nothing buffered."""

    def abort(self) -> None:
        """Lines already printed stay printed."""


def write_jsonl(table: pa.Table, stream) -> None:
    """Write a table as JSON lines (NaN → null, so every line is valid JSON)."""
    for row in table.to_pylist():
        stream.write(json.dumps({k: _json_value(v) for k, v in row.items()}, ensure_ascii=False) + "\n")


def _json_value(value: Any) -> Any:
    """JSON-safe value: non-finite floats become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value
