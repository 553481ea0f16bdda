"""Windows cut between query groups (io_formats/cuts): no group split, at most --window-rows rows of whole
groups, an over-long group a window of its own (cut past LONGEST_WINDOW windows' rows); the same windows from
Parquet and JSONL, long and nested layouts, and the input digest of the whole input unchanged."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.cuts import LONGEST_WINDOW
from score_batch.io_formats.readers import open_source, read_windows
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.checkpoint.input_digest import InputDigest
from tests.test_columnar_reader import assert_cut_at_groups


def greedy(sizes: list[int], window_rows: int) -> list[int]:
    """The expected window sizes, by hand: whole groups while they fit; an over-long group alone, in pieces of
    LONGEST_WINDOW × window_rows."""
    windows, held = [], 0
    for size in sizes:
        if held and held + size > window_rows:
            windows.append(held)
            held = 0
        if size > window_rows:
            longest = LONGEST_WINDOW * window_rows
            windows += [longest] * ((size - 1) // longest) + [size - longest * ((size - 1) // longest)]
            continue
        held += size
    return windows + ([held] if held else [])


def long_rows(sizes: list[int]) -> list[dict]:
    """Rows of consecutive query groups of these sizes (query 0 comes back after the others: another group)."""
    rows = []
    for group, size in enumerate(sizes):
        query = 0 if group == len(sizes) - 1 else group
        rows += [{"query_id": query, "query": f"q{query}", "item": f"i{group}-{k}"} for k in range(size)]
    return rows


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("window_rows", [1, 4, 7])
def test_windows_hold_whole_query_groups(tmp_path, fmt, window_rows):
    sizes = [3, 1, 5, 2, 9, 1, 4, 4, 70, 2, 3]  # 70: past LONGEST_WINDOW windows of 4 or 7 rows
    rows = long_rows(sizes)
    path = tmp_path / f"in.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5)  # batches cut inside groups
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    _, windows = read_windows(open_source(str(path)), ColumnOverrides(query_id_col="query_id"), window_rows)
    windows = list(windows)
    assert [w.num_rows for w in windows] == greedy(sizes, window_rows)
    assert [int(i) for w in windows for i in w.index] == list(range(len(rows)))
    if LONGEST_WINDOW * window_rows >= 70:
        assert_cut_at_groups(windows, window_rows)
    whole, parts = InputDigest(), InputDigest()  # the digest of the whole input: the same however it is cut
    _, one = read_windows(open_source(str(path)), ColumnOverrides(query_id_col="query_id"), 10**6)
    for window in one:
        whole.add(window)
    for window in windows:
        parts.add(window)
    assert whole.hexdigest() == parts.hexdigest()


def test_unreadable_rows_join_no_group_and_split_none(tmp_path):
    """A row that cannot be read sits between groups or inside one: the readable rows around it decide."""
    rows = [{"query": "a", "item": "1"}, {"query": "a", "item": None}, {"query": "a", "item": "2"}]
    rows += [{"query": None, "item": "3"}, {"query": "b", "item": "4"}, {"query": "b", "item": "5"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    _, windows = read_windows(open_source(str(path)), ColumnOverrides(), 1)
    assert [[int(i) for i in w.index] for w in windows] == [[0, 1, 2], [3], [4, 5]]


def test_nested_rows_of_one_query_stay_together(tmp_path):
    """The nested layout: consecutive rows of one query are one group (job/windows gathers them)."""
    rows = [{"query": q, "items": ["x", "y"]} for q in ("a", "a", "a", "b", "c", "c")]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    _, windows = read_windows(open_source(str(path)), ColumnOverrides(), 2)
    assert [[int(i) for i in w.index] for w in windows] == [[0, 1, 2], [3], [4, 5]]


@pytest.mark.parametrize("batch_rows", [2, 3, 5])
def test_unreadable_rows_at_a_read_s_end_do_not_cut_their_group(tmp_path, monkeypatch, batch_rows):
    """Rows that cannot be read between two rows of one query belong to that group: a read that ends on them
    (the next readable row not read yet) is no place to cut, whatever the reads' sizes."""
    from score_batch.io_formats import readers

    monkeypatch.setattr(readers, "BATCH_ROWS", batch_rows)
    rows = [{"query": "q1", "item": f"a{k}"} for k in range(3)] + [{"query": "q1", "item": None}] * 3
    rows += [{"query": "q1", "item": "b"}, {"query": "q2", "item": "c"}, {"query": "q2", "item": "d"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    _, windows = read_windows(open_source(str(path)), ColumnOverrides(), 3)
    windows = list(windows)
    assert_cut_at_groups(windows, 3)
    assert [w.num_rows for w in windows] == [7, 2]  # q1's seven rows (three unreadable) whole, then q2
