"""The columnar readers (io_formats/window: Parquet batches and JSONL blocks read column by column) give the
rows, values and errors of the record-by-record path (rows.to_row over each record), on hostile inputs."""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats import jsonl, readers
from score_batch.io_formats.cuts import LONGEST_WINDOW
from score_batch.io_formats.jsonl import BOM, parse_line
from score_batch.io_formats.readers import (
    column_types,
    input_mapping,
    open_source,
    read_windows,
    reader,
)
from score_batch.io_formats.rows import InputRow, to_row
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.io_formats.window import Window, concat, from_rows, json_window

KEEP = ColumnOverrides(keep_columns=("n", "tags", "meta"))
KEEP_N = ColumnOverrides(keep_columns=("n",))


def line_records(source):
    """(line, record) per non-blank line of a JSONL input, read line by line here (not by the reader's blocks)."""
    for file in source.files or [None]:
        data = (
            readers.reader(source).spool_path().read_bytes()
            if file is None
            else Path(file.location.path).read_bytes()
        )
        data = gzip.decompress(data) if str(file).endswith(".gz") else data
        pieces = data.split(b"\n")
        for number, raw in enumerate([piece + b"\n" for piece in pieces[:-1]] + pieces[-1:], start=1):
            raw = raw.removeprefix(BOM) if number == 1 else raw
            if raw.strip():
                yield parse_line(raw, f"{number} of {file}" if len(source.files) > 1 else str(number))


def record_path_rows(source, overrides):
    """What the record-by-record path gives for every record of the input."""
    mapping = input_mapping(source, overrides)
    types = column_types(source, mapping)
    rows = [to_row(index, record, mapping, types) for index, record in enumerate(line_records(source))]
    for row in rows:  # an unreadable line has no values: its kept columns are written null
        row.kept = {name: row.kept.get(name) for name in mapping.keep}
    return rows


def as_rows(window: Window) -> list[InputRow]:
    """A window's rows as the record path's InputRows (ids and kept values as Python values)."""

    def at(values, k: int):
        return values[k].as_py() if isinstance(values, (pa.Array, pa.ChunkedArray)) else values[k]

    rows = []
    for r in range(window.num_rows):
        start, stop = int(window.offsets[r]), int(window.offsets[r + 1])
        query_id = None if window.query_ids is None else at(window.query_ids, r)
        ids = [at(window.item_ids, k) for k in range(start, stop)]
        kept = {name: at(values, r) for name, values in window.kept.items()}
        index, items = int(window.index[r]), window.items[start:stop]
        rows.append(InputRow(index, window.query(r), items, query_id, ids, kept, window.errors[r]))
    return rows


def window_rows(source, overrides, window_rows):
    _, windows = read_windows(source, overrides, window_rows)
    windows = list(windows)
    assert_cut_at_groups(windows, window_rows)
    return [row for window in windows for row in as_rows(window)]


def assert_cut_at_groups(windows: list[Window], window_rows: int) -> None:
    """Windows as io_formats/cuts cuts them, checked on their rows' Python values: no query group (consecutive
    readable rows of one query id and query) is split; a window holds at most window_rows rows unless it is one
    group; each takes as many whole groups as fit (the next window's first group would not)."""
    keyed = [
        [(repr(r.query_id), repr(r.query)) if r.error is None else None for r in as_rows(w)] for w in windows
    ]
    for earlier, later in zip(keyed, keyed[1:]):
        if len(earlier) >= LONGEST_WINDOW * window_rows:  # a group that long is cut there (io_formats/cuts)
            continue
        last = next((key for key in reversed(earlier) if key is not None), None)
        first = next((key for key in later if key is not None), None)
        assert last is None or last != first, "a query group is split between two windows"
    for k, keys in enumerate(keyed):
        if len(keys) > window_rows:
            assert len({key for key in keys if key is not None}) == 1, "an over-long window of several groups"
        elif k + 1 < len(keyed):
            following = keyed[k + 1]
            first = next((key for key in following if key is not None), None)
            group = next(
                (n for n, key in enumerate(following) if key is not None and key != first), len(following)
            )
            assert len(keys) + group > window_rows, "the next window's first group fits in this one"


def hostile_lines(rng: random.Random, count: int) -> list[str]:
    """JSONL lines: mostly clean rows, some with nulls, numbers where text goes, token ids, lone surrogates,
    duplicate keys, nested kept values, bad JSON, non-objects and blank lines."""
    lines = []
    for k in range(count):
        query = rng.choice(["q1", "q2", "q ü", "", "q1"])
        row = {"query_id": rng.choice([1, 2, 3.5, None]), "query": query, "item": f"item {k}", "item_id": k}
        row["n"] = rng.choice([1, 2.5, None])
        row["tags"] = rng.choice([["a"], [], None, ["b", "c"]])
        row["meta"] = rng.choice([{"x": 1}, {"x": None}, None])
        kind = rng.random()
        if kind < 0.03:
            row["item"] = None
        elif kind < 0.05:
            row["query"] = None
        elif kind < 0.07:
            row["item"] = [1, 2]
        elif kind < 0.08:
            row["query"] = 5
        elif kind < 0.09:
            del row["item"]
        text = json.dumps(row, ensure_ascii=rng.random() < 0.5)
        if kind > 0.99:
            text = text.replace('"item 1', '"\\ud800 1')  # a lone surrogate escape
        elif kind > 0.98:
            text = text[:-1] + ', "query": "again"}'  # a key given twice
        elif kind > 0.97:
            text = text[:-5]  # cut: not valid JSON
        elif kind > 0.965:
            text = "[1, 2]"
        lines.append(text)
        if rng.random() < 0.02:
            lines.append("   ")
    return lines


@pytest.mark.parametrize("seed", range(6))
def test_jsonl_blocks_equal_the_line_by_line_rows(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(hostile_lines(rng, rng.choice([30, 700, 2500]))) + "\n", encoding="utf-8")
    source = open_source(str(path))
    expected = record_path_rows(source, KEEP)
    for size in (1, 7, 1000):
        assert window_rows(source, KEEP, size) == expected


def hostile_bytes(rng: random.Random, count: int) -> bytes:
    """hostile_lines as bytes, with what a block parser could take differently from a line parser: bytes that are
    not UTF-8 (in a column nobody reads, in an item), a lone surrogate escape nobody reads, indented lines, two objects on one line, CRLF, form feeds,
    surrogate pairs, -Infinity, byte order marks (one or two), a last line with or without its newline."""
    lines = []
    for line in (text.encode() for text in hostile_lines(rng, count)):
        kind = rng.random()
        if kind < 0.01:
            line = line[:-1] + b', "junk": "\xff"}'
        elif kind < 0.02:
            line = line.replace(b'"item ', b'"it\xc3em ', 1)
        elif kind < 0.03:
            line = b"  " + line
        elif kind < 0.04:
            line = line + b" " + line
        elif kind < 0.06:
            line = line + b"\r"
        elif kind < 0.065:
            line = rng.choice([b"\x0c", b" \x0b ", b"\r", b""])
        elif kind < 0.08:
            line = line.replace(b'"item ', b'"\\ud83d\\ude00 ', 1)
        elif kind < 0.085:
            line = line.replace(b'"n": 1,', b'"n": -Infinity,', 1)
        elif kind < 0.09:
            line = line[:-1] + b', "junk": "\\udfff"}'  # a lone surrogate in a column nobody reads
        lines.append(line)
    data = b"\n".join(lines) + rng.choice([b"", b"\n"])
    return rng.choice([b"", BOM, BOM + BOM]) + data


@pytest.mark.parametrize("seed", range(8))
def test_jsonl_hostile_bytes_give_the_line_by_line_rows(tmp_path, monkeypatch, seed):
    """Blocks of every size (from one line), read in chunks of every size, over plain and gzip files (lines
    named 'N of FILE' when there are several) and stdin, give the rows, errors and messages of lines read one by
    one here."""
    rng = random.Random(seed)
    monkeypatch.setattr(readers, "BATCH_ROWS", rng.choice([1, 3, 1024]))
    monkeypatch.setattr(jsonl, "READ_CHUNK", rng.choice([3, 1000, 1 << 20]))
    count = rng.choice([40, 900])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(hostile_bytes(rng, count))
    (tmp_path / "in" / "b.jsonl.gz").write_bytes(gzip.compress(hostile_bytes(rng, count)))
    for path in (tmp_path / "in", tmp_path / "in" / "a.jsonl", "-"):
        if path == "-":
            stdin = io.TextIOWrapper(io.BytesIO((tmp_path / "in" / "a.jsonl").read_bytes()))
            monkeypatch.setattr("sys.stdin", stdin)
        source = open_source(str(path))
        expected = record_path_rows(source, KEEP)
        named = any(re.match(r"line \d+ of ", row.error or "") for row in expected)
        assert named == (path == tmp_path / "in")
        for size in (1, 333, 5000):
            assert window_rows(source, KEEP, size) == expected


def test_a_line_not_utf8_among_clean_lines_is_that_rows_error(tmp_path):
    """pyarrow checks only the columns it reads: bytes that are not UTF-8 in another key still make the line
    unreadable, as line by line (the block parser once scored that row)."""
    clean = [json.dumps({"query": "q", "item": f"i{k}", "n": k}).encode() for k in range(4)]
    bad = b'{"query": "q", "item": "i", "n": 1, "junk": "\xff"}'
    (tmp_path / "in.jsonl").write_bytes(b"\n".join([*clean, bad, *clean]))
    source = open_source(str(tmp_path / "in.jsonl"))
    rows = window_rows(source, KEEP_N, 100)
    assert rows == record_path_rows(source, KEEP_N)
    assert [row.error for row in rows][3:6] == [
        None,
        "line 5: not valid UTF-8 (byte 0xff at byte 46 of the line)",
        None,
    ]


def test_clean_jsonl_blocks_take_the_columnar_path(tmp_path):
    lines = [json.dumps({"query": "q", "item": f"i{k}", "n": k, "tags": ["a"]}).encode() for k in range(5)]
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines))
    source = open_source(str(tmp_path / "in.jsonl"))
    overrides = ColumnOverrides(keep_columns=("n", "tags"))
    mapping = input_mapping(source, overrides)
    types = column_types(source, mapping)
    window = json_window(0, lines, {}, mapping, types)
    assert window is not None and as_rows(window) == record_path_rows(source, overrides)
    assert isinstance(window.kept["n"], pa.Array)  # columns stay Arrow: no Python object per row
    assert json_window(0, [*lines, b'{"query": "q", "item": "i", "item": "j"}'], {}, mapping, types) is None


@pytest.mark.parametrize("seed", range(4))
def test_parquet_batches_equal_the_record_rows_across_files(tmp_path, seed):
    """Files whose id types differ (int64 and float64 unify to float64), nulls mid-batch, a file of token ids,
    strings that are not UTF-8 and hive partition values."""
    rng = random.Random(seed)
    for part, dtype in (("a", pa.int64()), ("b", pa.float64()), ("c", pa.int64())):
        n = rng.randint(1, 3000)
        queries = [rng.choice(["q1", "q2", None, "q ü"]) for _ in range(n)]
        items = [None if rng.random() < 0.02 else f"item {k}" for k in range(n)]
        table = pa.table(
            {
                "query_id": pa.array([rng.choice([1, 2, None]) for _ in range(n)], dtype),
                "query": queries,
                "item": items,
                "n": pa.array([rng.choice([1.5, None]) for _ in range(n)]),
            }
        )
        if part == "c" and seed % 2:  # bytes that are not UTF-8 in a string column
            raw = pa.array([b"ok", b"\xff\xfe"] * (n // 2) + [b"ok"] * (n % 2), pa.binary())
            table = table.set_column(2, "item", raw.view(pa.string()))
        (tmp_path / f"day={part}").mkdir()
        pq.write_table(table, tmp_path / f"day={part}" / "0.parquet", row_group_size=rng.choice([100, 1024]))
    source = open_source(str(tmp_path))
    overrides = ColumnOverrides(keep_columns=("n", "day"))
    expected = record_path_rows_parquet(source, overrides)
    for size in (3, 1000, 5000):
        assert window_rows(source, overrides, size) == expected


@pytest.mark.parametrize("dictionary", [True, False])
def test_parquet_query_dictionaries_give_each_batch_its_own_queries(tmp_path, dictionary):
    """A query column stored with a dictionary per row group that falls back to plain pages, or stored plain
    (either read as a dictionary holding queries of other batches), with nulls and a value that is not UTF-8:
    the record path's rows, and each batch's distinct queries are its own rows' in order of first appearance."""
    rng = random.Random(11)
    texts = [f"query {g} " + "word " * rng.randint(0, 60) for g in range(80)]
    queries = [
        None if rng.random() < 0.02 else texts[min(k // 40, 79) - rng.choice([0, 0, 0, 3])]
        for k in range(3000)
    ]
    raw = pa.array([None if q is None else q.encode() for q in queries], pa.binary())
    raw = pa.concat_arrays([raw[:2500], pa.array([b"\xff bad"], pa.binary()), raw[2501:]])
    table = pa.table(
        {
            "query_id": pa.array([k // 40 for k in range(3000)]),
            "query": raw.view(pa.string()),
            "item": [f"item {k}" for k in range(3000)],
            "n": pa.array([rng.choice([1.5, None]) for _ in range(3000)]),
        }
    )
    path = tmp_path / "in.parquet"
    pq.write_table(
        table, path, row_group_size=1200, use_dictionary=dictionary, dictionary_pagesize_limit=2000
    )
    source = open_source(str(path))
    overrides = ColumnOverrides(keep_columns=("n",))
    mapping = input_mapping(source, overrides)
    types = column_types(source, mapping)
    index, larger = 0, False
    for batch in pq.ParquetFile(path, read_dictionary=["query"]).iter_batches(batch_size=500):
        window = readers.batch_window(index, batch, {}, mapping, types)
        own = from_rows(as_rows(window), True, ("n",))
        assert window.query_values == own.query_values
        assert np.array_equal(window.query_codes, own.query_codes)
        larger = larger or len(batch.column("query").dictionary) > len(own.query_values)
        index += batch.num_rows
    assert larger  # the premise: a batch dictionary holding queries of other batches (plain pages too)
    expected = record_path_rows_parquet(source, overrides)
    for size in (7, 1000, 2048):
        assert window_rows(source, overrides, size) == expected


def record_path_rows_parquet(source, overrides):
    """The record path over Parquet: each record with its file's partition values through to_row; a value
    that is not UTF-8 read as null, and the row's error names its column."""
    mapping = input_mapping(source, overrides)
    types = column_types(source, mapping)
    rows = []
    for file, batch in reader(source).batches(["query_id", "query", "item", "n"]):
        for k in range(batch.num_rows):
            record, bad = {}, None
            for name in batch.schema.names:
                try:
                    record[name] = batch.column(name)[k].as_py()
                except UnicodeDecodeError:
                    record[name], bad = None, bad or name
            row = to_row(len(rows), file.with_partitions(record), mapping, types)
            if bad is not None:
                row.error = f"column {bad!r} holds bytes that are not valid UTF-8"
            rows.append(row)
    return rows


def test_windows_concatenate_and_slice_back_to_the_same_rows():
    rows = [InputRow(k, f"q{k % 3}", [f"i{k}"], k % 2, [k], {"n": k}) for k in range(10)]
    whole = from_rows(rows, True, ("n",))
    parts = [whole.slice(0, 4), whole.slice(4, 5), whole.slice(5, 10)]
    joined = concat(parts)
    assert as_rows(joined) == rows
    assert np.array_equal(joined.query_codes, whole.query_codes)  # codes in order of first appearance


def test_window_digest_hashes_the_rows_own_queries(tmp_path, monkeypatch):
    """A row group's batch holds all its queries and its windows are slices of it: each window's digest hashes
    the queries of its own rows only (once each), and equals the record path's window of the same rows."""
    from score_batch.job.checkpoint import input_digest as digest_module

    rng = random.Random(5)
    queries = [rng.choice([f"query {k}" for k in range(40)] + [None]) for _ in range(3000)]
    table = pa.table({"query": queries, "item": [f"item {k}" for k in range(3000)]})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=3000)
    _, windows = read_windows(open_source(str(tmp_path / "in.parquet")), ColumnOverrides(), 50)
    hashed = []
    digest = digest_module.query_digest
    monkeypatch.setattr(digest_module, "query_digest", lambda query: hashed.append(query) or digest(query))
    for window in windows:
        rows = as_rows(window)
        hashed.clear()
        got = digest_module.InputDigest().add(window)
        assert sorted(hashed) == sorted({row.query for row in rows if row.query is not None})
        assert got == digest_module.InputDigest().add(from_rows(rows, False, ()))


def test_blocks_are_parsed_by_pyarrow_only_where_the_first_pass_read_every_line(tmp_path, monkeypatch):
    """A clean input's blocks go to pyarrow; with one line Python's json refuses anywhere, none does (such a line
    may be one pyarrow reads); the rows equal the line by line rows either way, -0 read as Python reads it."""
    rows = [{"query": "q", "item": f"i{k}", "n": [-0, 2.5][k % 2]} for k in range(40)]
    lines = [json.dumps(row) for row in rows]
    for bad, blocks in ((None, 1), ('{"query": "q", "item": "x", "n": Inf}', 0)):
        path = tmp_path / f"in-{blocks}.jsonl"
        path.write_text("\n".join(lines + ([bad] if bad else [])) + "\n", encoding="utf-8")
        source = open_source(str(path))
        parsed: list[int] = []
        with monkeypatch.context() as patch:
            patch.setattr(readers, "json_window", lambda *a, seen=parsed: seen.append(1) or json_window(*a))
            got = window_rows(source, KEEP_N, 16)
        assert len(parsed) == blocks
        assert got == record_path_rows(source, KEEP_N)
        assert [math.copysign(1, row.kept["n"]) for row in got[:2]] == [1, 1]  # -0 is Python's 0: 0.0
        assert [unit.lines_read for unit in readers.read_units(source)] == [bool(blocks)]
        fresh = open_source(str(path))  # units listed before anything else read the lines
        assert [unit.lines_read for unit in readers.read_units(fresh)] == [bool(blocks)]
