"""Hive partition types (io_formats/listing.type_partitions) against DuckDB's hive_types_autocast and polars'
hive typing of the same directories: the same types where docs/formats.md says they agree, and each listed
difference as the table there gives it."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.readers import open_source

DATE, STAMP, INT, TEXT = pa.date32(), pa.timestamp("us"), pa.int64(), pa.string()
UTC = pl.Datetime("us", "UTC")
AGREE = [  # (values, score-batch, DuckDB, polars)
    (("2026-11-22", "0001-01-01"), DATE, "DATE", pl.Date),
    (
        ("2026-11-22 10:30:00", "2026-11-22T10:30", "2026-11-22 10:30:00.123456"),
        STAMP,
        "TIMESTAMP",
        pl.Datetime,
    ),
    (("7", "-3", str(2**63 - 1), "20261122"), INT, "BIGINT", pl.Int64),
    (("7", "__HIVE_DEFAULT_PARTITION__"), INT, "BIGINT", pl.Int64),
    (("abc", "7"), TEXT, "VARCHAR", pl.String),
    (("2026-11-22", "2026-11-22 10:30"), TEXT, "VARCHAR", pl.String),
    (("2026-11-22", "20261122"), TEXT, "VARCHAR", pl.String),
    (("2026-02-30", "2026-11", "10:30x"), TEXT, "VARCHAR", pl.String),
]
DIFFER = [  # docs/formats.md, Hive partition values: where the libraries type otherwise
    (("2026-1-2",), TEXT, "DATE", pl.Date),
    (("1-1-1",), TEXT, "TIMESTAMP", pl.Date),
    (("2026-11-22 10:30:00.1234567",), TEXT, "TIMESTAMP", pl.Datetime),
    (("2026-11-22 10:30:00+02",), TEXT, "TIMESTAMP", UTC),
    (("2026-11-22T10:30:00Z",), TEXT, "TIMESTAMP", UTC),
    (("2026-11-22 24:00:00",), TEXT, "TIMESTAMP", pl.String),
    (("99999-01-01",), TEXT, "DATE", pl.String),
    (("epoch",), TEXT, "DATE", pl.String),
    (("007",), INT, "VARCHAR", pl.Int64),
    (("+5",), INT, "VARCHAR", pl.String),
    ((" 7",), TEXT, "BIGINT", pl.String),
    (("0x10",), TEXT, "BIGINT", pl.String),
    (("1.5",), TEXT, "VARCHAR", pl.Float64),
    (("1e3",), TEXT, "VARCHAR", pl.Float64),
    (("true",), TEXT, "VARCHAR", pl.Boolean),
    ((str(2**63),), TEXT, "VARCHAR", pl.Int128),
    (("7", "NULL"), TEXT, "BIGINT", pl.String),
    (("2026-11-22%2010%3A30%3A00",), STAMP, "VARCHAR", pl.Datetime),
]


@pytest.mark.parametrize(("values", "ours", "duck", "polars"), AGREE + DIFFER)
def test_hive_types_beside_duckdb_and_polars(tmp_path, values, ours, duck, polars):
    for value in values:
        (tmp_path / f"key={value}").mkdir()
        pq.write_table(pa.table({"x": [1]}), tmp_path / f"key={value}" / "f.parquet")
    assert dict(open_source(str(tmp_path)).partition_types)["key"] == ours
    files = f"{tmp_path}/*/*.parquet"
    described = duckdb.sql(f"DESCRIBE SELECT * FROM read_parquet('{files}', hive_partitioning = true)")
    assert dict(row[:2] for row in described.fetchall())["key"] == duck
    assert pl.scan_parquet(files, hive_partitioning=True).collect_schema()["key"] == polars
    if (ours == TEXT) != (duck == "VARCHAR") or (ours == TEXT) != (polars == pl.String):
        assert (values, ours, duck, polars) in DIFFER  # every disagreement is one the docs list


def test_non_ascii_digits_are_an_integer_here_and_text_to_duckdb(tmp_path):
    """'１２' (full-width digits): int64 here (Python's int), VARCHAR to DuckDB; polars refuses the read."""
    (tmp_path / "key=１２").mkdir()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "key=１２" / "f.parquet")
    assert dict(open_source(str(tmp_path)).partition_types)["key"] == INT
    described = duckdb.sql(
        f"DESCRIBE SELECT * FROM read_parquet('{tmp_path}/*/*.parquet', hive_partitioning = true)"
    )
    assert dict(row[:2] for row in described.fetchall())["key"] == "VARCHAR"
