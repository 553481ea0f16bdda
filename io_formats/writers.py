"""Output files: streaming Parquet/JSONL writers to an exclusive temporary file, published by atomic rename."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
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


def exclusive_temp(destination: Path, directory: bool = False) -> Path:
    """A new hidden file (or directory) beside destination, created exclusively (no planted name is followed)."""
    prefix = f".{destination.name}.tmp-"
    if directory:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=destination.parent))
    handle, name = tempfile.mkstemp(prefix=prefix, dir=destination.parent)
    os.close(handle)
    return Path(name)


def durable_replace(source: Path, destination: Path) -> None:
    """fsync source, rename it onto destination, fsync the directory: the rename survives a crash."""
    with open(source, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(source, destination)
    fsync_directory(destination.parent)


def fsync_directory(path: Path) -> None:
    """Make a directory's entries (renames, creations) durable."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


class AtomicTableWriter:
    """Writes tables to a temporary file beside the destination and renames it there on commit."""

    def __init__(self, path: str | Path, schema: pa.Schema, fmt: str, publish=None) -> None:
        """publish(tmp, path): how the finished file reaches path (default: a durable rename beside it;
        an object store passes its upload and gets a local temporary file)."""
        self.path = path if publish is not None else Path(path)
        self.fmt = fmt
        self.schema = schema
        self._publish = publish or durable_replace
        if publish is None:
            self.tmp = exclusive_temp(self.path)
        else:
            handle, name = tempfile.mkstemp(prefix="score-batch-output-")
            os.close(handle)
            self.tmp = Path(name)
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
        try:
            self._publish(self.tmp, self.path)
        finally:
            if self._publish is not durable_replace:
                self.tmp.unlink(missing_ok=True)

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
