"""The nested layout (`query` + `items` list column) read as columns through the Arrow list offsets
(io_formats/window.columnar_window, columnar.nested_items) gives the rows, ids, kept values and errors of the
record path (rows.to_row per record) over Parquet and JSONL: null, empty and short lists, item ids lists,
batches of other types cast (or, where a cast would change a value, falling back), hive values, a Ray batch's window_table read back."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats import readers, window
from score_batch.io_formats.readers import column_types, input_mapping, open_source, reader
from score_batch.io_formats.rows import to_row
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.io_formats.window import window_table
from tests.test_columnar_reader import as_rows, record_path_rows, window_rows

KEEP = ColumnOverrides(keep_columns=("n", "tags"))


def nested_row(rng: random.Random, k: int, float_ids: bool = False) -> dict:
    """One nested row: mostly clean, some with a null, empty or short list, a null item, a null query."""
    items = [f"item {k} {j}" for j in range(rng.choice([1, 2, 3, 5]))]
    ids = [(k * 10 + j) * (1.5 if float_ids else 1) for j in range(len(items))]
    kind = rng.random()
    if kind < 0.05:
        items = None
    elif kind < 0.1:
        items = []
    elif kind < 0.15:
        items[-1] = None
    elif kind < 0.2:
        ids = ids[:-1]  # one id short
    elif kind < 0.22:
        ids = [*ids, ids[0]]  # one too many
    elif kind < 0.24:
        ids = None
    elif kind < 0.26:
        ids[0] = None
    query = None if rng.random() < 0.08 else rng.choice(["q1", "q2", "q ü", ""])
    return {
        "query_id": rng.choice([1, 2, None]),
        "query": query,
        "items": items,
        "item_ids": ids,
        "n": rng.choice([1.5, None]),
        "tags": rng.choice([["a"], [], None]),
    }


def hostile_nested_lines(rng: random.Random, count: int, unread: bool) -> list[str]:
    """Nested JSONL lines, and what makes a block go line by line: items that are not a list, a number or
    token ids among the items, an object, a key given twice; unread: bad JSON, a line that is not an object
    (then every block goes line by line: JsonlReader.all_objects)."""
    lines = []
    for k in range(count):
        row, kind = nested_row(rng, k), rng.random()
        if kind < 0.01:
            row["items"] = "one text"
        elif kind < 0.02:
            row["items"] = ["a", 5]
        elif kind < 0.03:
            row["items"] = [[1, 2], [3]]
        elif kind < 0.04:
            row["items"] = {"a": "b"}
        elif kind < 0.05:
            row["query"] = 7
        elif kind < 0.055:
            row["item_ids"] = [-0] * len(row["items"] or [])
        text = json.dumps(row)
        if kind > 0.995:
            text = text[:-1] + ', "query": "again"}'
        elif kind > 0.99 and unread:
            text = text[:-4]
        elif kind > 0.985 and unread:
            text = "[1, 2]"
        lines.append(text)
    return lines


def counted(monkeypatch, name: str) -> list[bool]:
    """Patch readers.NAME to note whether each call read its batch as columns (a window) or not (None)."""
    calls: list[bool] = []
    original = getattr(readers, name)
    monkeypatch.setattr(readers, name, lambda *a: (lambda w: calls.append(w is not None) or w)(original(*a)))
    return calls


@pytest.mark.parametrize("seed", range(4))
def test_nested_jsonl_blocks_equal_the_line_by_line_rows(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    monkeypatch.setattr(readers, "BATCH_ROWS", rng.choice([5, 64]))
    path = tmp_path / "in.jsonl"
    lines = hostile_nested_lines(rng, rng.choice([150, 400]), unread=seed == 3)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    source = open_source(str(path))
    expected = record_path_rows(source, KEEP)
    calls = counted(monkeypatch, "json_window")
    for size in (1, 7, 1000):
        assert window_rows(source, KEEP, size) == expected
    # the premise: blocks read as columns, and blocks that fell back (seed 3: none, a line is not an object)
    assert calls == [] if seed == 3 else any(calls) and not all(calls)
    assert {row.error for row in expected} >= {
        "column 'items' is null",
        "column 'items' is an empty list (no items to score)",
        "column 'item_ids' must be a list as long as 'items'",
        "column 'query' is null",
    }


def test_nested_jsonl_without_item_ids_gives_positions(tmp_path):
    rng = random.Random(3)
    rows = [{k: v for k, v in nested_row(rng, k).items() if k != "item_ids"} for k in range(60)]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    source = open_source(str(path))
    mapping = input_mapping(source, KEEP)
    lines = path.read_bytes().splitlines()
    got = window.json_window(0, lines, {}, mapping, column_types(source, mapping))
    assert got is not None and isinstance(got.item_ids, pa.Array)  # columns: no Python object per item
    assert as_rows(got) == record_path_rows(source, KEEP)
    assert as_rows(got)[0].item_ids == list(range(len(rows[0]["items"])))


def parquet_record_rows(source, overrides):
    """The record path over Parquet: each record with its file's partition values through to_row."""
    mapping = input_mapping(source, overrides)
    types = column_types(source, mapping)
    rows = []
    for file, batch in reader(source).batches(mapping.read_columns()):
        for record in batch.to_pylist():
            rows.append(to_row(len(rows), file.with_partitions(record), mapping, types))
    return rows


@pytest.mark.parametrize("seed", range(3))
def test_nested_parquet_batches_equal_the_record_rows(tmp_path, monkeypatch, seed):
    """Files of int64 and float64 item ids (one type over the input: float64, the int64 files' ids cast as
    to_row converts them; seed 2: an id float64 cannot hold exactly, whose batch falls back), large lists, hive
    values, and batches that slice row groups."""
    rng = random.Random(seed)
    for part, float_ids in (("a", False), ("b", True), ("c", seed == 0)):
        rows = [nested_row(rng, k, float_ids) for k in range(rng.randint(1, 400))]
        if part == "a" and seed == 2:
            rows[0] = {**rows[0], "items": ["x"], "item_ids": [2**53 + 1]}
        table = pa.Table.from_pylist(rows)
        if part == "c":
            large = pa.large_list(pa.string())
            table = table.set_column(2, "items", table["items"].cast(large))
        (tmp_path / f"day={part}").mkdir()
        pq.write_table(table, tmp_path / f"day={part}" / "0.parquet", row_group_size=rng.choice([30, 1000]))
    source = open_source(str(tmp_path))
    overrides = ColumnOverrides(keep_columns=("n", "tags", "day"))
    expected = parquet_record_rows(source, overrides)
    calls = counted(monkeypatch, "columnar_window")
    for size in (3, 100, 5000):
        assert window_rows(source, overrides, size) == expected
    assert all(calls) if seed != 2 else any(calls) and not all(calls)


def test_nested_items_not_utf8_are_that_rows_error(tmp_path, monkeypatch):
    """Bytes that are not UTF-8 in an item (Parquet's reader does not check): the batch goes record by record,
    that row's error names the column, the others are read as before."""
    rows = [{"query": "q", "items": [f"i{k}", f"j{k}"]} for k in range(6)]
    table = pa.Table.from_pylist(rows)
    raw = pa.array([b"i0", b"j0", b"\xff", b"j1", *[b"x"] * 8], pa.binary()).view(pa.string())
    items = pa.ListArray.from_arrays(table["items"].combine_chunks().offsets, raw)
    pq.write_table(table.set_column(1, "items", items), tmp_path / "in.parquet")
    source = open_source(str(tmp_path / "in.parquet"))
    calls = counted(monkeypatch, "columnar_window")
    got = window_rows(source, ColumnOverrides(), 10)
    assert calls == [False]
    assert [row.error for row in got] == [
        None,
        "column 'items' holds bytes that are not valid UTF-8",
        *[None] * 4,
    ]


def test_nested_ray_table_reads_back_as_the_window(tmp_path):
    """A nested window as window_table (what a Ray run moves) and back through readers.table_window: the same
    rows, ids and errors (the table's lists read as columns too)."""
    rng = random.Random(5)
    table = pa.Table.from_pylist([nested_row(rng, k) for k in range(120)])
    pq.write_table(table, tmp_path / "in.parquet")
    source = open_source(str(tmp_path / "in.parquet"))
    mapping = input_mapping(source, KEEP)
    types = column_types(source, mapping)
    (read,) = readers.read_windows(source, KEEP, 1000)[1]
    moved = window_table(read, mapping, types, (pa.string(), pa.string()))
    back = readers.table_window(moved.slice(0, 120), mapping, types)
    assert as_rows(back) == as_rows(read) == parquet_record_rows(source, KEEP)
