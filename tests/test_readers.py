"""The reader classes behind io_formats.readers: one per format, chosen in one place, picklable for workers."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from score_batch.io_formats.jsonl import JsonlReader, StdinReader
from score_batch.io_formats.listing import InputFormat
from score_batch.io_formats.parquet import ParquetReader
from score_batch.io_formats.readers import (
    batch_reader,
    input_format,
    open_source,
    read_unit,
    read_units,
    reader,
)
from score_batch.io_formats.schema import ColumnOverrides, resolve_columns

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
        assert [r for _, r in reader(source).records()] == ROWS
        assert reader(source).column_type("n") == pa.int64()
    spool = sources["-"].spool_path()
    sources["-"].close()
    assert not spool.exists()


def test_input_format_is_decided_in_one_place(tmp_path, monkeypatch):
    batch = tmp_path / "requests.jsonl"
    batch.write_text(_lines([REQUEST]))
    table = tmp_path / "rows.jsonl"
    table.write_text(_lines(ROWS))
    assert input_format(open_source(str(batch))) == InputFormat.OPENAI_BATCH
    assert input_format(open_source(str(batch)), "table") == InputFormat.JSONL
    assert input_format(open_source(str(table))) == InputFormat.JSONL
    assert input_format(open_source(str(table)), "openai-batch") == InputFormat.OPENAI_BATCH
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "requests.jsonl").write_text(_lines([REQUEST]))
    assert input_format(open_source(str(folder))) == InputFormat.JSONL  # a batch file is one named file
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbf" + _lines([REQUEST]).encode()))
    )
    stdin = open_source("-")
    assert input_format(stdin) == InputFormat.OPENAI_BATCH  # sniffed on the spool, BOM and all
    assert [r.custom_id for r in batch_reader(stdin).requests()] == ["r"]  # the spool is read, not stdin
    stdin.close()


def test_a_pickled_source_reads_its_units_again(tmp_path):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet", row_group_size=2)
    source = open_source(str(tmp_path / "a.parquet"))
    units = read_units(source)
    assert [(u.row_group, u.first_row) for u in units] == [(0, 0), (1, 2)]
    mapping = resolve_columns(["query", "item", "n"], ColumnOverrides(), source.label)
    copy = pickle.loads(pickle.dumps(units[1]))  # what a Ray worker gets: no cached footers
    assert copy.source._state.reader is None
    assert [row.items for row in read_unit(copy, mapping)] == [["c"]]
    with pytest.raises(Exception, match="stdin"):
        read_units(open_source("-"))
