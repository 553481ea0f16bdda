"""The reader classes behind io_formats.readers: one per format, chosen in one place, picklable for workers."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.jsonl import JsonlReader, StdinReader
from score_batch.io_formats.listing import FileFormat
from score_batch.io_formats.parquet import ParquetReader
from score_batch.io_formats.readers import (
    batch_reader,
    input_format,
    open_source,
    read_unit,
    read_units,
    read_windows,
    reader,
)
from score_batch.io_formats.schema import ColumnOverrides, resolve_columns
from tests.test_cli import LABEL_FLAGS, run_cli
from tests.test_columnar_reader import as_rows, assert_cut_at_groups

ROWS = [
    {"query": "q1", "item": "a", "n": 1},
    {"query": "q1", "item": "b", "n": 2},
    {"query": "q2", "item": "c", "n": 3},
]
REQUEST = {"custom_id": "r", "method": "POST", "url": "/v1/score", "body": {"text_1": "q", "text_2": ["d"]}}


def _lines(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_one_reader_class_per_format(tmp_path, monkeypatch):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(_lines(ROWS).encode()))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(_lines(ROWS).encode())))
    sources = {name: open_source(str(tmp_path / name)) for name in ("a.parquet", "b.jsonl.gz")}
    sources["-"] = open_source("-")
    classes = {name: type(reader(source)) for name, source in sources.items()}
    assert classes == {"a.parquet": ParquetReader, "b.jsonl.gz": JsonlReader, "-": StdinReader}
    for source in sources.values():  # the same rows and types whatever the format
        assert source.total_rows() == 3
        mapping, windows = read_windows(source, ColumnOverrides(keep_columns=("n",)), 2)
        rows = [row for window in windows for row in as_rows(window)]
        assert [{"query": r.query, "item": r.items[0], **r.kept} for r in rows] == ROWS
        assert reader(source).column_type("n") == pa.int64()
    spool = reader(sources["-"]).spool_path()
    sources["-"].close()
    assert not spool.exists()


def test_input_format_is_decided_in_one_place(tmp_path, monkeypatch):
    batch = tmp_path / "requests.jsonl"
    batch.write_text(_lines([REQUEST]))
    table = tmp_path / "rows.jsonl"
    table.write_text(_lines(ROWS))
    assert input_format(open_source(str(batch))) == FileFormat.OPENAI_BATCH
    assert input_format(open_source(str(batch)), "table") == FileFormat.JSONL
    assert input_format(open_source(str(table))) == FileFormat.JSONL
    assert input_format(open_source(str(table)), "openai-batch") == FileFormat.OPENAI_BATCH
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "requests.jsonl").write_text(_lines([REQUEST]))
    assert input_format(open_source(str(folder))) == FileFormat.JSONL  # a batch file is one named file
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbf" + _lines([REQUEST]).encode()))
    )
    stdin = open_source("-")
    assert input_format(stdin) == FileFormat.OPENAI_BATCH  # sniffed on the spool, BOM and all
    assert [r.custom_id for r in batch_reader(stdin).requests()] == ["r"]  # the spool is read, not stdin
    stdin.close()


def test_a_pickled_source_reads_its_units_again(tmp_path):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet", row_group_size=2)
    source = open_source(str(tmp_path / "a.parquet"))
    units = read_units(source)
    assert [(u.row_group, u.first_row) for u in units] == [(0, 0), (1, 2)]
    mapping = resolve_columns(["query", "item", "n"], ColumnOverrides(), source.label)
    copy = pickle.loads(pickle.dumps(units[1]))  # what a Ray worker gets: no cached footers
    assert copy.source._state == {}
    assert [row.items for row in as_rows(read_unit(copy, mapping))] == [["c"]]
    with pytest.raises(Exception, match="stdin"):
        read_units(open_source("-"))


@pytest.mark.parametrize("window_rows", [1, 2, 5, 1000])
def test_parquet_rows_read_column_by_column_equal_the_record_path(tmp_path, window_rows):
    """Parquet's long layout is validated column by column (rows.long_rows); every row, error and value is
    what the per-record path (rows.to_row) gives, across files whose types differ and hive partitions."""
    from score_batch.io_formats.readers import column_types, input_mapping, read_windows
    from score_batch.io_formats.rows import to_row

    first = pa.table(
        {
            "query": ["q1", None, "q2", "q2", "日本"],
            "item": ["a", "b", None, "", "é"],
            "query_id": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "item_id": ["x", None, "z", "w", "v"],
            "price": pa.array([1.5, None, 2.0, 3.0, 4.0]),
            "tags": [["a"], [], None, ["b", "c"], ["d"]],
        }
    )
    second = pa.table(  # ids as floats here: the input's query_id is float64, to_row's conversion applies
        {
            "query": ["q3", "q3"],
            "item": ["c", "d"],
            "query_id": pa.array([6.0, 7.5]),
            "item_id": ["y", "u"],
            "price": pa.array([None, 9.0]),
            "tags": [None, ["e"]],
        }
    )
    for part, table in (("a", first), ("b", second)):
        (tmp_path / f"day={part}").mkdir()
        pq.write_table(table, tmp_path / f"day={part}" / "0.parquet")
    source = open_source(str(tmp_path))
    mapping = input_mapping(source, ColumnOverrides(keep_columns=("price", "tags", "day")))
    types = column_types(source, mapping)
    records = [{**r, "day": part} for part, table in (("a", first), ("b", second)) for r in table.to_pylist()]
    expected = [to_row(i, record, mapping, types) for i, record in enumerate(records)]
    _, windows = read_windows(source, ColumnOverrides(keep_columns=("price", "tags", "day")), window_rows)
    windows = list(windows)
    assert_cut_at_groups(windows, window_rows)
    assert [row for window in windows for row in as_rows(window)] == expected
    errors = [None, "column 'query' is null", "column 'item' is null", None, None, None, None]
    assert [row.error for row in expected] == errors
    assert [row.query_id for row in expected] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.5]  # floats throughout
    assert [row.kept["day"] for row in expected] == ["a"] * 5 + ["b"] * 2


def test_token_id_parquet_rows_take_the_record_path(tmp_path):
    from score_batch.io_formats.readers import read_windows

    table = pa.table({"query": [[1, 2], [-3]], "item": [[3], [4]]})
    pq.write_table(table, tmp_path / "t.parquet")
    _, windows = read_windows(open_source(str(tmp_path / "t.parquet")), ColumnOverrides(), 10)
    rows = as_rows(next(windows))
    assert rows[0].query == [1, 2] and rows[0].error is None
    assert rows[1].error == "column 'query' holds a token id outside 0..2^63-1"


@pytest.mark.parametrize("given", ["directory", "glob"])
def test_a_file_name_that_is_not_utf8_exits_2_naming_it(qwen3_causal, tmp_path, given):
    """A directory listing with a name that is not UTF-8 (a Latin-1 partition value of an old export):
    one error line naming the path as its bytes read, not pyarrow's UnicodeDecodeError."""
    root = tmp_path / "in"
    bad = os.fsencode(root) + b"/split=caf\xe9"
    os.makedirs(bad)
    with open(bad + b"/a.parquet", "wb") as handle:
        pq.write_table(pa.table({"query": ["q one"], "item": [" to"]}), handle)
    source = root if given == "directory" else f"{root}/**/*.parquet"
    result = run_cli(source, "-o", tmp_path / "out.parquet", "--model", qwen3_causal, *LABEL_FLAGS)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("score-batch: error:")]
    assert "split=caf\\xe9" in line and "not valid UTF-8" in line


@pytest.mark.parametrize("role", ["input", "output"])
def test_a_path_argument_that_is_not_utf8_exits_2_naming_it(qwen3_causal, tmp_path, role):
    """A path given with bytes that are not UTF-8 (Python's argv holds them as lone surrogates, which pyarrow
    cannot encode): one error line, the bytes escaped, no traceback."""
    good = tmp_path / "in.parquet"
    pq.write_table(pa.table({"query": ["q one"], "item": [" to"]}), good)
    bad = os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9.parquet")
    if role == "input":
        with open(os.fsencode(bad), "wb") as handle:
            handle.write(good.read_bytes())
    source, out = (bad, tmp_path / "out.parquet") if role == "input" else (good, bad)
    result = run_cli(source, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("score-batch: error:")]
    assert "caf\\xe9.parquet" in line and "not valid UTF-8" in line


def test_a_file_name_that_is_not_utf8_beside_the_output_is_left_alone(qwen3_causal, tmp_path):
    """The output's directory is listed for leftovers of an interrupted run: another's file there whose name
    is not UTF-8 is not one of them (before, every run there exited 1 with UnicodeDecodeError)."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"query": ["q one"], "item": [" to"]}), source)
    stranger = os.fsencode(tmp_path) + b"/caf\xe9.txt"
    with open(stranger, "wb") as handle:
        handle.write(b"not ours")
    leftover = tmp_path / ".out.parquet.tmp-0123"  # an interrupted run's: still removed
    leftover.write_bytes(b"")
    result = run_cli(source, "-o", tmp_path / "out.parquet", "--model", qwen3_causal, *LABEL_FLAGS)
    assert result.returncode == 0, result.stderr
    assert pq.read_table(tmp_path / "out.parquet").num_rows == 1
    assert os.path.exists(stranger) and not leftover.exists()
