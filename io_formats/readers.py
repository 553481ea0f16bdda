"""Input sources (Parquet, JSONL plain or compressed, stdin) → windows of input rows; `reader()` and
`input_format()` are the one place a format is chosen. A row that cannot be read becomes a row with an error,
never an exception or a missing row; problems of the whole input are InputErrors (exit 2) before scoring."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from score_batch.choices import HiveTypes, RequestedFormat
from score_batch.io_formats.batch_requests import ENVELOPE, STDIN, BatchFileReader, looks_like_openai_batch
from score_batch.io_formats.cuts import compact, cuts
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.jsonl import JsonlReader, StdinReader, parse_line
from score_batch.io_formats.listing import FileFormat, InputFile, check_one_format, expand, type_partitions
from score_batch.io_formats.locations import Location, parse_location
from score_batch.io_formats.parquet import BATCH_ROWS, ParquetReader
from score_batch.io_formats.rows import InputRow, to_row  # noqa: F401 (InputRow: re-exported)
from score_batch.io_formats.schema import ColumnMapping, ColumnOverrides, resolve_columns
from score_batch.io_formats.window import (
    ERROR_COLUMN,
    ITEM_ID_COLUMN,
    ROW_COLUMN,
    Window,
    columnar_window,
    concat,
    from_rows,
    json_window,
    python,
)

# A table format's reader (StdinReader is a JsonlReader); both give columns, column_type, total_rows and units
# (for distributed workers).
TableReader = ParquetReader | JsonlReader


@dataclass(frozen=True)
class InputSource:
    """The input's files, their format and directories; rows in order of the INPUTs as given, each one's files
    sorted by path (row_index counts over all of them)."""

    path: str  # how the input was given (several INPUTs: joined by ", "); "-" for stdin
    format: FileFormat  # of the files: PARQUET or JSONL (stdin: JSONL)
    files: tuple[InputFile, ...]
    directories: tuple[Location, ...] = ()  # the directories (or glob bases) the files were found in
    partition_types: tuple[tuple[str, pa.DataType], ...] = ()  # hive partition keys and their Arrow types
    # "reader": the source's reader (footers, the JSONL scan, the stdin spool), made on first use
    _state: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_state": {}}  # a pickled copy makes its own reader (no footers, no stdin)

    @property
    def label(self) -> str:
        """How messages name the input."""
        return "stdin" if self.path == STDIN else self.path

    def total_rows(self) -> int | None:
        """Row count: Parquet metadata; JSONL from the first pass over the lines."""
        return reader(self).total_rows()

    def close(self) -> None:
        """Delete the stdin spool, if any (reading the source again spools nothing: stdin is consumed)."""
        if isinstance(self._state.get("reader"), StdinReader):
            self._state["reader"].close()


def reader(source: InputSource) -> TableReader:
    """The source's table reader, made on first use (the one place a table format picks its class)."""
    state = source._state
    if "reader" not in state:
        if source.path == STDIN:
            state["reader"] = StdinReader()
        elif source.format == FileFormat.PARQUET:
            state["reader"] = ParquetReader(source.files, source.label, dict(source.partition_types))
        else:
            state["reader"] = JsonlReader(source.files, source.label)
    return state["reader"]


def input_format(source: InputSource, requested: RequestedFormat = "auto") -> FileFormat:
    """What the input holds: `table` → its files' format; `openai-batch` → batch requests; `auto` → batch
    requests when the input is one file (local or a URI), or stdin, whose first non-blank line is a request."""
    file = _batch_file(source) if requested == "auto" else None  # stdin is spooled only to be sniffed
    sniffed = file is not None and file.format == FileFormat.JSONL and looks_like_openai_batch(file)
    return FileFormat.OPENAI_BATCH if requested == "openai-batch" or sniffed else source.format


def batch_reader(source: InputSource) -> BatchFileReader:
    """The batch-file reader of a source: its one file (local or on an object store), or the stdin spool."""
    file = _batch_file(source)
    if file is None:
        raise InputError(f"input {source.label!r}: an OpenAI batch file is one JSONL file, or - for stdin")
    return BatchFileReader(file)


def _batch_file(source: InputSource) -> InputFile | None:
    """The one file a batch input is (stdin: its spool), or None for several files or a directory."""
    if source.path == STDIN:
        return reader(source).inputs()[0]
    return source.files[0] if len(source.files) == 1 and not source.directories else None


def open_source(
    paths: str | Sequence[str],
    storage_options: tuple[tuple[str, str], ...] = (),
    hive_types: HiveTypes = "infer",
) -> InputSource:
    """The files the INPUT arguments mean (io_formats.listing; `-` alone: JSONL on stdin), of one format, typed."""
    given = [paths] if isinstance(paths, str) else list(paths)
    if not given:
        raise InputError("give at least one INPUT")
    if hive_types not in ("infer", "string"):
        raise InputError(f"--hive-types {hive_types}: give infer or string")
    if STDIN in given:
        if len(given) > 1:
            raise InputError("- (stdin) cannot be combined with other inputs")
        return InputSource(STDIN, FileFormat.JSONL, ())
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
            raise InputError(f"input file {str(file)!r} is named twice by the inputs; each file is read once")
        seen.add(file.location.key())
    files, types = type_partitions(files, hive_types)
    return InputSource(
        label, check_one_format(files, label), tuple(files), tuple(directories), tuple(types.items())
    )


def read_windows(
    source: InputSource, overrides: ColumnOverrides, window_rows: int
) -> tuple[ColumnMapping, Iterator[Window]]:
    """The column mapping and windows of at most window_rows rows, cut between query groups (io_formats/cuts: a
    group longer than a window is a window of its own); the column types are checked first (an input that
    cannot take one type per column fails before scoring)."""
    mapping = input_mapping(source, overrides)
    types = column_types(source, mapping)

    def windows() -> Iterator[Window]:
        pieces: list[Window] = []
        held = 0
        # Parquet batches of a window's rows: one piece per window where the row groups allow
        for piece in _window_batches(reader(source), mapping, types, rows=max(window_rows, BATCH_ROWS)):
            pieces.append(piece)
            held += piece.num_rows
            if held > window_rows:  # the row after a window's rows tells whether a group goes on
                pieces = yield from _cut(concat(pieces), window_rows, final=False)
                held = sum(piece.num_rows for piece in pieces)
        if held:
            yield from _cut(concat(pieces), window_rows, final=True)

    return mapping, windows()


def _cut(window: Window, window_rows: int, final: bool) -> Iterator[Window]:
    """The windows cut from the front of these rows (io_formats/cuts); returns the rows left, as pieces."""
    start = 0
    for end in cuts(window, window_rows, final):
        yield window.slice(start, end)
        start = end
    return [compact(window.slice(start, window.num_rows))] if start < window.num_rows else []


def _window_batches(
    table: TableReader, mapping: ColumnMapping, types, unit: ReadUnit | None = None, rows: int = BATCH_ROWS
) -> Iterator[Window]:
    """The input's (or one unit's) rows a batch at a time as windows (Parquet: batches of `rows` rows, JSONL:
    blocks of BATCH_ROWS lines): columnar where it can, else rows.to_row."""
    shape = (bool(mapping.id_columns), mapping.keep)
    long = mapping.layout == "long"
    index = 0 if unit is None else unit.first_row
    where = None if unit is None else (unit.file, unit.row_group)
    if isinstance(table, ParquetReader):
        dictionary = (mapping.query,) if long else ()
        for file, batch in table.batches(mapping.read_columns(), where, dictionary, rows):
            window = batch_window(index, batch, dict(file.partitions), mapping, types)
            index += window.num_rows
            yield window
        return
    blocks = table.all_objects() if unit is None else unit.lines_read  # else line by line
    for file, lines in table.line_blocks(BATCH_ROWS, where):
        partitions = dict(file.partitions)
        window = json_window(index, [raw for _, raw in lines], partitions, mapping, types) if blocks else None
        if window is None:
            records = [parse_line(raw, line) for line, raw in lines]
            records = [file.with_partitions(r) if isinstance(r, dict) else r for r in records]
            window = from_rows([to_row(index + k, r, mapping, types) for k, r in enumerate(records)], *shape)
        index += window.num_rows
        yield window


def batch_window(
    first: int | np.ndarray, batch: pa.RecordBatch, partitions: dict, mapping: ColumnMapping, types
) -> Window:
    """A batch of the input's columns as a window (first: the first row's index, or [rows] each row's;
    partitions: its file's hive values): column by column where it can (columnar_window), else record by record."""
    window = columnar_window(first, batch, partitions, mapping, types)
    if window is None:
        index = np.arange(first, first + batch.num_rows) if isinstance(first, int) else first
        rows = _batch_rows(index, batch, partitions, mapping, types)
        window = from_rows(rows, bool(mapping.id_columns), mapping.keep)
    return window


def table_window(table: pa.Table, mapping: ColumnMapping, types) -> Window:
    """A window_table's rows (a Ray batch's, in any order) as one window in input order: read as a local run
    reads a batch (batch_window), each row with the error (and generated item ids) found when it was read."""
    table = table.sort_by(ROW_COLUMN)
    batch = pa.record_batch([column.combine_chunks() for column in table.columns], schema=table.schema)
    window = batch_window(table[ROW_COLUMN].to_numpy(), batch, {}, mapping, types)
    item_ids, query_ids, errors = window.item_ids, window.query_ids, table[ERROR_COLUMN].to_pylist()
    if mapping.item_id is None:
        item_ids = batch.column(ITEM_ID_COLUMN)
        item_ids = item_ids.flatten() if mapping.layout == "nested" else item_ids
    unread = [error is not None and error.startswith("line ") for error in errors]  # not JSON (rows.to_row)
    if mapping.query_key and any(unread):  # such a line has no composite key at all, not one of nulls
        query_ids = [None if gone else key for gone, key in zip(unread, python(query_ids))]
    return replace(window, errors=errors, item_ids=item_ids, query_ids=query_ids)


def _batch_rows(
    index: np.ndarray, batch: pa.RecordBatch, partitions: dict, mapping: ColumnMapping, types
) -> list:
    """A batch's rows record by record (rows.to_row; [rows] index: each row's); a string that is not UTF-8
    (Parquet's reader does not check) reads as null and fails its row, naming the column."""
    bad: dict[int, str] = {}  # row → its first column that is not UTF-8
    try:
        records = batch.to_pylist()
    except UnicodeDecodeError:
        records = [{} for _ in range(batch.num_rows)]
        for name, column in zip(batch.schema.names, batch.columns):
            for k, record in enumerate(records):
                try:
                    record[name] = column[k].as_py()
                except UnicodeDecodeError:
                    record[name] = None
                    bad.setdefault(k, name)
    rows = [to_row(i, {**partitions, **r}, mapping, types) for i, r in zip(index.tolist(), records)]
    for k, name in bad.items():
        rows[k].error = f"column {name!r} holds bytes that are not valid UTF-8"
    return rows


def input_mapping(source: InputSource, overrides: ColumnOverrides) -> ColumnMapping:
    """The column mapping of an input, from the columns of all its files or all its JSONL lines."""
    columns = reader(source).columns()
    if columns is not None and set(ENVELOPE) <= set(columns) and not overrides.query_col:
        if "query" not in columns and "query_tokens" not in columns:
            raise InputError(
                f"{source.label}: the lines are OpenAI batch requests (custom_id, url, body), not query/item "
                "rows; give --input-format openai-batch"
            )
    return resolve_columns(columns, overrides, source.label)


def column_types(source: InputSource, mapping: ColumnMapping) -> dict[str, pa.DataType]:
    """The Arrow type of each id and kept column over the whole input (nested item ids: the lists' element type;
    null everywhere: pa.null()); InputError, naming the column and where, when it cannot take one type."""
    table = reader(source)
    types = {name: table.column_type(name) for name in mapping.typed_columns()}
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
    lines_read: bool = False  # JSONL: the first pass read every line of the input as one JSON object


def read_units(source: InputSource) -> list[ReadUnit]:
    """The input split into independently readable units, in input order, with their first row index."""
    units, offset, table = [], 0, reader(source)
    listed = table.units()  # JSONL: after its first pass, which all_objects reports
    lines_read = isinstance(table, JsonlReader) and table.all_objects()
    for file, row_group, rows in listed:
        units.append(ReadUnit(source, file, row_group, offset, lines_read))
        offset += rows
    return units


def read_unit(unit: ReadUnit, mapping: ColumnMapping, types: dict[str, pa.DataType] | None = None) -> Window:
    """The validated rows of one unit as a window, indexed as in a whole-input read (types: column_types)."""
    windows = list(_window_batches(reader(unit.source), mapping, types or {}, unit))
    return concat(windows) if windows else from_rows([], bool(mapping.id_columns), mapping.keep)


def _element_type(dtype: pa.DataType, name: str, label: str) -> pa.DataType:
    """The element type of the nested layout's item-ids column."""
    if pa.types.is_null(dtype):
        return dtype
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return dtype.value_type
    raise InputError(f"{label}: column {name!r} must hold lists of item ids (one per item), not {dtype}")
