"""A window's query groups (job/windows.group_codes, group_window) against a plain first-appearance reference."""

from __future__ import annotations

import dataclasses
import random

import pyarrow as pa
import pytest

from score_batch.io_formats.rows import InputRow
from score_batch.io_formats.window import from_rows
from score_batch.job.windows import group_codes, group_window


def reference(rows: list[InputRow], ids: bool) -> tuple[list[int], list[int]]:
    """Each readable row's group: (query id, query) numbered in order of first appearance; -1 when unreadable."""
    seen: dict = {}
    codes, firsts = [], []
    for position, row in enumerate(rows):
        if row.error is not None:
            codes.append(-1)
            continue
        key = (repr(row.query_id) if ids else None, repr(row.query))
        if key not in seen:
            seen[key] = len(firsts)
            firsts.append(position)
        codes.append(seen[key])
    return codes, firsts


@pytest.mark.parametrize("ids", [False, True])
def test_group_codes_equal_first_appearance_over_random_windows(ids):
    """Python rows (ids compared by repr) and their Arrow columns (integer, string, dictionary ids: numpy)."""
    rng = random.Random(ids)
    for _ in range(1500):
        rows = []
        for k in range(rng.randint(0, 40)):
            query = rng.choice(["a", "b", "c", "", [1, 2], [2, 1]])
            row = InputRow(k, query, [f"i{k}"], rng.choice([None, 1, 2, "1"]) if ids else None, [k], {})
            if rng.random() < 0.1:
                row.error = "unreadable"
            rows.append(row)
        window = from_rows(rows, ids, ())
        if ids and rng.random() < 0.7:  # an Arrow id column as the Parquet reader gives it
            kind = rng.choice([pa.int64(), pa.string(), "dictionary"])
            values = [None if r.query_id is None else str(r.query_id) for r in rows]
            if kind == pa.int64():
                values = [None if r.query_id is None else int(r.query_id) for r in rows]
            column = pa.array(values, pa.string() if kind == "dictionary" else kind)
            column = column.dictionary_encode() if kind == "dictionary" else column
            window = dataclasses.replace(window, query_ids=column)
            for row, value in zip(rows, column.to_pylist()):
                row.query_id = value
        start = rng.randint(0, len(rows))
        stop = rng.randint(start, len(rows))
        part = window.slice(start, stop)  # a slice shares its batch's distinct queries
        codes, firsts = group_codes(part)
        assert (codes.tolist(), firsts) == reference(rows[start:stop], ids)
        grouped = group_window(part)
        for group, refs in zip(grouped.groups, grouped.refs):
            assert [part.items[i] for i in refs.tolist()] == group.items
