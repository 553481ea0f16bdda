"""Output files: streaming Parquet/JSONL writers to an exclusive temporary file, published by atomic rename;
hive-partitioned Parquet directories written whole into a staging directory (published by the caller)."""

from __future__ import annotations

import base64
import datetime
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from score_batch.io_formats.errors import InputError

STDOUT = "-"
OUTPUT_FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
JSONL_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2"}  # the compressed JSONL inputs read too
SUCCESS = "_SUCCESS"  # written last into a finished partitioned output (the Hadoop/Spark committers' marker)
# A Parquet output's footer: the rows written (a file rewritten by another tool, pyarrow included, loses it).
ROWS_KEY = b"score_batch.rows"
CHECK_ROWS = 512  # rows written to a partitioned output between two checks for a stop
SYNC_THREADS = 16  # fsyncs at once: the journal commits them together (3,000 files: 1.3–6.4 → 0.3–0.5 s)
_WRITTEN_NAME = re.compile(r"part-(\d+)\.parquet")
PART_NAME = "part-00000000.parquet"  # a partition's first file: the name write_partitioned gives it
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # the directory value of a null partition value
# The types JSON lines have a form for, as pyarrow.types' is_NAME checks: flat ones, and nested ones of these
# whose children have one (a union, a list view, … have none).
_JSON_FLAT, _JSON_NESTED = (
    tuple(getattr(pa.types, f"is_{name}") for name in names.split())
    for names in (
        "null boolean integer floating string large_string string_view binary binary_view large_binary "
        "fixed_size_binary decimal date time timestamp duration",
        "list large_list fixed_size_list struct map",
    )
)


def output_format(path: str) -> str:
    """'parquet' or 'jsonl' from the output path ('-' is JSONL on stdout; .jsonl.gz/.zst/.bz2 are JSONL)."""
    return _output_kind(str(path))[0]


def output_compression(path: str) -> str | None:
    """The codec of a compressed JSONL output (gzip, zstd, bz2) from its name, or None."""
    return _output_kind(str(path))[1]


def _output_kind(path: str) -> tuple[str, str | None]:
    """(format, compression) of an output path; InputError for a name that is neither."""
    if path == STDOUT:
        return "jsonl", None
    name = Path(path).name.lower()
    stem, suffix = os.path.splitext(name)
    compression = JSONL_COMPRESSIONS.get(suffix)
    if compression is not None:
        stem, suffix = os.path.splitext(stem)
    fmt = OUTPUT_FORMATS.get(suffix)
    if fmt is None or (compression is not None and fmt != "jsonl"):
        raise InputError(
            f"output {path!r}: give a .parquet, .jsonl (or .jsonl.gz, .jsonl.zst) path, or - for JSONL on stdout"
        )
    if compression is not None and not pa.Codec.is_available(compression):
        raise InputError(f"output {path!r}: this pyarrow cannot write {compression}; give another suffix")
    return fmt, compression


def exclusive_temp(destination: Path, directory: bool = False) -> Path:
    """A new hidden file (or directory) beside destination, created exclusively (no planted name is followed)."""
    prefix = f".{destination.name}.tmp-"
    if directory:
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=destination.parent))
        path.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would survive the rename: published like mkdir
        return path
    handle, name = tempfile.mkstemp(prefix=prefix, dir=destination.parent)
    os.fchmod(handle, 0o666 & ~_umask())  # mkstemp's 0600 would survive the rename: published like open()
    os.close(handle)
    return Path(name)


def local_temp_file() -> Path:
    """A local temporary file for something published to a target when finished (object stores upload it)."""
    handle, name = tempfile.mkstemp(prefix="score-batch-")
    os.close(handle)
    return Path(name)


def _umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def durable_replace(source: Path, destination: Path) -> None:
    """fsync source, rename it onto destination, fsync the directory: the rename survives a crash."""
    with open(source, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(source, destination)
    fsync_path(destination.parent)


class AtomicTableWriter:
    """Writes tables to a new local file, handed to publish on commit (Location.atomic_writer)."""

    def __init__(
        self, tmp: Path, schema: pa.Schema, fmt: str, path: str, publish: Callable[[Path], None]
    ) -> None:
        """path: the destination, whose name gives a JSONL output's compression."""
        self.tmp, self._publish, self.rows = tmp, publish, 0
        self._parquet = self._jsonl = None
        if fmt == "parquet":
            self._parquet = pq.ParquetWriter(self.tmp, schema, use_dictionary=dictionary_columns(schema))
        elif fmt == "jsonl":
            self._jsonl = pa.output_stream(str(self.tmp), compression=output_compression(path))

    def write(self, table: pa.Table) -> None:
        """Append a table (one Parquet row group, or JSONL lines, compressed as the name says)."""
        self.rows += table.num_rows
        if self._parquet is not None:
            self._parquet.write_table(table)
        else:
            self._jsonl.write("".join(json_lines(table)).encode("utf-8"))

    def commit(self) -> None:
        """Close and move the finished file to its destination."""
        self._close()
        self._publish(self.tmp)

    def abort(self) -> None:
        """Close and delete the temporary file; the destination is untouched."""
        self._close()
        self.tmp.unlink(missing_ok=True)

    def _close(self) -> None:
        if self._parquet is not None:
            self._parquet.add_key_value_metadata({ROWS_KEY: str(self.rows).encode()})
            self._parquet.close()
            self._parquet = None
        if self._jsonl is not None:
            self._jsonl.close()  # a codec writes its trailer
            self._jsonl = None


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The top-level columns worth Parquet's dictionary encoding: flat ones that are not floats (ids, text,
    keys repeat; scores and pooled vectors do not, and trying costs more than writing them)."""
    return [
        field.name
        for field in schema
        if not pa.types.is_floating(field.type) and not pa.types.is_nested(field.type)
    ]


def hive_directory(name: str, text: str | None) -> str:
    """The directory `name=value` pyarrow's hive flavor writes for a partition value as text (pa.string cast):
    percent-encoded as a URI segment (RFC 3986's unreserved characters kept), a null as HIVE_NULL."""
    from urllib.parse import quote

    return f"{name}={HIVE_NULL if text is None else quote(text, safe='')}"


def write_partitioned(
    tables: Iterable[pa.Table],
    directory: Path,
    schema: pa.Schema,
    partitioning: pa.Schema,
    check: Callable[[], None] = lambda: None,
) -> list[list]:
    """Write tables as hive-partitioned Parquet (`col=value/part-00000000.parquet`) into an empty directory, rows
    in order within each partition, every file and directory fsynced; [path below it, rows, bytes] per file, in
    path order. Only data files and an empty `_SUCCESS` (last): polars' `read_parquet(directory)` refuses any
    other non-empty file (docs/formats.md). check() runs every CHECK_ROWS rows and before the fsyncs (may raise)."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.dataset as ds  # here: it imports pandas when installed (~0.2 s), and only this needs it

    directory = Path(directory).absolute()
    written: list[tuple[str, int]] = []
    ds.write_dataset(
        _checked_batches(tables, check),
        str(directory),
        schema=schema,
        format="parquet",
        partitioning=ds.partitioning(partitioning, flavor="hive"),
        basename_template="part-{i}.parquet",
        use_threads=False,  # batches are written in the order given
        max_partitions=1 << 30,  # per batch: an id column may put every row in its own partition
        existing_data_behavior="overwrite_or_ignore",
        file_visitor=lambda file: written.append((file.path, file.metadata.num_rows)),
    )
    published, paths = [], []
    for name, rows in written:  # part-10 would sort before part-2: zero-pad so name order is row order
        path = Path(name)
        number = _WRITTEN_NAME.fullmatch(path.name)
        if number is not None:
            path = path.rename(path.with_name(f"part-{int(number.group(1)):08d}.parquet"))
        paths.append(path)
        published.append([path.relative_to(directory).as_posix(), rows, path.stat().st_size])
    published.sort()
    check()
    partitions = set()
    for path in paths:  # every directory from each file's up to the root gained an entry
        parent = path.parent
        while parent != directory and directory in parent.parents:
            partitions.add(parent)
            parent = parent.parent
    # fsync releases the GIL: SYNC_THREADS at a time
    with ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="score-batch-fsync") as pool:
        list(pool.map(fsync_path, [*paths, *partitions]))  # raises the first failure
    (directory / SUCCESS).touch()
    fsync_path(directory)
    return published


def _checked_batches(tables: Iterable[pa.Table], check: Callable[[], None]) -> Iterator[pa.RecordBatch]:
    """The tables' rows in batches of at most CHECK_ROWS, check() before each (a batch may open a file per
    row: 3,000 partitions take 1 to 8 s to write on 2 loaded cores)."""
    for table in tables:
        for batch in table.to_batches(max_chunksize=CHECK_ROWS):
            check()
            yield batch


def fsync_path(path: Path) -> None:
    """Make a file's bytes, or a directory's entries, durable."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


class StdoutJsonlWriter:
    """Streams JSONL lines to stdout as results arrive (nothing to commit)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def write(self, table: pa.Table) -> None:
        """Print the table's rows as JSON lines and flush."""
        sys.stdout.writelines(json_lines(table))
        sys.stdout.flush()

    def commit(self) -> None:
        """Nothing buffered."""

    def abort(self) -> None:
        """Lines already printed stay printed."""


def json_lines(table: pa.Table) -> list[str]:
    """A table's rows as JSON lines (NaN → null, so every line is valid JSON; other types as json_table)."""
    return [
        json.dumps({k: _json_value(v) for k, v in row.items()}, ensure_ascii=False) + "\n"
        for row in json_table(table).to_pylist()
    ]


def json_table(table: pa.Table) -> pa.Table:
    """The table with the columns JSON has no type for cast to one (docs/formats.md, JSON lines): decimals to
    their exact text, durations to integers in their unit, dictionaries to their values; binary stays bytes
    (base64 text in _json_value)."""
    schema = pa.schema(
        [field.with_type(_json_type(field.type)) for field in table.schema], table.schema.metadata
    )
    return table if schema == table.schema else table.cast(schema)


def jsonl_unwritable(dtype: pa.DataType) -> str | None:
    """Why a column of this type cannot be written as JSON lines (None: it can); checked before scoring."""
    if pa.types.is_dictionary(dtype):
        return jsonl_unwritable(dtype.value_type)
    if any(check(dtype) for check in _JSON_NESTED):
        children = [dtype.field(i).type for i in range(dtype.num_fields)]
        return next((why for why in map(jsonl_unwritable, children) if why), None)
    if any(check(dtype) for check in _JSON_FLAT):
        return None
    return f"JSON lines have no form for {dtype}"


def _json_type(dtype: pa.DataType) -> pa.DataType:
    """dtype with decimals as strings, durations as int64 and dictionaries as their values, at any depth."""
    if pa.types.is_decimal(dtype):
        return pa.string()
    if pa.types.is_duration(dtype):
        return pa.int64()
    if pa.types.is_dictionary(dtype):
        return _json_type(dtype.value_type)
    if pa.types.is_map(dtype):
        return pa.map_(_json_type(dtype.key_type), dtype.item_field.with_type(_json_type(dtype.item_type)))
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        field = dtype.value_field.with_type(_json_type(dtype.value_type))
        if pa.types.is_fixed_size_list(dtype):
            return pa.list_(field, dtype.list_size)
        return pa.large_list(field) if pa.types.is_large_list(dtype) else pa.list_(field)
    if pa.types.is_struct(dtype):
        return pa.struct(
            [dtype.field(i).with_type(_json_type(dtype.field(i).type)) for i in range(dtype.num_fields)]
        )
    return dtype


def _json_value(value: Any) -> Any:
    """JSON-safe value: non-finite floats become null, bytes base64 text, dates and times ISO 8601 text."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (datetime.date, datetime.time)):  # typed hive partition values, kept columns
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (list, tuple)):  # a tuple: a map's (key, value)
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value
