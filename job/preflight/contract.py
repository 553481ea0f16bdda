"""The output contract: every schema the job writes (parts, the final file, stdout, Ray's files, the errors
file), so a local and a Ray run write the same columns and types; failed rows split out; the column checks."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from score_batch.io_formats.columns import (
    CHUNKS,
    ERROR,
    ID_COLUMNS,
    ITEM_ID,
    POOLED,
    QUERY_ID,
    QUERY_KEY,
    RANK,
    ROW_INDEX,
    SCORE,
    SCORE_KEY,
    SCORES,
    TALLY_COLUMNS,
)
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location
from score_batch.io_formats.schema import ColumnMapping
from score_batch.io_formats.window import Window, key_type
from score_batch.io_formats.writers import (
    HIVE_NULL,
    PART_NAME,
    hive_directory,
    jsonl_unwritable,
    output_format,
)

NAME_MAX = 255  # bytes in a file name where the filesystem does not say (Linux, macOS)
KEY_MAX = 1024  # bytes in an object key (S3; a GCS object name too)


def check_kept_columns(keep: tuple[str, ...], *, ranked: bool, pooled: bool, chunked: bool = False) -> None:
    """--keep-columns may not name a column the job writes (needs no weights or input: preflight runs it)."""
    for name in OutputContract.written_columns(ranked=ranked, pooled=pooled, chunked=chunked):
        if name not in keep:
            continue
        if name in ID_COLUMNS:
            raise InputError(f"--keep-columns: {name!r} is already in the output as {name}; leave it out")
        if name in (QUERY_KEY, SCORE_KEY):
            raise InputError(
                f"--keep-columns {name!r}: that name is taken by a column the job writes; rename the input column"
            )
        when = {RANK: " with --rank / --top-k", CHUNKS: " with --truncate chunk"}.get(name, "")
        raise InputError(
            f"--keep-columns {name!r} would overwrite the output column of the same name{when}; "
            "rename the input column"
        )


def check_jsonl_columns(mapping: ColumnMapping, types: dict[str, pa.DataType], output: str) -> None:
    """Refuse, before scoring, an id or kept column a JSON lines output (or stdout) cannot write."""
    try:
        if output_format(output) != "jsonl":
            return
    except InputError:  # a directory (--partition-by, a Ray run): Parquet
        return
    for name in (*mapping.id_columns, mapping.item_id, *mapping.keep):
        why = jsonl_unwritable(types[name]) if name and name in types else None
        if why is not None:
            raise InputError(
                f"column {name!r} cannot be written to {output!r}: {why}; write a .parquet output, "
                "or leave the column out"
            )


def check_partition_by(partition_by: tuple[str, ...], keep: tuple[str, ...]) -> None:
    """--partition-by names output columns that identify rows: the ids or kept columns, each once."""
    allowed = (*ID_COLUMNS, *keep)
    for i, name in enumerate(partition_by):
        if name not in allowed:
            raise InputError(
                f"--partition-by names {name!r}, which is not an id or kept column of the output; "
                f"allowed: {', '.join(allowed)} (add input columns with --keep-columns)"
            )
        if name in partition_by[:i]:
            raise InputError(f"--partition-by names {name!r} twice")


def _is_bytes(dtype: pa.DataType) -> bool:
    """Whether a column holds bytes (binary of any width: a UUID's 16 bytes too), which name no directory."""
    return (
        pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or pa.types.is_fixed_size_binary(dtype)
    )


@dataclass(frozen=True)
class PartitionNames:
    """--partition-by's directory names, checked for each window before it is scored: every `col=value` (as
    io_formats/writers.hive_directory writes it) within the filesystem's limit on a name and, on an object
    store, every file's key (the staged output's prefix, the directories, the file name) within the store's."""

    columns: tuple[str, ...]
    name_limit: int  # bytes in one file name (the local filesystem's NAME_MAX: outputs are staged locally)
    key_limit: int | None = None  # bytes in an object key (object stores), else None
    key_prefix: int = 0  # bytes of the key around the directories: the staging prefix, "/" and the file name

    def check(self, window: Window) -> None:
        """Raise InputError naming the first partition value whose directory name (or key) is too long."""
        rows = window.item_rows()  # [items]: an output row per item
        columns = [
            (name, text) for name in self.columns if (text := _as_text(window, name, rows)) is not None
        ]
        lengths = [_upper_lengths(name, text) for name, text in columns]  # [columns][items] at most
        exact = [length > self.name_limit for length in lengths]  # [columns][items] to encode
        if self.key_limit is not None and lengths:
            keys = self.key_prefix + sum(length + 1 for length in lengths)  # [items] at most
            exact = [wanted | (keys > self.key_limit) for wanted in exact]
        for (name, text), length, wanted in zip(columns, lengths, exact):
            for k in np.flatnonzero(wanted).tolist():
                length[k] = len(hive_directory(name, text[k].as_py()).encode())
            over = np.flatnonzero(length > self.name_limit)
            if len(over):
                self._refuse(window, rows, name, text, length, int(over[0]), self.name_limit, "a file name")
        if self.key_limit is not None and lengths:
            keys = self.key_prefix + sum(length + 1 for length in lengths)  # [items] bytes of each file's key
            over = np.flatnonzero(keys > self.key_limit)
            if len(over):
                k = int(over[0])
                name, text = columns[int(np.argmax([length[k] for length in lengths]))]
                self._refuse(window, rows, name, text, keys, k, self.key_limit, "an object key")

    @staticmethod
    def _refuse(window, rows, name, text, length, k, limit, what) -> None:
        value = text[k].as_py()
        shown = value if len(value) <= 40 else f"{value[:40]}…"
        raise InputError(
            f"--partition-by {name!r}: row {int(window.index[rows[k]])}'s value {shown!r} ({len(value)} "
            f"characters) makes {what} of {int(length[k])} bytes (percent-encoded as hive partitioning writes "
            f"it), over the limit of {limit}; partition by a shorter column (a code or a hash of this one)"
        )


def partition_names(columns: tuple[str, ...], output: Location | None) -> PartitionNames:
    """The limits a partitioned output's names meet: the staging directory's filesystem's (beside a local
    output; in the temp dir for an object store, whose staged keys sit under `.NAME.tmp-<16 hex>/`)."""
    local = output is None or output.local
    staging = (
        os.path.dirname(output.path.rstrip("/")) if output is not None and local else tempfile.gettempdir()
    )
    try:
        name_limit = os.pathconf(staging or ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # not a directory (yet), or no pathconf (Windows)
        name_limit = NAME_MAX
    if local:
        return PartitionNames(columns, name_limit)
    key = output.path.rstrip("/").partition("/")[2]  # bucket/key
    staged = len(key.encode()) + len(".") + len(".tmp-") + 16  # the staged sibling's key
    return PartitionNames(columns, name_limit, KEY_MAX, staged + 1 + len(PART_NAME))


def _upper_lengths(name: str, text: pa.Array) -> np.ndarray:
    """[items] int64 at most the bytes of each value's directory name: percent-encoding triples a byte."""
    raw = pc.fill_null(pc.binary_length(text), len(HIVE_NULL)).to_numpy(zero_copy_only=False)
    return len(name.encode()) + 1 + 3 * raw.astype(np.int64)


def _as_text(window: Window, name: str, rows: np.ndarray) -> pa.Array | None:
    """[items] a partition column's values as the text its directories hold (a pa.string cast); None: the ids
    are generated numbers, or a type the output refuses elsewhere (OutputContract.partition_schema)."""
    per_item = name == ITEM_ID
    values = window.item_ids if per_item else window.query_ids if name == QUERY_ID else window.kept.get(name)
    if values is None:
        return None
    try:
        array = values if isinstance(values, pa.Array) else pa.array(values)
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        array = array.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return array if per_item else array.take(pa.array(rows))


@dataclass(frozen=True)
class OutputContract:
    """The column types of one run's output and the on-error mode that decides which rows go where."""

    id_types: tuple[pa.DataType, pa.DataType]  # query_id, item_id
    kept: tuple[tuple[str, pa.DataType], ...]  # pass-through columns in order
    pooled_dim: int | None  # width of pooled_hidden_state, None when not asked for
    on_error: str  # fail | record | skip
    query_ids_given: bool  # the input has query-id columns; else query_id is a digest of the query
    ranked: bool = False  # add a rank column; rows of a query come out best first
    top_k: int | None = None  # keep only the top_k scored items of each query
    chunked: bool = False  # --truncate chunk: add the chunks column (chunks per item)
    query_key: tuple[str, ...] = ()  # a composite query id's columns (query_id is a struct of them)
    partition_names: PartitionNames | None = None  # --partition-by: its directory names' limits

    @classmethod
    def from_types(
        cls,
        mapping: ColumnMapping,
        types: dict[str, pa.DataType],
        pooled_dim: int | None,
        on_error: str,
        rank: bool = False,
        top_k: int | None = None,
        chunked: bool = False,
    ) -> OutputContract:
        """From the whole input's types (absent ids: row indexes, int64); refuses kept columns that would
        overwrite a written one."""
        ranked = rank or top_k is not None
        check_kept_columns(mapping.keep, ranked=ranked, pooled=pooled_dim is not None, chunked=chunked)

        def typed(column: str | None, default: pa.DataType) -> pa.DataType:
            dtype = types.get(column) if column else None
            return default if dtype is None or pa.types.is_null(dtype) else dtype

        key = mapping.query_key
        id_types = (
            key_type(key, types) if key else typed(mapping.query_id, pa.int64()),
            typed(mapping.item_id, pa.int64()),
        )
        kept = tuple((name, typed(name, pa.string())) for name in mapping.keep)
        given = bool(mapping.id_columns)
        return cls(id_types, kept, pooled_dim, on_error, given, ranked, top_k, chunked, mapping.query_key)

    @staticmethod
    def written_columns(*, ranked: bool, pooled: bool, chunked: bool = False) -> tuple[str, ...]:
        """Every column the job writes in any file besides the kept ones (read off the schemas): the names a kept
        column may not take."""
        probe = OutputContract(
            (pa.null(), pa.null()), (), 1 if pooled else None, "record", False, ranked, chunked=chunked
        )
        return (*(probe.ranked_schema() if ranked else probe.part_schema()).names, *TALLY_COLUMNS)

    def check_window(self, window: Window) -> None:
        """Refuse, before it is scored, a window whose partition values make too long a name (PartitionNames)."""
        if self.partition_names is not None:
            self.partition_names.check(window)

    @property
    def keep(self) -> tuple[str, ...]:
        """The pass-through column names."""
        return tuple(name for name, _ in self.kept)

    def part_schema(self) -> pa.Schema:
        """Checkpoint parts and Ray batches: every column, with the row index first and the error last."""
        fields = [
            pa.field(ROW_INDEX, pa.int64()),
            pa.field(QUERY_ID, self.id_types[0]),
            pa.field(ITEM_ID, self.id_types[1]),
            pa.field(SCORE, pa.float32()),
            pa.field(SCORES, pa.list_(pa.float32())),
        ]
        if self.chunked:
            fields.append(pa.field(CHUNKS, pa.int32()))
        if self.pooled_dim is not None:
            fields.append(pa.field(POOLED, pa.list_(pa.float32(), self.pooled_dim)))
        fields.extend(pa.field(name, dtype) for name, dtype in self.kept)
        fields.append(pa.field(SCORE_KEY, pa.string()))  # --reuse matches rows by it (job/reuse.py)
        if self.ranked:
            fields.append(pa.field(QUERY_KEY, pa.string()))
        fields.append(pa.field(ERROR, pa.string()))
        return pa.schema(fields)

    def ranked_schema(self) -> pa.Schema:
        """Part rows after ranking: the part schema with rank after score."""
        schema = self.part_schema()
        return schema.insert(schema.get_field_index(SCORE) + 1, pa.field(RANK, pa.int32()))

    def final_schema(self) -> pa.Schema:
        """The user's file or stdout: no row index; rank when ranked; the error column only under record."""
        schema = (self.ranked_schema() if self.ranked else self.part_schema()).remove(0)
        if self.ranked:
            schema = schema.remove(schema.get_field_index(QUERY_KEY))
        return schema if self.on_error == "record" else schema.remove(schema.get_field_index(ERROR))

    def partition_schema(self, partition_by: tuple[str, ...]) -> pa.Schema:
        """The hive partitioning: the named final columns with their types (a dictionary's: its values')."""
        check_partition_by(partition_by, self.keep)
        schema = self.final_schema()
        fields = []
        for name in partition_by:
            field = schema.field(name)
            if pa.types.is_dictionary(field.type):
                field = field.with_type(field.type.value_type)
            if pa.types.is_nested(field.type) or _is_bytes(field.type):
                hint = " (keep a column of the composite key with --keep-columns)" if self.query_key else ""
                raise InputError(
                    f"--partition-by {field.name!r}: a column of type {field.type} cannot name a directory; "
                    f"partition by a column of numbers, text, dates or booleans{hint}"
                )
            fields.append(field)
        return pa.schema(fields)

    def ray_schema(self) -> pa.Schema:
        """A Ray run's output files: the final columns plus the row index (files hold no input order)."""
        return self.final_schema().append(pa.field(ROW_INDEX, pa.int64()))

    def part_table(self, columns: dict[str, list[Any]]) -> pa.Table:
        """A part from output columns, naming the column whose values do not fit the contract's type."""
        schema = self.part_schema()
        arrays = []
        for field in schema:
            values = columns[field.name]
            try:
                if isinstance(values, pa.Array):  # built from numpy (job/windows.output_columns)
                    arrays.append(values if values.type == field.type else values.cast(field.type))
                else:
                    arrays.append(pa.array(values, type=field.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
                raise InputError(
                    f"column {field.name!r} changes type within the input (expected {field.type}): {error}"
                ) from None
        return pa.Table.from_arrays(arrays, schema=schema)

    def split(self, part: pa.Table) -> tuple[pa.Table, pa.Table]:
        """(rows that go to the output, rows that go to the errors file), both in the part schema."""
        if self.on_error != "skip":
            return part, part.slice(0, 0)
        failed = pc.is_valid(part[ERROR])
        return part.filter(pc.invert(failed)), part.filter(failed)

    def final_view(self, part: pa.Table) -> pa.Table:
        """Part rows in the final schema: its columns, in its order and types."""
        schema = self.final_schema()
        return part.select(schema.names).cast(schema)

    def ray_view(self, part: pa.Table) -> pa.Table:
        """Part rows in the Ray output schema."""
        schema = self.ray_schema()
        return part.select(schema.names).cast(schema)
