"""Earlier score-batch outputs read back for --reuse: one stream of (score key, score values) rows.

Any output score-batch writes is read: a Parquet file, a JSONL file (plain or .gz/.zst/.bz2), a partitioned
Parquet directory (hive `col=value/`; `_SUCCESS` and `_common_metadata` skipped), on a local disk or an
object store. Rows are read in record batches (pyarrow's dataset scanner, or its streaming JSON reader),
never held whole, and come out in the types the current run writes, so a value read back is the value
written, bit for bit. A column whose values cannot take this run's type (another model's pooled width)
comes out null: such rows were scored under another score identity, so their keys cannot match.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from score_batch.io_formats.columns import CHUNKS, POOLED, SCORE, SCORE_KEY, SCORES
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location, parse_location
from score_batch.io_formats.writers import output_compression, output_format

SCAN_BATCH_ROWS = 65_536
JOIN_MEMORY = "1GB"  # DuckDB's memory limit for the join; past it, it spills to disk
JSON_BLOCK_BYTES = 1 << 22  # the streaming JSON reader's block: a few MB of lines at a time


class _ParquetOutput:
    """A Parquet file or partitioned directory, scanned with little readahead."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset
        self.names = dataset.schema.names

    def batches(self, names: list[str]) -> Iterator[pa.RecordBatch]:
        import pyarrow.dataset as ds

        scanner = self.dataset.scanner(
            columns=names,
            filter=ds.field(SCORE_KEY).is_valid(),
            batch_size=SCAN_BATCH_ROWS,
            batch_readahead=2,  # memory: a few batches in flight, not the scanner's default 16
            fragment_readahead=1,
        )
        return scanner.to_batches()


class _JsonlOutput:
    """A JSONL output (compressed as its name says), read block by block with fixed column types."""

    def __init__(self, location: Location) -> None:
        self.location = location
        first = next((line for line in self._lines() if line.strip()), None)
        try:
            row = json.loads(first) if first is not None else {}
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise InputError(
                f"--reuse {location.uri!r}: not a score-batch output (its lines are not JSON objects)"
            )
        self.names = list(row) if first is not None else [SCORE_KEY]

    def _stream(self):
        compression = output_compression(self.location.path)  # by name, as the writer chose it
        return self.location.fs.open_input_stream(self.location.path, compression=compression)

    def _lines(self) -> Iterator[str]:
        import io

        with self._stream() as stream:
            yield from io.TextIOWrapper(stream, encoding="utf-8")

    def batches(self, names: list[str]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc
        import pyarrow.json as pj

        parse = pj.ParseOptions(explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="ignore")
        with self._stream() as stream:
            reader = pj.open_json(
                stream, read_options=pj.ReadOptions(block_size=JSON_BLOCK_BYTES), parse_options=parse
            )
            for batch in reader:
                batch = batch.select([name for name in names if name in batch.schema.names])
                yield batch.filter(pc.is_valid(batch.column(SCORE_KEY)))


def open_earlier(texts: tuple[str, ...], options=()) -> list:
    """The earlier outputs, opened and checked (no rows read): InputError for a path that is missing or is
    not a score-batch output."""
    outputs = [_open(text, options) for text in texts]
    for text, output in zip(texts, outputs):
        if SCORE_KEY not in output.names:
            raise InputError(
                f"--reuse {text!r} has no {SCORE_KEY} column: it was not written by score-batch 0.2 or later, "
                "or it is not a score-batch output, so its rows cannot be matched; leave it out"
            )
    return outputs


def join_earlier(
    texts: tuple[str, ...],
    options,
    keys: Path,
    values: pa.Schema,
    directory: Path,
    joined: Path,
    threads: int,
) -> int:
    """DuckDB: a run's keys (keys: a Parquet file of row_index, item_pos, score_key) ⋈ the earlier outputs'
    rows, in input order, to the Parquet file joined (row_index, item_pos, score_key, then values: the reused
    columns in this run's types); the number of pairs matched. Streamed: the outputs are scanned in record
    batches and DuckDB spills to directory past JOIN_MEMORY. A key held by several earlier rows takes the
    first output's, the lowest score there."""
    import pyarrow.parquet as pq

    try:
        import duckdb
    except ImportError:
        raise InputError("--reuse needs DuckDB, which is not installed: pip install duckdb") from None
    schema = pa.schema([pa.field(SCORE_KEY, pa.string()), *values])
    stream = pa.RecordBatchReader.from_batches(
        schema.append(pa.field("source", pa.int32())), _earlier_batches(open_earlier(texts, options), schema)
    )
    names = ", ".join(f"e.{name}" for name in values.names)
    spill_sql, keys_sql, joined_sql = (_sql_text(path) for path in (directory / "spill", keys, joined))
    connection = duckdb.connect()
    try:
        connection.execute(f"SET memory_limit = '{JOIN_MEMORY}'")
        connection.execute(f"SET temp_directory = '{spill_sql}'")
        connection.execute(f"SET threads = {threads}")
        connection.register("earlier", stream)
        connection.execute(
            f"""COPY (
                SELECT k.row_index, k.item_pos, k.{SCORE_KEY}, {names}
                FROM read_parquet('{keys_sql}') AS k JOIN earlier AS e USING ({SCORE_KEY})
                QUALIFY row_number() OVER (PARTITION BY k.row_index, k.item_pos ORDER BY e.source, e.score, e.scores) = 1
                ORDER BY k.row_index, k.item_pos
            ) TO '{joined_sql}' (FORMAT parquet)"""
        )
    except duckdb.Error as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if isinstance(error, (duckdb.IOException, duckdb.OutOfMemoryException)):  # the machine's: exit 3
            raise OSError(f"--reuse: joining the earlier outputs failed: {first}") from None
        raise InputError(f"--reuse: joining the earlier outputs failed: {first}") from None
    finally:
        connection.close()
    return pq.ParquetFile(joined).metadata.num_rows


def _earlier_batches(outputs: list, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Record batches of every earlier output in order, in schema (score_key first; the value columns the run
    writes), with a `source` int32 column: the output's position. Rows with no score key (failed rows) are
    dropped."""
    for number, output in enumerate(outputs):
        names = [name for name in schema.names if name in output.names]
        for batch in output.batches(names):
            if batch.num_rows:
                yield _conformed(batch, schema, number)


def _sql_text(path: Path) -> str:
    """A path as the inside of a SQL string literal (a quote doubled)."""
    return str(path).replace("'", "''")


def _conformed(batch: pa.RecordBatch, schema: pa.Schema, number: int) -> pa.RecordBatch:
    """A batch in schema's columns and types (a column the output lacks, or whose values cannot take the
    type, is null) plus its source number."""
    arrays = []
    for field in schema:
        column = batch.column(field.name) if field.name in batch.schema.names else None
        try:
            arrays.append(pa.nulls(batch.num_rows, field.type) if column is None else column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            if field.name == SCORE_KEY:
                raise InputError(f"--reuse: an earlier output's {SCORE_KEY} column is not text") from None
            arrays.append(pa.nulls(batch.num_rows, field.type))
    arrays.append(pa.array([number] * batch.num_rows, pa.int32()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema.append(pa.field("source", pa.int32())))


def _open(text: str, options):
    """The earlier output at text (its format from its name, or a Parquet directory)."""
    import pyarrow.dataset as ds

    location = parse_location(text, options)
    kind = location.info().type.name
    if kind == "NotFound":
        raise InputError(f"--reuse {location.uri!r}: no such file or directory")
    try:
        if kind == "Directory":
            dataset = ds.dataset(location.path, filesystem=location.fs, format="parquet", partitioning="hive")
            return _ParquetOutput(dataset)
        fmt = output_format(location.path)
        if fmt == "parquet":
            return _ParquetOutput(ds.dataset(location.path, filesystem=location.fs, format="parquet"))
        return _JsonlOutput(location)
    except InputError:
        raise InputError(
            f"--reuse {location.uri!r}: not a score-batch output (a .parquet or .jsonl file, or a directory "
            "of Parquet files)"
        ) from None
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"--reuse {location.uri!r}: not a readable score-batch output ({first})") from None


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
