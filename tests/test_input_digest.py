"""The input digest (job/checkpoint/input_digest): columns hashed as bytes where they allow (numbers, text),
JSON otherwise; Arrow-backed and Python-backed columns of the same values digest alike, however the input is
cut into windows, and no two different inputs share a digest through the encoding."""

from __future__ import annotations

import dataclasses
import datetime
import decimal

import pyarrow as pa
import pytest

from score_batch.io_formats.rows import InputRow
from score_batch.io_formats.window import from_rows
from score_batch.job.checkpoint.input_digest import InputDigest

KEPT = {  # a kept column's Python values and an Arrow type that holds them
    "i32": (pa.int32(), [1, None, -7, 2**31 - 1, 0, 5]),
    "u64": (pa.uint64(), [2**64 - 1, 3, None, 0, 2**63, 1]),
    "f32": (pa.float32(), [1.5, None, -0.25, 0.0, 2.0, 1e10]),
    "f64": (pa.float64(), [1.0, float("inf"), None, -0.0, 3.25, 1e-300]),
    "text": (pa.string(), ["", None, "é 中", "ab", "c", "\x00"]),
    "large": (pa.large_string(), ["a", "bc", "é", "", "😀", "z"]),
    "category": (pa.dictionary(pa.int8(), pa.string()), ["x", "y", "x", None, "x", "y"]),
    "flag": (pa.bool_(), [True, False, None, True, True, False]),
    "day": (pa.date32(), [datetime.date(2020, 1, k) for k in range(1, 7)]),
    "tokens": (pa.list_(pa.int64()), [[1, 2], [], None, [3], [2**40], [0]]),
    "nothing": (pa.null(), [None] * 6),
}


def rows(kept: dict[str, list], items=None) -> list[InputRow]:
    """Six long-layout rows with these kept columns (items: each row's, default one text each)."""
    items = items or [[f"item {k}"] for k in range(6)]
    return [
        InputRow(k, f"query {k % 2}", items[k], f"q{k % 2}", [k], {n: v[k] for n, v in kept.items()}, None)
        for k in range(6)
    ]


def arrow_backed(window, start: int = 0):
    """The same window with its ids and kept columns as Arrow arrays (slices of longer ones: start junk rows;
    the item ids in two chunks)."""

    def arrow(values, dtype):
        return pa.array(list(values[:1]) * start + list(values), dtype)[start:]

    kept = {name: arrow(window.kept[name], KEPT[name][0]) for name in window.kept}
    return dataclasses.replace(
        window,
        query_ids=arrow(window.query_ids, pa.string()),
        item_ids=pa.chunked_array(
            [arrow(window.item_ids[:2], pa.int64()), arrow(window.item_ids[2:], pa.int64())]
        ),
        kept=kept,
        _cache={},
    )


@pytest.mark.parametrize("start", [0, 3])
def test_arrow_columns_digest_as_their_python_values_however_cut(start):
    """Every type's Arrow column (sliced or not, with nulls) gives its Python values' digest, and the running
    digest is the same for any cut, each window Arrow- or Python-backed."""
    listed = from_rows(rows({n: v for n, (_, v) in KEPT.items()}), True, tuple(KEPT))
    assert InputDigest().add(arrow_backed(listed, start)) == InputDigest().add(listed)
    whole = InputDigest()
    whole.add(listed)
    for cut in range(1, 6):
        pieces = InputDigest()
        pieces.add(arrow_backed(listed.slice(0, cut), start))
        pieces.add(listed.slice(cut, 6))
        assert pieces.hexdigest() == whole.hexdigest(), cut


@pytest.mark.parametrize(
    "one, other",
    [
        ([1, 2, 3, 4, 5, 6], [1.0, 2, 3, 4, 5, 6]),  # an int and a float of the same value
        ([1, 2, 3, 4, 5, 6], ["1", 2, 3, 4, 5, 6]),  # an int and its text
        (["", "a", "b", "c", "d", "e"], [None, "a", "b", "c", "d", "e"]),  # empty text and null
        (["ab", "c", "", "d", "e", "f"], ["a", "bc", "", "d", "e", "f"]),  # a boundary between two texts
        (["ab", "", "c", "d", "e", "f"], ["a", "b", "c", "d", "e", "f"]),
        ([True, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]),  # a boolean is not its integer
        ([[1, 2], 2, 3, 4, 5, 6], ["[1, 2]", 2, 3, 4, 5, 6]),  # a list and its JSON text
        # a value JSON cannot hold and the text of its repr (the same JSON text in digest 2)
        ([datetime.date(2020, 1, 2), 2, 3, 4, 5, 6], ["datetime.date(2020, 1, 2)", 2, 3, 4, 5, 6]),
        ([decimal.Decimal("1.5"), 2, 3, 4, 5, 6], ["Decimal('1.5')", 2, 3, 4, 5, 6]),
        ([2**70, 2, 3, 4, 5, 6], ["1180591620717411303424", 2, 3, 4, 5, 6]),  # past int64: as JSON
        (["a", "b", "c", "d", "e", "f"], ["a", "c", "b", "d", "e", "f"]),  # two values swapped
    ],
)
def test_a_kept_column_digest_tells_values_apart(one, other):
    assert InputDigest().add(from_rows(rows({"k": one}), True, ("k",))) != InputDigest().add(
        from_rows(rows({"k": other}), True, ("k",))
    )


def test_items_digest_tells_texts_token_ids_nulls_and_row_boundaries_apart():
    """Items as text and token ids, None and '', and the same texts split otherwise between or within rows."""
    base = [["ab"], ["c"], ["x"], ["y"], ["z"], ["w"]]
    variants = [
        base,
        [["a"], ["bc"], ["x"], ["y"], ["z"], ["w"]],
        [["abc"], [""], ["x"], ["y"], ["z"], ["w"]],
        [["ab", "c"], [], ["x"], ["y"], ["z"], ["w"]],  # nested: the rows' item counts tell them apart
        [["a", "bc"], [], ["x"], ["y"], ["z"], ["w"]],
        [[""], ["c"], ["x"], ["y"], ["z"], ["w"]],
        [[None], ["c"], ["x"], ["y"], ["z"], ["w"]],
        [["[1, 2]"], ["c"], ["x"], ["y"], ["z"], ["w"]],
        [[[1, 2]], ["c"], ["x"], ["y"], ["z"], ["w"]],
        [["\ud800"], ["c"], ["x"], ["y"], ["z"], ["w"]],  # a lone surrogate (JSONL's escape) is its own text
        [["\udc00"], ["c"], ["x"], ["y"], ["z"], ["w"]],
    ]
    digests = [InputDigest().add(from_rows(rows({}, items), True, ())) for items in variants]
    assert len(set(digests)) == len(variants)
