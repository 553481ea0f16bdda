"""Input sources (Parquet file or directory, JSONL file, stdin) → windows of validated input rows.

Every input row is accounted for: a row that cannot be read (broken JSON, not an object, bytes that
are not UTF-8, a value that cannot be written) becomes an InputRow with an `error` (null ids, one
item), never an exception and never a missing row. Problems of the whole input (a corrupt Parquet
file, files that disagree on a column's type, a column mixing numbers and text) are InputErrors
(exit 2) raised before scoring.

Column types come from the whole input (`column_types`): Parquet from the schemas of all files,
unified; JSONL from a first pass over every line. Standard input is spooled to a temporary file on
first read, so it can be read twice like a file; `InputSource.close()` (or the source being garbage
collected, or the interpreter exiting) deletes the spool.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.listing import HiveTypes, InputFile, check_one_format, expand, type_partitions
from score_batch.io_formats.locations import Location, parse_location
from score_batch.io_formats.schema import ColumnMapping, ColumnOverrides, resolve_columns

from score_batch.errors import is_environment_error

STDIN = "-"
BATCH_ENVELOPE = {"custom_id", "url", "body"}  # the keys of an OpenAI batch request line
BOM = b"\xef\xbb\xbf"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INFER_CHUNK = 1024  # nested JSONL values per pyarrow type inference
READ_CHUNK = 1 << 20  # bytes per read from a (possibly remote, possibly compressed) JSONL stream
_READ_ERRORS = (pa.ArrowException, OSError)  # what pyarrow raises for unreadable or corrupt files


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


class _SourceState:
    """What reading an input has learned so far (schemas, the JSONL scan, the stdin spool).

    Not pickled: a copy sent to another process starts empty and learns again what it needs.
    """

    def __init__(self) -> None:
        self.parquet: list[_ParquetInfo] | None = None
        self.jsonl: _JsonlScan | None = None
        self.spool: Path | None = None
        self.cleanup: weakref.finalize | None = None

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


@dataclass(frozen=True)
class InputSource:
    """The input's files (sorted within each INPUT argument), their format, and the directories they come from.

    Row order: the INPUT arguments as given, each one's files sorted by path, each file's rows in order;
    row_index counts rows over all of them.
    """

    path: str  # how the input was given (several INPUTs: joined by ", "); "-" for stdin
    format: str  # "parquet" or "jsonl"
    files: tuple[InputFile, ...]
    directories: tuple[Location, ...] = ()  # the directories (or glob bases) the files were found in
    partition_types: tuple[tuple[str, pa.DataType], ...] = ()  # hive partition keys and their Arrow types
    _state: _SourceState = field(default_factory=_SourceState, compare=False, hash=False, repr=False)

    @property
    def label(self) -> str:
        """How messages name the input."""
        return "stdin" if self.path == STDIN else self.path

    def identity(self) -> list:
        """Normalized URIs, sizes and modification times of the input files (stdin has none)."""
        identity = []
        for file in self.files:
            info = file.location.info()
            mtime = info.mtime_ns if info.mtime is not None else None
            identity.append([file.location.key(), info.size, mtime])
        return identity

    def total_rows(self) -> int | None:
        """Row count: Parquet metadata; JSONL from the first pass over the lines."""
        if self.format == "parquet":
            return sum(info.num_rows for info in _parquet_infos(self))
        return _jsonl_scan(self).rows

    def spool_path(self) -> Path:
        """Standard input spooled to a temporary file (read on first call; stdin sources only)."""
        if self.path != STDIN:
            raise ValueError("only a stdin source has a spool")
        return _stdin_spool(self)

    def close(self) -> None:
        """Delete the stdin spool, if any (reading the source again spools nothing: stdin is consumed)."""
        if self._state.cleanup is not None:
            self._state.cleanup()


def open_source(
    paths: str | Sequence[str],
    storage_options: tuple[tuple[str, str], ...] = (),
    hive_types: HiveTypes = "infer",
) -> InputSource:
    """Check the INPUT arguments and say which format and files they mean (see io_formats.listing).

    Each is a local path, file://, s3://, gs://, https:// or hf:// URI naming a file, a directory (its
    data files and hive partition directories; names starting with `.` or `_` are left out) or a glob;
    `-` is JSONL on stdin (alone). All files must be of one format (Parquet, or JSONL plain or compressed).
    Hive partition values are typed over all the files (io_formats.listing.type_partitions).
    """
    given = [paths] if isinstance(paths, str) else list(paths)
    if not given:
        raise InputError("give at least one INPUT")
    if hive_types not in ("infer", "string"):
        raise InputError(f"--hive-types {hive_types}: give infer or string")
    if STDIN in given:
        if len(given) > 1:
            raise InputError("- (stdin) cannot be combined with other inputs")
        return InputSource(STDIN, "jsonl", ())
    files: list[InputFile] = []
    directories: list[Location] = []
    for text in given:
        found, directory = expand(parse_location(text, storage_options))
        files.extend(found)
        if directory is not None:
            directories.append(directory)
    label = ", ".join(given)
    seen: set[str] = set()
    for file in files:
        if file.location.key() in seen:
            raise InputError(f"input file {file.uri!r} is named twice by the inputs; each file is read once")
        seen.add(file.location.key())
    files, types = type_partitions(files, hive_types)
    return InputSource(
        label, check_one_format(files, label), tuple(files), tuple(directories), tuple(types.items())
    )


def read_windows(
    source: InputSource, overrides: ColumnOverrides, window_rows: int
) -> tuple[ColumnMapping, Iterator[list[InputRow]]]:
    """The column mapping and an iterator over windows of at most window_rows input rows.

    The whole input's column types are checked first (see column_types), so an input that cannot be
    given one type per column fails here, before scoring; id and kept values are then converted to
    those types (an integer id in a float64 id column becomes a float).
    """
    mapping = input_mapping(source, overrides)
    types = column_types(source, mapping)

    def windows() -> Iterator[list[InputRow]]:
        window: list[InputRow] = []
        for index, (_, record) in enumerate(_raw_rows(source)):
            window.append(_to_row(index, record, mapping, types))
            if len(window) == window_rows:
                yield window
                window = []
        if window:
            yield window

    return mapping, windows()


def input_mapping(source: InputSource, overrides: ColumnOverrides) -> ColumnMapping:
    """The column mapping of an input, from the columns of all its files or all its JSONL lines."""
    columns = _columns(source)
    if columns is not None and BATCH_ENVELOPE <= set(columns) and not overrides.query_col:
        if "query" not in columns and "query_tokens" not in columns:
            raise InputError(
                f"{source.label}: the lines are OpenAI batch requests (custom_id, url, body), not query/item "
                "rows; give --input-format openai-batch"
            )
    return resolve_columns(columns, overrides, source.label)


def column_types(source: InputSource, mapping: ColumnMapping) -> dict[str, pa.DataType]:
    """The Arrow type of each id and kept column over the whole input.

    Keys: the query-id column, the item-id column (nested layout: the type of the elements of the
    item-ids lists) and each kept column; columns the mapping does not have are not in the dict, and a
    column that is null everywhere maps to pa.null().

    Parquet: the files' schemas unified (nulls take the other files' type; integers widen, integers
    and floats become floats; a change that could lose values, e.g. int64 with uint64, is refused).
    JSONL: every line's values: integers with floats → float64, booleans → bool, text → string,
    lists and objects → pyarrow's inference over all of them. Raises InputError when a column cannot
    be given one type (numbers and text in one column, files that disagree, a column missing from
    some files, an integer beyond 64 bits), naming the column and the files or lines.
    """
    wanted = _typed_columns(mapping)
    if source.format == "parquet":
        types = {name: _parquet_type(source, name) for name in wanted}
    else:
        scan = _jsonl_scan(source)
        types = {name: scan.type_of(name, source.label) for name in wanted}
    if mapping.layout == "nested" and mapping.item_id is not None:
        types[mapping.item_id] = _element_type(types[mapping.item_id], mapping.item_id, source.label)
    return types


@dataclass(frozen=True)
class ReadUnit:
    """A piece of the input that one distributed worker reads: a Parquet row group or a whole JSONL file."""

    source: InputSource
    file: InputFile
    row_group: int | None  # None: the whole JSONL file
    first_row: int  # input row index of the unit's first row


def read_units(source: InputSource) -> list[ReadUnit]:
    """The input split into independently readable units, in input order, with their first row index."""
    if source.path == STDIN:
        raise InputError("distributed runs read files, not stdin")
    if source.format != "parquet":
        units, offset = [], 0
        rows = _jsonl_scan(source).rows_per_file
        for index, file in enumerate(source.files):
            units.append(ReadUnit(source, file, None, offset))
            offset += rows[index]
        return units
    units, offset = [], 0
    for info in _parquet_infos(source):
        for group, rows in enumerate(info.row_group_rows):
            units.append(ReadUnit(source, info.file, group, offset))
            offset += rows
    return units


def read_unit(
    unit: ReadUnit, mapping: ColumnMapping, types: dict[str, pa.DataType] | None = None
) -> list[InputRow]:
    """The validated rows of one unit, indexed as in a whole-input read (types: from column_types)."""
    if unit.row_group is None:
        index = unit.source.files.index(unit.file)
        records = _jsonl_file_records(unit.source, index)
    else:
        try:
            with _open_file(unit.file) as handle:
                table = pq.ParquetFile(handle).read_row_group(unit.row_group)
        except _READ_ERRORS as error:
            raise InputError(f"{unit.file}: cannot read row group {unit.row_group}: {error}") from None
        records = ((None, _with_partitions(record, unit.file)) for record in table.to_pylist())
    return [
        _to_row(unit.first_row + i, record, mapping, types or {}) for i, (_, record) in enumerate(records)
    ]


# ----------------------------------------------------------------------------------------- Parquet


@dataclass(frozen=True)
class _ParquetInfo:
    """One Parquet file's schema and row counts, read from its footer."""

    file: InputFile
    schema: pa.Schema  # the file's columns, then its partition keys it does not hold (as strings)
    num_rows: int
    row_group_rows: tuple[int, ...]


def _parquet_infos(source: InputSource) -> list[_ParquetInfo]:
    """Footers of all the source's files (read once); a file that is not readable Parquet is an InputError."""
    state = source._state
    if state.parquet is None:
        infos = []
        for file in source.files:
            try:
                with _open_file(file) as stream:
                    handle = pq.ParquetFile(stream)
                    metadata = handle.metadata
                    schema = handle.schema_arrow
            except FileNotFoundError:
                raise InputError(f"{file}: the file is gone (removed while the run started?)") from None
            except _READ_ERRORS as error:
                if _is_environment(error):
                    raise
                raise InputError(f"{file}: not a readable Parquet file ({_describe(error, file)})") from None
            partition_types = dict(source.partition_types)
            for key, _ in file.partitions:
                if key not in schema.names:
                    schema = schema.append(pa.field(key, partition_types.get(key, pa.string())))
            infos.append(
                _ParquetInfo(
                    file,
                    schema,
                    metadata.num_rows,
                    tuple(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)),
                )
            )
        state.parquet = infos
    return state.parquet


def _describe(error: BaseException, file: InputFile) -> str:
    """pyarrow's message, with a plainer word for an empty file."""
    try:
        if file.location.info().size == 0:
            return "the file is empty (0 bytes)"
    except OSError:
        pass
    return str(error) or type(error).__name__


def _open_file(file: InputFile):
    """A random-access handle on a Parquet file on its filesystem."""
    return file.location.fs.open_input_file(file.location.path)


def _is_environment(error: BaseException) -> bool:
    """True for a refusal of the machine or the network (not a damaged file): it propagates as OSError."""
    return isinstance(error, PermissionError) or is_environment_error(error)


def _with_partitions(record: dict, file: InputFile) -> dict:
    """A record with its file's partition values added (a column the file holds wins)."""
    for key, value in file.partitions:
        record.setdefault(key, value)
    return record


def _parquet_type(source: InputSource, name: str) -> pa.DataType:
    """One column's type unified over the source's files."""
    infos = _parquet_infos(source)
    present = [(info.file, info.schema.field(name).type) for info in infos if name in info.schema.names]
    missing = [info.file for info in infos if name not in info.schema.names]
    if not present:
        return pa.null()
    if missing:
        raise InputError(
            f"{source.label}: column {name!r} is in {present[0][0]} but not in {missing[0]}"
            + (f" (nor in {len(missing) - 1} more files)" if len(missing) > 1 else "")
        )
    unified = present[0][1]
    for file, dtype in present[1:]:
        merged = _unify(unified, dtype)
        if merged is None:
            first = next(f for f, t in present if _unify(t, dtype) is None)
            kind = dict(present)[first]
            raise InputError(
                f"{source.label}: files disagree on column {name!r}: {kind} in {first}, {dtype} in {file}"
            )
        unified = merged
    return unified


def _unify(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
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


# ------------------------------------------------------------------------------------------- JSONL


@dataclass(frozen=True)
class _BadLine:
    """A JSONL line that could not be parsed into an object."""

    line: str  # "N", or "N of FILE" when the input has several files
    message: str


_FAMILIES = {
    "bool": "boolean",
    "int": "number",
    "float": "number",
    "text": "text",
    "list": "list",
    "object": "object",
}


class _ColumnScan:
    """What one JSONL column holds over all lines: kinds of values (with their first line), nested types."""

    def __init__(self) -> None:
        self.kinds: dict[str, tuple[int, str]] = {}  # bool / int / … → (row order, first line)
        self.nested: pa.DataType | None = None  # lists and objects: their unified Arrow type so far
        self.pending: list[Any] = []
        self.pending_lines: list[str] = []
        self.problem: str | None = None  # the first value that no type can hold

    def add(self, value: Any, line: str, order: int) -> None:
        kind = _kind(value)
        if kind is None:
            return
        self.kinds.setdefault(kind, (order, line))
        if kind == "int" and not INT64_MIN <= value <= INT64_MAX and self.problem is None:
            self.problem = f"line {line}: the integer {value} does not fit in 64 bits"
        if kind in ("list", "object") and self.problem is None and not _has_surrogate(value):
            self.pending.append(value)
            self.pending_lines.append(line)
            if len(self.pending) >= INFER_CHUNK:
                self.flush()

    def flush(self) -> None:
        """Infer the pending nested values' type and unify it with the type so far."""
        if not self.pending or self.problem is not None:
            return
        try:
            dtype = pa.array(self.pending).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
            first, last = self.pending_lines[0], self.pending_lines[-1]
            where = f"line {first}" if first == last else f"lines {first}-{last}"
            self.problem = f"{where}: values that cannot share one type ({error})"
        else:
            merged = dtype if self.nested is None else _unify(self.nested, dtype)
            if merged is None:
                self.problem = (
                    f"line {self.pending_lines[0]} or later: {dtype} where earlier lines hold {self.nested}"
                )
            self.nested = merged
        self.pending, self.pending_lines = [], []

    def type_of(self, name: str, label: str) -> pa.DataType:
        families: dict[str, tuple[str, str]] = {}
        for kind, (_, line) in sorted(self.kinds.items(), key=lambda item: item[1][0]):
            families.setdefault(_FAMILIES[kind], (kind, line))
        if len(families) > 1:
            shown = ", ".join(f"{family} (first on line {line})" for family, (_, line) in families.items())
            raise InputError(f"{label}: column {name!r} mixes {shown}; give every value of a column one type")
        if self.problem is not None:
            raise InputError(f"{label}: column {name!r}, {self.problem}")
        if not families:
            return pa.null()
        family = next(iter(families))
        if family == "boolean":
            return pa.bool_()
        if family == "number":
            return pa.float64() if "float" in self.kinds else pa.int64()
        if family == "text":
            return pa.string()
        self.flush()
        if self.problem is not None:
            raise InputError(f"{label}: column {name!r}, {self.problem}")
        return self.nested if self.nested is not None else pa.null()


class _JsonlScan:
    """The first pass over a JSONL input: its columns in order of first appearance and their values' types."""

    def __init__(self) -> None:
        self.columns: dict[str, _ColumnScan] = {}
        self.rows = 0  # lines that are rows (objects or unreadable; blank lines are not rows)
        self.rows_per_file: list[int] = []
        self.objects = 0
        self.first_bad: _BadLine | None = None

    def type_of(self, name: str, label: str) -> pa.DataType:
        column = self.columns.get(name)
        return pa.null() if column is None else column.type_of(name, label)


def _jsonl_scan(source: InputSource) -> _JsonlScan:
    """Scan every line once (cached on the source)."""
    state = source._state
    if state.jsonl is None:
        scan = _JsonlScan()
        for index in range(max(1, len(source.files))):
            before = scan.rows
            for line, record in _jsonl_file_records(source, index):
                scan.rows += 1
                if isinstance(record, _BadLine):
                    scan.first_bad = scan.first_bad or record
                    continue
                scan.objects += 1
                for name, value in record.items():
                    column = scan.columns.get(name)
                    if column is None:
                        column = scan.columns[name] = _ColumnScan()
                    column.add(value, line, scan.rows)
            scan.rows_per_file.append(scan.rows - before)
        for column in scan.columns.values():
            column.flush()
        state.jsonl = scan
    return state.jsonl


def _stdin_spool(source: InputSource) -> Path:
    """Stdin spooled to a temporary file on first use."""
    state = source._state
    if state.spool is None:
        handle, name = tempfile.mkstemp(prefix="score-batch-stdin-", suffix=".jsonl")
        state.cleanup = weakref.finalize(state, _remove, name)
        with os.fdopen(handle, "wb") as spool:
            stream = getattr(sys.stdin, "buffer", None)
            if stream is not None:
                shutil.copyfileobj(stream, spool, 1 << 20)
            else:
                spool.write(sys.stdin.read().encode("utf-8", "surrogateescape"))
        state.spool = Path(name)
    return state.spool


def _remove(name: str) -> None:
    """Delete a spool file (already gone is fine)."""
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass


def _jsonl_records(source: InputSource) -> Iterator[tuple[str, dict | _BadLine]]:
    """(line, object) per non-blank line of every file in order; lines that are not a JSON object as _BadLine."""
    for index in range(max(1, len(source.files))):
        yield from _jsonl_file_records(source, index)


def _jsonl_lines(source: InputSource, index: int) -> Iterator[bytes]:
    """The raw lines of the index-th JSONL file (decompressed by its suffix), or of the stdin spool."""
    if source.path == STDIN:
        try:
            stream = open(_stdin_spool(source), "rb")
        except OSError as error:
            raise InputError(f"{source.label}: cannot read ({error.strerror or error})") from None
        with stream:
            yield from stream
        return
    file = source.files[index]
    try:
        stream = file.location.fs.open_input_stream(file.location.path, compression=file.compression)
    except FileNotFoundError:
        raise InputError(f"{file}: the file is gone (removed while the run started?)") from None
    except OSError as error:
        if _is_environment(error):
            raise
        raise InputError(f"{file}: cannot read ({getattr(error, 'strerror', None) or error})") from None
    with stream:
        rest = b""
        while True:
            try:
                chunk = stream.read(READ_CHUNK)
            except _READ_ERRORS as error:
                if _is_environment(error):
                    raise
                raise InputError(f"{file}: cannot read ({error})") from None
            if not chunk:
                break
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                yield line + b"\n"
        if rest:
            yield rest


def _jsonl_file_records(source: InputSource, index: int) -> Iterator[tuple[str, dict | _BadLine]]:
    """(line, object) per non-blank line of one file, its partition values added."""
    file = source.files[index] if source.files else None
    several = len(source.files) > 1
    for number, raw in enumerate(_jsonl_lines(source, index), start=1):
        if number == 1 and raw.startswith(BOM):
            raw = raw[len(BOM) :]
        if not raw.strip():
            continue
        where = f"{number} of {file}" if several else str(number)
        record = _parse_line(raw, where)
        if file is not None and isinstance(record, dict):
            record = _with_partitions(record, file)
        yield where, record


def _parse_line(raw: bytes, line: str) -> dict | _BadLine:
    """One line as an object, or a _BadLine saying why not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return _BadLine(
            line, f"not valid UTF-8 (byte 0x{raw[error.start]:02x} at byte {error.start + 1} of the line)"
        )
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        return _BadLine(line, f"not valid JSON ({error.msg} at column {error.colno})")
    except RecursionError:
        return _BadLine(line, "not valid JSON (nested too deeply)")
    return record if isinstance(record, dict) else _BadLine(line, "not a JSON object")


# ------------------------------------------------------------------------------------------ shared


def _columns(source: InputSource) -> list[str] | None:
    """Column names: all Parquet files' columns, else every JSONL line's keys (None: no line at all)."""
    if source.format == "parquet":
        names: dict[str, None] = {}
        for info in _parquet_infos(source):
            names.update(dict.fromkeys(info.schema.names))
        return list(names)
    scan = _jsonl_scan(source)
    if scan.objects == 0 and scan.first_bad is not None:
        bad = scan.first_bad
        raise InputError(f"{source.label}: no line is a JSON object (line {bad.line}: {bad.message})")
    return list(scan.columns) if scan.objects else None


def _raw_rows(source: InputSource) -> Iterator[tuple[str | None, dict | _BadLine]]:
    """(JSONL line number or None, record) in input order; unparsable JSONL lines as _BadLine markers."""
    if source.format == "jsonl":
        yield from _jsonl_records(source)
        return
    for info in _parquet_infos(source):
        try:
            with _open_file(info.file) as handle:
                for batch in pq.ParquetFile(handle).iter_batches(batch_size=1024):
                    for record in batch.to_pylist():
                        yield None, _with_partitions(record, info.file)
        except _READ_ERRORS as error:
            if _is_environment(error):
                raise
            raise InputError(f"{info.file}: cannot read this Parquet file: {error}") from None


def _typed_columns(mapping: ColumnMapping) -> list[str]:
    """The columns whose values reach the output: ids and kept columns."""
    names = [mapping.query_id, mapping.item_id, *mapping.keep]
    return list(dict.fromkeys(name for name in names if name is not None))


def _element_type(dtype: pa.DataType, name: str, label: str) -> pa.DataType:
    """The element type of the nested layout's item-ids column."""
    if pa.types.is_null(dtype):
        return dtype
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return dtype.value_type
    raise InputError(f"{label}: column {name!r} must hold lists of item ids (one per item), not {dtype}")


def _to_row(
    index: int,
    record: dict | _BadLine,
    mapping: ColumnMapping,
    types: dict[str, pa.DataType],
) -> InputRow:
    """Validate one record against the mapping; problems become the row's error, not an exception."""
    if isinstance(record, _BadLine):
        return InputRow(index, None, [None], None, [None], {}, f"line {record.line}: {record.message}")
    problems: list[str] = []

    def value(name: str | None, raw: Any) -> Any:
        """A value that will be written: converted to its column's type; a lone surrogate → None + error."""
        if name is None:
            return raw
        if _has_surrogate(raw):
            problems.append(f"column {name!r} holds a lone surrogate, which cannot be written as UTF-8")
            return None
        return _convert(raw, types.get(name))

    kept = {name: value(name, record.get(name)) for name in mapping.keep}
    query = record.get(mapping.query)
    query_id = value(mapping.query_id, record.get(mapping.query_id)) if mapping.query_id else None
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
                return InputRow(
                    index,
                    query,
                    items,
                    query_id,
                    [None] * len(items),
                    kept,
                    f"column {mapping.item_id!r} must be a list as long as {mapping.items!r}",
                )
            element = types.get(mapping.item_id)
            item_ids = []
            for raw in raw_ids:
                if _has_surrogate(raw):
                    problems.append(
                        f"column {mapping.item_id!r} holds a lone surrogate, which cannot be written as UTF-8"
                    )
                    raw = None
                item_ids.append(_convert(raw, element))
        else:
            item_ids = list(range(len(items)))
    error = _value_error(query, mapping.query) or next(
        (e for e in (_value_error(item, mapping.items) for item in items) if e), None
    )
    if error is None and problems:
        error = problems[0]
    return InputRow(index, query, items, query_id, item_ids, kept, error)


def _convert(value: Any, dtype: pa.DataType | None) -> Any:
    """An integer in a float64 column as a float (so equal ids compare and group equal); else as is."""
    if (
        dtype is not None
        and pa.types.is_floating(dtype)
        and isinstance(value, int)
        and not isinstance(value, bool)
    ):
        return float(value)
    return value


def _kind(value: Any) -> str | None:
    """The JSON kind of a value (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "list"
    return "object"


def _has_surrogate(value: Any) -> bool:
    """Whether a value holds a string that UTF-8 cannot encode (a lone surrogate from a JSON escape)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    return False


def _value_error(value: Any, column: str) -> str | None:
    """Why a query/item value is unusable (null, wrong type, bad token ids, unencodable text), or None."""
    if value is None:
        return f"column {column!r} is null"
    if isinstance(value, str):
        if _has_surrogate(value):
            return f"column {column!r} holds a lone surrogate, which is not valid text"
        return None
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if all(0 <= v <= INT64_MAX for v in value):
            return None
        return f"column {column!r} holds a token id outside 0..2^63-1"
    return f"column {column!r} must hold text or a list of integer token ids, got {type(value).__name__}"
