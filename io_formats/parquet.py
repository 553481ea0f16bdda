"""Parquet inputs (local or remote, with hive partition values) → record batches: footers read once, a column's
type unified over all files, one row group at a time for a distributed worker."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from score_batch.io_formats.arrow_types import plain_batch, plain_schema, plain_type
from score_batch.io_formats.errors import READ_ERRORS, InputError, unreadable
from score_batch.io_formats.listing import InputFile
from score_batch.io_formats.rows import unify

BATCH_ROWS = 1024  # rows per record batch read from a file


@dataclass(frozen=True)
class ParquetInfo:
    """One Parquet file's schema and row counts, read from its footer."""

    file: InputFile
    schema: pa.Schema  # the file's columns, then the partition keys it does not hold (typed as the input's)
    num_rows: int
    row_group_rows: tuple[int, ...]


class ParquetReader:
    """The Parquet files of an input, in order: their footers (read once), column types and record batches."""

    def __init__(
        self, files: tuple[InputFile, ...], label: str, partition_types: dict[str, pa.DataType]
    ) -> None:
        self.files = files
        self.label = label
        self.partition_types = partition_types
        self._infos: list[ParquetInfo] | None = None

    def infos(self) -> list[ParquetInfo]:
        """Footers of all files; a file that is not readable Parquet is an InputError."""
        if self._infos is None:
            self._infos = [self._info(file) for file in self.files]
        return self._infos

    def columns(self) -> list[str]:
        """All files' columns (partition keys included), in order of first appearance."""
        names: dict[str, None] = {}
        for info in self.infos():
            names.update(dict.fromkeys(info.schema.names))
        return list(names)

    def column_type(self, name: str) -> pa.DataType:
        """One column's plain type (arrow_types.plain_type: as its batches are read) unified over the files;
        InputError when files disagree or lack it."""
        infos = self.infos()
        present = [
            (info.file, plain_type(info.schema.field(name).type, name))
            for info in infos
            if name in info.schema.names
        ]
        missing = [info.file for info in infos if name not in info.schema.names]
        if not present:
            return pa.null()
        if missing:
            raise InputError(
                f"{self.label}: column {name!r} is in {present[0][0]} but not in {missing[0]}"
                + (f" (nor in {len(missing) - 1} more files)" if len(missing) > 1 else "")
            )
        unified = present[0][1]
        for file, dtype in present[1:]:
            merged = unify(unified, dtype)
            if merged is None:
                first, kind = next((f, t) for f, t in present if unify(t, dtype) is None)
                raise InputError(
                    f"{self.label}: files disagree on column {name!r}: {kind} in {first}, {dtype} in {file}"
                )
            unified = merged
        return unified

    def total_rows(self) -> int:
        return sum(info.num_rows for info in self.infos())

    def batches(
        self,
        columns: list[str],
        unit: tuple[InputFile, int | None] | None = None,
        dictionary: tuple[str, ...] = (),
        rows: int = BATCH_ROWS,
    ) -> Iterator[tuple[InputFile, pa.RecordBatch]]:
        """(file, batch of at most `rows` rows of the named columns it holds, their types plain: column_type's)
        of every file in order, or of one unit's row group; the dictionary columns read dictionary-encoded (a
        repeated query is one value)."""
        for info in self.infos():
            if unit is not None and info.file != unit[0]:
                continue
            groups = None if unit is None else [unit[1]]
            text = [n for n in dictionary if n in info.schema.names and _is_text(info.schema.field(n).type)]
            try:
                with _open(info.file) as handle:
                    parquet = pq.ParquetFile(handle, read_dictionary=text)
                    names = [name for name in columns if name in parquet.schema_arrow.names]
                    read, plain = None, None  # a batch's schema as read, and as its plain types
                    for batch in parquet.iter_batches(batch_size=rows, row_groups=groups, columns=names):
                        if batch.schema != read:
                            read, plain = batch.schema, plain_schema(batch.schema)
                        yield info.file, plain_batch(batch, plain)
            except READ_ERRORS as error:
                raise unreadable(error, f"{info.file}: cannot read this Parquet file: {error}") from None

    def units(self) -> list[tuple[InputFile, int | None, int]]:
        """(file, row group, rows) per row group: what one distributed worker reads."""
        return [
            (info.file, group, rows)
            for info in self.infos()
            for group, rows in enumerate(info.row_group_rows)
        ]

    def _info(self, file: InputFile) -> ParquetInfo:
        try:
            with _open(file) as stream:
                handle = pq.ParquetFile(stream)
                metadata = handle.metadata
                schema = handle.schema_arrow
        except FileNotFoundError:
            raise InputError(f"{file}: the file is gone (removed while the run started?)") from None
        except READ_ERRORS as error:
            raise unreadable(
                error, f"{file}: not a readable Parquet file ({_describe(error, file)})"
            ) from None
        for key, _ in file.partitions:
            if key not in schema.names:
                schema = schema.append(pa.field(key, self.partition_types.get(key, pa.string())))
        groups = tuple(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups))
        return ParquetInfo(file, schema, metadata.num_rows, groups)


def _is_text(dtype: pa.DataType) -> bool:
    """Whether a column holds strings (read dictionary-encoded when asked; token-id lists are not)."""
    return pa.types.is_string(dtype) or pa.types.is_large_string(dtype)


def _open(file: InputFile):
    """A random-access handle on a Parquet file on its filesystem."""
    return file.location.fs.open_input_file(file.location.path)


def _describe(error: BaseException, file: InputFile) -> str:
    """pyarrow's message, with a plainer word for an empty file."""
    try:
        if file.location.info().size == 0:
            return "the file is empty (0 bytes)"
    except OSError:
        pass
    return str(error) or type(error).__name__
