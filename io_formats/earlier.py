"""Earlier score-batch outputs read back for --reuse (each argument what an INPUT may be, or several joined by
commas): record batches of (score key, values) in the types this run writes, so a value read back is the value
written, bit for bit; a column that cannot take this run's type (another model's pooled width) reads as null,
and a row is copied only when it holds every value this run writes (complete_rows)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from score_batch import __version__
from score_batch.io_formats.columns import CHUNKS, POOLED, SCORE, SCORE_KEY, SCORES
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.listing import PARQUET, InputFile, directory_files, expand, file_format, file_info
from score_batch.io_formats.locations import HTTP, has_glob, parse_location, split_inputs

log = logging.getLogger(__name__)

SCAN_BATCH_ROWS = 65_536
JOIN_MEMORY = "1GB"  # DuckDB's memory limit for the join; past it, it spills to disk
JSON_BLOCK_BYTES = 1 << 22  # the streaming JSON reader's block: a few MB of lines at a time
# A Parquet output's record of what wrote it (job/checkpoint/completion).
COMPLETION_RECORD = b"score_batch.completion_record"
COMPLETE = "complete"  # the joined stream's flag: the earlier row holds every value this run writes


class _Output:
    """An earlier output file: its columns, the completion record a Parquet one carries, its keyed rows."""

    def __init__(self, file: InputFile) -> None:
        self.uri, self.file, self.record = str(file), file, None
        if file.format == PARQUET:
            import pyarrow.dataset as ds

            self.dataset = ds.dataset(file.location.path, filesystem=file.location.fs, format="parquet")
            self.names = self.dataset.schema.names
            self.record = (self.dataset.schema.metadata or {}).get(COMPLETION_RECORD)
            return
        # JSONL carries no record (OUTPUT.done is written under --resume only)
        with file.open() as stream:
            first = next((line for line in io.TextIOWrapper(stream, encoding="utf-8") if line.strip()), None)
        try:
            row = json.loads(first) if first is not None else {}
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise InputError(
                f"--reuse {self.uri!r}: not a score-batch output (its lines are not JSON objects)"
            )
        self.names = list(row) if first is not None else [SCORE_KEY]

    def written_by(self) -> str | None:
        """The score-batch version that wrote this output, from its completion record (None: not recorded)."""
        return self._recorded(lambda record: dict(record["software"]).get("score-batch"))

    def top_k(self) -> int | None:
        """The --top-k of the run that wrote this output, from its completion record (None: all its pairs; also
        the OUTPUT of a run with --ranked-output, which holds every row: its view's record names none)."""
        top_k = self._recorded(lambda record: record["settings"]["top_k"])
        view = self._recorded(lambda record: record["settings"].get("ranked_output"))
        return top_k if isinstance(top_k, int) and not view else None

    def _recorded(self, read) -> object:
        """A value read from the completion record (None when it is missing or malformed)."""
        try:
            return read(json.loads(self.record or b"null"))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def batches(self, names: list[str]) -> Iterator[pa.RecordBatch]:
        """The rows with a score key: Parquet scanned with little readahead, JSONL in blocks of fixed types."""
        import pyarrow.dataset as ds
        import pyarrow.json as pj

        if self.file.format == PARQUET:
            yield from self.dataset.scanner(
                columns=names,
                filter=ds.field(SCORE_KEY).is_valid(),
                batch_size=SCAN_BATCH_ROWS,
                batch_readahead=2,  # memory: a few batches in flight, not the scanner's default 16
                fragment_readahead=1,
            ).to_batches()
            return
        parse = pj.ParseOptions(explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="ignore")
        with self.file.open() as stream:
            reader = pj.open_json(
                stream, read_options=pj.ReadOptions(block_size=JSON_BLOCK_BYTES), parse_options=parse
            )
            for batch in reader:
                batch = batch.select([name for name in names if name in batch.schema.names])
                yield batch.filter(pc.is_valid(batch.column(SCORE_KEY)))


def open_earlier(texts: tuple[str, ...], options=(), missing_ok: bool = False, warn: bool = True) -> list:
    """The earlier outputs, one per file the --reuse arguments mean, opened and checked (no rows read); a missing
    argument is an InputError unless missing_ok (then a warning)."""
    outputs = []
    for text in split_inputs(tuple(texts)):
        files = _files(text, options)
        if files is None:
            if not missing_ok:
                raise InputError(
                    f"--reuse {text!r}: no such file or directory (nor files matching it); pass "
                    "--reuse-missing-ok to score every pair when an earlier output is not there"
                )
            if warn:
                log.warning("--reuse %s is not there (did that run fail?): its pairs are scored", text)
            continue
        opened = [_open(file) for file in files]
        for output in opened:
            _check_columns(output)
        versions = {output.written_by() for output in opened} - {None, __version__}
        if warn and versions:
            log.warning(
                "--reuse %s was written by score-batch %s: its score keys cannot match this version's (%s), so "
                "its pairs are scored again",
                text,
                ", ".join(sorted(versions)),
                __version__,
            )
        top_k = {output.top_k() for output in opened} - {None}
        if warn and top_k:
            log.warning(
                "--reuse %s is a --top-k %s output: it holds only the best pairs of each query, so only those are "
                "reused and the others are scored again; to reuse every pair, reuse the output of a run without "
                "--top-k",
                text,
                ", ".join(map(str, sorted(top_k))),
            )
        outputs.extend(opened)
    return outputs


def _check_columns(output: _Output) -> None:
    """An earlier output needs its score key (to match rows by) and a score column (a value to copy)."""
    if SCORE_KEY not in output.names:
        raise InputError(
            f"--reuse {output.uri!r} has no {SCORE_KEY} column: it was not written by score-batch 0.2 or "
            "later, or it is not a score-batch output, so its rows cannot be matched; leave it out"
        )
    if SCORE not in output.names and SCORES not in output.names:
        raise InputError(
            f"--reuse {output.uri!r} has no {SCORE} column (nor {SCORES}): it holds no score to copy; "
            "leave it out, or keep the score columns of the output it was cut from"
        )


def missing_columns(output: _Output, values: pa.Schema) -> list[str]:
    """The value columns this run writes that an earlier output lacks (its pairs are scored again)."""
    return [name for name in values.names if name not in output.names]


def complete_rows(table: pa.Table | pa.RecordBatch, names: list[str]) -> np.ndarray:
    """[rows] bool: the rows holding every named value column, non-null, its numbers finite and its lists
    non-empty without a null (what may be copied: never a NaN or a null as a score)."""
    complete = np.ones(table.num_rows, bool)
    for name in names:
        if name not in table.schema.names:
            complete[:] = False
            continue
        column = table.column(name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        complete &= column.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
            parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)  # [elements]
            complete[parents[~_usable(pc.list_flatten(column))]] = False
            complete &= pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False) > 0
        else:
            complete &= _usable(column)
    return complete


def _usable(values: pa.Array) -> np.ndarray:
    """[values] bool: non-null, and finite where the values are floating point."""
    usable = pc.is_finite(values) if pa.types.is_floating(values.type) else values.is_valid()
    return pc.fill_null(usable, False).to_numpy(zero_copy_only=False)


def join_earlier(
    outputs: list, keys: Path, values: pa.Schema, directory: Path, joined: Path, threads: int
) -> tuple[int, int]:
    """DuckDB: keys (Parquet: row_index, item_pos, score_key) ⋈ the earlier outputs' rows → joined, in input order
    with values in this run's types and their COMPLETE flag (a key held twice: a complete row first, then the
    first output's, lowest score); (the pairs matched complete, those matched only incomplete)."""
    import duckdb  # a dependency: imported only by --reuse runs

    schema = pa.schema([pa.field(SCORE_KEY, pa.string()), *values])
    failed: list[Exception] = []  # an output that cannot be read: its own message, not DuckDB's traceback
    stream = pa.RecordBatchReader.from_batches(
        _stream_schema(schema), _earlier_batches(outputs, schema, failed)
    )
    names = ", ".join(f"e.{name}" for name in values.names)
    # the paths as the insides of SQL string literals (a quote doubled)
    spill_sql, keys_sql, joined_sql = (str(p).replace("'", "''") for p in (directory / "spill", keys, joined))
    connection = duckdb.connect()
    try:
        connection.execute(f"SET memory_limit = '{JOIN_MEMORY}'")
        connection.execute(f"SET temp_directory = '{spill_sql}'")
        connection.execute(f"SET threads = {threads}")
        connection.register("earlier", stream)
        connection.execute(
            f"""COPY (
                SELECT k.row_index, k.item_pos, k.{SCORE_KEY}, {names}, e.{COMPLETE}
                FROM read_parquet('{keys_sql}') AS k JOIN earlier AS e USING ({SCORE_KEY})
                QUALIFY row_number() OVER (
                    PARTITION BY k.row_index, k.item_pos ORDER BY NOT e.{COMPLETE}, e.source, e.score, e.scores
                ) = 1
                ORDER BY k.row_index, k.item_pos
            ) TO '{joined_sql}' (FORMAT parquet)"""
        )
        complete, matched = connection.execute(
            f"SELECT count(*) FILTER (WHERE {COMPLETE}), count(*) FROM read_parquet('{joined_sql}')"
        ).fetchone()
    except (duckdb.Error, pa.ArrowException) as error:
        if failed:
            raise failed[0] from None
        first = _first_line(error)
        if isinstance(error, (duckdb.IOException, duckdb.OutOfMemoryException)):  # the machine's: exit 3
            raise OSError(f"--reuse: joining the earlier outputs failed: {first}") from None
        raise InputError(f"--reuse: joining the earlier outputs failed: {first}") from None
    finally:
        connection.close()
    return complete, matched - complete


def _earlier_batches(outputs: list, schema: pa.Schema, failed: list) -> Iterator[pa.RecordBatch]:
    """Every earlier output's keyed rows in schema plus `source` (the output's position); an output that cannot
    be read goes into failed as an InputError, then raises."""
    for number, output in enumerate(outputs):
        names = [name for name in schema.names if name in output.names]
        try:
            for batch in output.batches(names):
                if batch.num_rows:
                    yield _conformed(batch, schema, number)
        except InputError as error:
            failed.append(error)
            raise
        except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as error:
            failed.append(
                InputError(
                    f"--reuse {output.uri!r}: not a readable score-batch output ({_first_line(error)}): "
                    "truncated or damaged? leave it out"
                )
            )
            raise


def _first_line(error: BaseException) -> str:
    """The first line of an error's message (its type when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _stream_schema(schema: pa.Schema) -> pa.Schema:
    """The earlier rows as joined: the score key and values, whether they are complete, the output's number."""
    return schema.append(pa.field(COMPLETE, pa.bool_())).append(pa.field("source", pa.int32()))


def _conformed(batch: pa.RecordBatch, schema: pa.Schema, number: int) -> pa.RecordBatch:
    """A batch in schema's columns and types (missing or uncastable: null) plus whether each row holds every
    value (complete_rows) and its source number."""
    arrays = []
    for field in schema:
        column = batch.column(field.name) if field.name in batch.schema.names else None
        try:
            arrays.append(pa.nulls(batch.num_rows, field.type) if column is None else column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            if field.name == SCORE_KEY:
                raise InputError(f"--reuse: an earlier output's {SCORE_KEY} column is not text") from None
            arrays.append(pa.nulls(batch.num_rows, field.type))
    values = pa.RecordBatch.from_arrays(arrays, schema=schema)
    arrays.append(pa.array(complete_rows(values, schema.names[1:])))
    arrays.append(pa.array([number] * batch.num_rows, pa.int32()))
    return pa.RecordBatch.from_arrays(arrays, schema=_stream_schema(schema))


def _files(text: str, options) -> list[InputFile] | None:
    """The output files one --reuse argument means, as an INPUT would; None when it names nothing."""
    location = parse_location(text, options)
    globbed = has_glob(location.path) and location.scheme != HTTP
    kind = None if globbed else file_info(location).type
    if kind == pafs.FileType.NotFound:
        return None
    if kind in (None, pafs.FileType.Directory):
        try:
            return expand(location)[0] if globbed else directory_files(location)
        except InputError:
            if globbed:  # matches no data file
                return None
            raise InputError(
                f"--reuse {location.uri!r}: a directory without .parquet or .jsonl files (or partition "
                "directories of them), not a score-batch output"
            ) from None
    known = file_format(location.name)
    if known is None:
        raise InputError(
            f"--reuse {location.uri!r}: not a score-batch output (a .parquet or .jsonl file, or a directory "
            "of Parquet files)"
        )
    return [InputFile(location, *known)]


def _open(file: InputFile):
    """One earlier output file, opened (its schema, or its first line)."""
    try:
        return _Output(file)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as error:
        raise InputError(
            f"--reuse {str(file)!r}: not a readable score-batch output ({_first_line(error)})"
        ) from None


# JSONL outputs are read with these types (JSON numbers are doubles; a float32 written as JSON reads back to
# the same float32): inferring them per block would type a block of failed rows as null.
_JSON_SCHEMA = pa.schema(
    [
        pa.field(SCORE_KEY, pa.string()),
        pa.field(SCORE, pa.float64()),
        pa.field(SCORES, pa.list_(pa.float64())),
        pa.field(CHUNKS, pa.int64()),
        pa.field(POOLED, pa.list_(pa.float64())),
    ]
)
