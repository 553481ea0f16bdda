"""Every id and kept column type a Parquet output takes is written to JSON lines too (a file or stdout):
decimals as their exact text, binary as base64, durations as integers in their unit (docs/formats.md)."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, run_cli
from tests.test_job import many_rows

pytestmark = pytest.mark.slow


def typed_input(path) -> pa.Table:
    """many_rows with UUID ids (fixed_size_binary(16)) and decimal, binary and duration columns."""
    rows = many_rows(4, 3)
    n = len(rows)
    ids = [uuid.UUID(int=i + 1).bytes for i in range(n)]
    table = pa.table(
        {
            "query": [row["query"] for row in rows],
            "item": [row["item"] for row in rows],
            "query_id": pa.array(
                [uuid.UUID(int=1000 + row["query_id"]).bytes for row in rows], pa.binary(16)
            ),
            "item_id": pa.array(ids, pa.binary(16)),
            "price": pa.array([decimal.Decimal(f"{i}.{i:02d}") for i in range(n)], pa.decimal128(12, 2)),
            "blob": pa.array([bytes([i, 255 - i, 0]) for i in range(n)], pa.binary()),
            "wait": pa.array([i * 1500 for i in range(n - 1)] + [None], pa.duration("ms")),
            "when": pa.array([datetime.date(2026, 11, 1 + i) for i in range(n)], pa.date32()),
        }
    )
    pq.write_table(table, path)
    return table


def expected_line(row: dict) -> dict:
    """What the documented JSON forms make of one Parquet output row."""

    def form(value):
        if isinstance(value, decimal.Decimal):
            return str(value)
        if isinstance(value, bytes):
            return base64.b64encode(value).decode()
        if isinstance(value, datetime.timedelta):
            return value // datetime.timedelta(milliseconds=1)
        if isinstance(value, datetime.date):
            return value.isoformat()
        return value

    return {key: form(value) for key, value in row.items()}


def test_decimal_binary_duration_and_uuid_columns_are_written_as_json_lines(qwen3_causal, tmp_path):
    data = tmp_path / "in.parquet"
    typed_input(data)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "price,blob,wait,when", "-q"]
    base += ["--window-rows", "5", "--query-id-col", "query_id", "--item-id-col", "item_id"]
    reference = tmp_path / "o.parquet"
    assert run_cli(*base, "-o", reference).returncode == 0
    want = [expected_line(row) for row in pq.read_table(reference).to_pylist()]
    assert want[0]["price"] == "0.00" and want[1]["blob"] == "Af4A" and want[1]["wait"] == 1500
    for score in ("score", "scores"):  # float32 in Parquet, the same float32 printed in JSON
        for row in want:
            row[score] = json.loads(json.dumps(row[score]))
    out = tmp_path / "o.jsonl"
    ran = run_cli(*base, "-o", out)
    assert ran.returncode == 0, ran.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == want
    assert not (tmp_path / "o.jsonl.parts").exists()
    streamed = run_cli(*base, "-o", "-")
    assert streamed.returncode == 0, streamed.stderr
    assert [json.loads(line) for line in streamed.stdout.splitlines()] == want


def test_a_column_json_lines_cannot_hold_is_refused_before_scoring():
    """Checked in preflight, naming the column (Parquet inputs cannot hold one; an Arrow type can)."""
    from score_batch.io_formats.errors import InputError
    from score_batch.io_formats.schema import ColumnMapping
    from score_batch.job.preflight.contract import check_jsonl_columns

    mapping = ColumnMapping("long", "q", "i", None, None, ("span",))
    types = {"q": pa.string(), "i": pa.string(), "span": pa.month_day_nano_interval()}
    for output in ("o.jsonl", "-", "o.jsonl.gz"):
        with pytest.raises(InputError, match="column 'span' cannot be written to .*month_day_nano_interval"):
            check_jsonl_columns(mapping, types, output)
    check_jsonl_columns(mapping, types, "o.parquet")  # Parquet takes it
    check_jsonl_columns(mapping, {**types, "span": pa.list_(pa.decimal128(5, 1))}, "o.jsonl")


@pytest.mark.parametrize(
    "bad", [{"query": "q", "item": 3.5}, {"query": 3, "item": ""}, {"query": "", "item": True}]
)
def test_a_number_where_text_belongs_is_that_rows_error_and_not_an_empty_value(qwen3_causal, tmp_path, bad):
    data = tmp_path / "in.jsonl"
    rows = [bad, {"query": "q", "item": " fine"}, {"query": "q", "item": ""}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "o.parquet"
    ran = run_cli(data, "--model", qwen3_causal, *LABEL_FLAGS, "-o", out, "--on-error", "record")
    assert ran.returncode == 0, ran.stderr
    errors = pq.read_table(out).column("error").to_pylist()
    assert "must hold text or a list of integer token ids" in errors[0] and errors[1:] == [None, None]
    # only the good rows' empty values are counted: the failed row's are its error's, not empties
    assert "1 of 3 items are empty" in ran.stderr and "empty query" not in ran.stderr
