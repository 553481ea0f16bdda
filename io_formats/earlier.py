"""Earlier score-batch outputs read back for --reuse: one stream of (score key, score values) rows.

Any output score-batch writes is read: a Parquet file, a JSONL file (plain or .gz/.zst/.bz2), a partitioned
Parquet directory (hive `col=value/`; `_SUCCESS` and `_common_metadata` skipped), on a local disk or an
object store. Rows are scanned in record batches (pyarrow's dataset scanner), never held whole, and come
out in the types the current run writes, so a value read back is the value written, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location, parse_location
from score_batch.io_formats.writers import output_format

SCORE_KEY = "score_key"  # every scored output row: hex digest of (model, scoring settings, query, item)
SCAN_BATCH_ROWS = 65_536


def open_earlier(texts: tuple[str, ...], options=()) -> list:
    """The earlier outputs as pyarrow datasets, opened and checked (no data read): InputError for a path that
    is missing or is not a score-batch output."""
    datasets = [_dataset(text, options) for text in texts]
    for text, dataset in zip(texts, datasets):
        if SCORE_KEY not in dataset.schema.names:
            raise InputError(
                f"--reuse {text!r} has no {SCORE_KEY} column: it was not written by score-batch 0.2 or later, "
                "or it is not a score-batch output, so its rows cannot be matched; leave it out"
            )
    return datasets


def earlier_batches(texts: tuple[str, ...], schema: pa.Schema, options=()) -> Iterator[pa.RecordBatch]:
    """Record batches of every earlier output in order, in schema (score_key first; the value columns the run
    writes), with a `source` int32 column: the position of the output in texts. Rows with no score key
    (failed rows) are dropped. The outputs are opened and checked first (open_earlier)."""
    import pyarrow.dataset as ds

    datasets = open_earlier(texts, options)

    def batches() -> Iterator[pa.RecordBatch]:
        for number, dataset in enumerate(datasets):
            names = [name for name in schema.names if name in dataset.schema.names]
            scanner = dataset.scanner(
                columns=names,
                filter=ds.field(SCORE_KEY).is_valid(),
                batch_size=SCAN_BATCH_ROWS,
                batch_readahead=2,  # memory: a few batches in flight, not the scanner's default 16
                fragment_readahead=1,
            )
            for batch in scanner.to_batches():
                if batch.num_rows:
                    yield _conformed(batch, schema, number)

    return batches()


def _conformed(batch: pa.RecordBatch, schema: pa.Schema, number: int) -> pa.RecordBatch:
    """A batch in schema's columns and types (a column the output lacks is null) plus its source number."""
    arrays = []
    for field in schema:
        if field.name in batch.schema.names:
            arrays.append(batch.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(batch.num_rows, field.type))
    arrays.append(pa.array([number] * batch.num_rows, pa.int32()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema.append(pa.field("source", pa.int32())))


def _dataset(text: str, options):
    """The earlier output at text as a pyarrow dataset (its format from its name, or a Parquet directory)."""
    import pyarrow.dataset as ds
    import pyarrow.json as pj

    location = parse_location(text, options)
    info = location.info()
    if info.type.name == "NotFound":
        raise InputError(f"--reuse {location.uri!r}: no such file or directory")
    if info.type.name == "Directory":
        return ds.dataset(location.path, filesystem=location.fs, format="parquet", partitioning="hive")
    try:
        fmt = output_format(location.path)
    except InputError:
        raise InputError(
            f"--reuse {location.uri!r}: not a score-batch output (a .parquet or .jsonl file, or a directory)"
        ) from None
    if fmt == "parquet":
        return _parquet(location)
    parse = pj.ParseOptions(explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="ignore")
    return ds.dataset(location.path, filesystem=location.fs, format=ds.JsonFileFormat(parse_options=parse))


def _parquet(location: Location):
    """One Parquet file as a dataset; InputError when it is not Parquet."""
    import pyarrow.dataset as ds

    try:
        return ds.dataset(location.path, filesystem=location.fs, format="parquet")
    except (pa.ArrowInvalid, OSError) as error:
        raise InputError(f"--reuse {location.uri!r}: not a readable Parquet file ({error})") from None


# JSONL outputs are read with these types (JSON numbers are doubles; a float32 written as JSON reads back to
# the same float32): inferring them per block would type a block of failed rows as null.
_JSON_SCHEMA = pa.schema(
    [
        pa.field(SCORE_KEY, pa.string()),
        pa.field("score", pa.float64()),
        pa.field("scores", pa.list_(pa.float64())),
        pa.field("chunks", pa.int64()),
        pa.field("pooled_hidden_state", pa.list_(pa.float64())),
    ]
)
