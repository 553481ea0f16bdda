"""Every Arrow type a Parquet input holds, in each role (query, item, ids, kept, partition, nested items),
against a plain-string run of the same rows (docs/formats.md, Column types): the same scores and the same
output, as pyarrow reads it back. Bytes that are not UTF-8 in a written string column are that row's error."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.arrow_types import plain_array, plain_type
from tests.test_cli import LABEL_FLAGS, run_cli

QUERIES = ["q one", "q two", "q one", "q three", "q two"]
ITEMS = [" to", " the", " flag", " of", " Japan"]
QUERY_IDS = ["a", "b", "a", "c", "b"]
ITEM_IDS = ["a1", "b1", "a2", "c1", "b2"]
WORDS = ["x0", None, "x2", "x3", "x4"]  # a null among them


def pair(values, typed: pa.DataType, plain: pa.DataType | None = None) -> tuple[pa.Array, pa.Array]:
    """(the values as the typed column, the same values as the documented plain column)."""
    return pa.array(values, typed), pa.array(values, plain or typed)


def extension(typed: pa.DataType, storage: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(an extension column over storage, the storage: what the output holds)."""
    return pa.ExtensionArray.from_storage(typed, storage), storage


def blobs(values) -> list:
    return [None if v is None else v.encode() for v in values]


def kept_columns(v: list) -> dict[str, tuple[pa.Array, pa.Array]]:
    """Each kept type (docs/formats.md, Column types) of the values v: (typed, plain)."""
    lists = [None if w is None else [w, w + "!"] for w in v]
    ints = [None if w is None else len(w) + k for k, w in enumerate(v)]
    uuids = [None if w is None else uuid.uuid5(uuid.NAMESPACE_DNS, w).bytes for w in v]
    tensor = np.arange(len(v) * 4, dtype=np.float64).reshape(len(v), 2, 2)
    nested = [None if w is None else {"a": {"b": w, "c": [len(w)]}} for w in v]
    return {
        "k_string_view": pair(v, pa.string_view(), pa.string()),
        "k_binary_view": pair(blobs(v), pa.binary_view(), pa.binary()),
        "k_large_string": pair(v, pa.large_string()),
        "k_large_binary": pair(blobs(v), pa.large_binary()),
        "k_dictionary": pair(v, pa.dictionary(pa.int32(), pa.string())),
        "k_dictionary_bytes": pair(blobs(v), pa.dictionary(pa.int32(), pa.binary())),
        "k_decimal32": pair([None if i is None else Decimal(i) for i in ints], pa.decimal32(5, 1)),
        "k_decimal64": pair([None if i is None else Decimal(i) for i in ints], pa.decimal64(12, 2)),
        "k_decimal128": pair([None if i is None else Decimal(i) for i in ints], pa.decimal128(20, 1)),
        "k_decimal256": pair([None if i is None else Decimal(i) for i in ints], pa.decimal256(50, 3)),
        "k_float16": pair([None if i is None else np.float16(i) for i in ints], pa.float16()),
        "k_uuid": extension(pa.uuid(), pa.array(uuids, pa.binary(16))),
        "k_json": extension(pa.json_(), pa.array([json.dumps(w) for w in v], pa.string())),
        "k_bool8": extension(pa.bool8(), pa.array([None if i is None else i % 2 for i in ints], pa.int8())),
        "k_opaque": extension(pa.opaque(pa.string(), "t", "vendor"), pa.array(v, pa.string())),
        "k_tensor": (
            pa.FixedShapeTensorArray.from_numpy_ndarray(tensor),
            pa.array(tensor.reshape(len(v), 4).tolist(), pa.list_(pa.float64(), 4)),
        ),
        "k_list_view": pair(lists, pa.list_view(pa.string()), pa.list_(pa.string())),
        "k_large_list_view": pair(lists, pa.large_list_view(pa.string_view()), pa.large_list(pa.string())),
        "k_large_list": pair(lists, pa.large_list(pa.string())),
        "k_list_of_views": pair(lists, pa.list_(pa.string_view()), pa.list_(pa.string())),
        "k_list_of_dictionaries": pair(lists, pa.list_(pa.dictionary(pa.int32(), pa.string()))),
        "k_fixed_size_list": pair(lists, pa.list_(pa.string_view(), 2), pa.list_(pa.string(), 2)),
        "k_nested_struct": pair(
            nested,
            pa.struct([("a", pa.struct([("b", pa.string_view()), ("c", pa.list_view(pa.int64()))]))]),
            pa.struct([("a", pa.struct([("b", pa.string()), ("c", pa.list_(pa.int64()))]))]),
        ),
        "k_map": pair(
            [None if w is None else [(w, w.encode())] for w in v],
            pa.map_(pa.string_view(), pa.binary_view()),
            pa.map_(pa.string(), pa.binary()),
        ),
        "k_timestamp": pair(ints, pa.timestamp("ms", "UTC")),
        "k_duration": pair(ints, pa.duration("s")),
        "k_null": pair([None] * len(v), pa.null()),
    }


def long_roles(query, item, query_id, item_id) -> dict[str, tuple[pa.Array, pa.Array]]:
    """The long layout's columns, each role typed as given (typed, plain)."""
    return {
        "query": pair(QUERIES, *query),
        "item": pair(ITEMS, *item),
        "query_id": query_id(QUERY_IDS),
        "item_id": item_id(ITEM_IDS),
    }


def decimals(values, typed) -> tuple[pa.Array, pa.Array]:
    numbers = [Decimal(sum(map(ord, v)) % 97) for v in values]
    return pair(numbers, typed)


VIEW, STRING = (pa.string_view(), pa.string()), (pa.string(),)
CASES = {  # name → (columns, flags, output name): each one run typed, one run plain
    "views in every role, ranked": (
        lambda: {
            **long_roles(
                VIEW, VIEW, lambda v: pair(v, *VIEW), lambda v: pair(blobs(v), pa.binary_view(), pa.binary())
            ),
            **kept_columns(WORDS),
        },
        ["--rank"],
        "out.parquet",
    ),
    "every kept type to JSON lines": (
        lambda: {
            **long_roles(STRING, STRING, lambda v: pair(v, *VIEW), lambda v: pair(v, *VIEW)),
            **kept_columns(WORDS),
        },
        [],
        "out.jsonl",
    ),
    "large and dictionary texts, byte ids": (
        lambda: long_roles(
            (pa.dictionary(pa.int32(), pa.string()),),
            (pa.large_string(),),
            lambda v: pair(blobs(v), pa.large_binary()),
            lambda v: pair(v, pa.dictionary(pa.int32(), pa.string())),
        ),
        [],
        "out.parquet",
    ),
    "extension texts, uuid and decimal ids": (
        lambda: {
            "query": extension(pa.opaque(pa.string(), "t", "v"), pa.array(QUERIES)),
            "item": extension(pa.opaque(pa.large_string(), "t", "v"), pa.array(ITEMS, pa.large_string())),
            "query_id": extension(
                pa.uuid(),
                pa.array([uuid.uuid5(uuid.NAMESPACE_DNS, v).bytes for v in QUERY_IDS], pa.binary(16)),
            ),
            "item_id": decimals(ITEM_IDS, pa.decimal32(4, 0)),
        },
        ["--rank"],
        "out.parquet",
    ),
    "partitioned by a view, a decimal and a dictionary": (
        lambda: {
            **long_roles(STRING, STRING, lambda v: pair(v, *STRING), lambda v: pair(v, *VIEW)),
            "p_view": pair(QUERY_IDS, *VIEW),
            "p_decimal": decimals(QUERY_IDS, pa.decimal64(6, 1)),
            "p_dictionary": pair(QUERY_IDS, pa.dictionary(pa.int8(), pa.string())),
            "k_view": pair(WORDS, *VIEW),
        },
        ["--partition-by", "p_view,p_decimal,p_dictionary"],
        "out",
    ),
    "nested list views": (
        lambda: {
            "query_id": pair(["a", "b"], *VIEW),
            "query": pair(["q one", "q two"], *STRING),
            "items": pair(
                [[" to", " the"], [" flag"]], pa.list_view(pa.string_view()), pa.list_(pa.string())
            ),
            "item_ids": pair(
                [["i", "j"], ["k"]], pa.large_list_view(pa.string_view()), pa.large_list(pa.string())
            ),
            "k_nested_struct": kept_columns(["x0", "x1"])["k_nested_struct"],
        },
        [],
        "out.parquet",
    ),
    "nested large and fixed-size lists": (
        lambda: {
            "query": pair(["q one", "q two"], *VIEW),
            "items": pair(
                [[" to", " the"], [" flag", " of"]], pa.list_(pa.string_view(), 2), pa.list_(pa.string(), 2)
            ),
            "item_ids": pair([["i", "j"], ["k", "l"]], pa.large_list(pa.dictionary(pa.int32(), pa.string()))),
        },
        [],
        "out.parquet",
    ),
}


def write_both(tmp_path, columns: dict) -> tuple:
    """The typed and the plain input files; the typed file keeps its types as pyarrow reads them back."""
    typed = pa.table({name: column[0] for name, column in columns.items()})
    plain = pa.table({name: column[1] for name, column in columns.items()})
    paths = tmp_path / "typed.parquet", tmp_path / "plain.parquet"
    pq.write_table(typed, paths[0])
    pq.write_table(plain, paths[1])
    read = pq.read_schema(paths[0])
    for field in typed.schema:
        assert read.field(field.name).type == field.type or pa.types.is_dictionary(field.type), field
    return paths


def output(path):
    """An output as its readers see it: pyarrow's table (a partitioned directory through pyarrow.dataset, with
    its files' paths), and its rows (to_pylist); a JSON lines output as its text."""
    if path.suffix == ".jsonl":
        return path.read_text()
    if path.is_dir():
        table = ds.dataset(path, partitioning="hive").to_table()
        return sorted(p.relative_to(path).as_posix() for p in path.rglob("*.parquet")), table.to_pylist()
    table = pq.read_table(path)
    table.validate(full=True)
    return table.schema, table.to_pylist()


@pytest.mark.parametrize("case", CASES)
def test_each_type_in_each_role_writes_what_the_plain_run_writes(qwen3_causal, tmp_path, case):
    make, flags, name = CASES[case]
    columns = make()
    typed, plain = write_both(tmp_path, columns)
    roles = {"query", "item", "items", "query_id", "item_id", "item_ids"}
    kept = [c for c in columns if c not in roles]
    base = ["--model", qwen3_causal, *LABEL_FLAGS, "--quiet", *flags]
    base += ["--keep-columns", ",".join(kept)] if kept else []
    outputs = []
    for source, out in ((typed, tmp_path / "typed"), (plain, tmp_path / "plain")):
        out.mkdir()
        result = run_cli(source, "-o", out / name, *base)
        assert result.returncode == 0, result.stderr
        outputs.append(output(out / name))
    assert outputs[0] == outputs[1]  # the same scores, ids, kept values and types
    rows = outputs[1][1] if name != "out.jsonl" else [json.loads(line) for line in outputs[1].splitlines()]
    assert rows and all(row["score"] is not None for row in rows)


VALUES = {  # a typed column and the plain one it is written as, run-end encoded and sliced ones among them
    "run-end encoded text": (
        pa.RunEndEncodedArray.from_arrays([2, 3, 5], pa.array(["a", None, "b"])),
        pa.array(["a", "a", None, "b", "b"]),
    ),
    "run-end encoded view": (
        pa.RunEndEncodedArray.from_arrays([1, 2], pa.array(["a", "b"], pa.string_view())),
        pa.array(["a", "b"]),
    ),
    "dictionary of views": (
        pa.DictionaryArray.from_arrays(
            pa.array([1, 0, None], pa.int8()), pa.array(["a", "b"], pa.string_view())
        ),
        pa.DictionaryArray.from_arrays(pa.array([1, 0, None], pa.int8()), pa.array(["a", "b"])),
    ),
    "sliced list view": (
        pa.ListViewArray.from_arrays(
            [2, 0, 1], [1, 2, 0], pa.array(["a", "b", None]), mask=pa.array([False, False, True])
        ).slice(1),
        pa.array([["a", "b"], None], pa.list_(pa.string())),
    ),
    "fixed-size list with a null row": (
        pa.array([["a", "b"], None, ["c", None]], pa.list_(pa.string_view(), 2)).slice(1),
        pa.array([None, ["c", None]], pa.list_(pa.string(), 2)),
    ),
    **{name: columns for name, columns in kept_columns(WORDS).items()},
}


@pytest.mark.parametrize("name", VALUES)
def test_a_column_reads_as_its_plain_type_with_its_values(name):
    """The reader's conversion of one column (io_formats/arrow_types) against pyarrow's own values."""
    typed, plain = VALUES[name]
    converted = plain_array(typed, plain_type(typed.type, name), name)
    converted.validate(full=True)
    assert converted.type == plain.type
    assert converted.to_pylist() == plain.to_pylist()


def not_utf8(values: list[bytes]) -> pa.Array:
    """A string column holding these bytes, UTF-8 or not (as a writer that does not check leaves them)."""
    return pa.array(values, pa.binary()).cast(pa.string(), safe=False)


def clean_and_bad(rows: int, bad: int) -> list[bytes]:
    """[rows] UTF-8 texts, row `bad`'s not UTF-8."""
    return [b"v\xff" if k == bad else f"v{k}".encode() for k in range(rows)]


BAD_COLUMNS = {"query_id": 1, "item_id": 2, "note": 3, "meta": 4, "tags": 5}  # column → its row of bad bytes


def bad_bytes_input(path) -> None:
    """Seven rows; rows 1-5 each hold bytes that are not UTF-8 in one written column (BAD_COLUMNS): an id, a
    kept string, a string inside a kept struct or list (a dictionary's: pyarrow's Parquet reader refuses)."""
    n = 7
    tags = pa.ListArray.from_arrays(pa.array(range(n + 1), pa.int32()), not_utf8(clean_and_bad(n, 5)))
    table = pa.table(
        {
            "query_id": not_utf8(clean_and_bad(n, 1)),
            "query": ["q one", "q two", "q one", "q three", "q two", "q one", "q two"],
            "item_id": not_utf8(clean_and_bad(n, 2)),
            "item": [" to", " the", " flag", " of", " Japan", " a", " b"],
            "note": not_utf8(clean_and_bad(n, 3)),
            "meta": pa.StructArray.from_arrays([not_utf8(clean_and_bad(n, 4))], ["s"]),
            "tags": tags,
        }
    )
    pq.write_table(table, path)


@pytest.mark.parametrize("mode", ["record", "skip", "fail"])
def test_bytes_that_are_not_utf8_in_a_written_column_are_that_rows_error(qwen3_causal, tmp_path, mode):
    bad_bytes_input(tmp_path / "in.parquet")
    plain = pa.table({"query": ["q one", "q two"], "item": [" to", " b"]})  # rows 0 and 6, clean
    pq.write_table(plain, tmp_path / "plain.parquet")
    flags = ["--model", qwen3_causal, *LABEL_FLAGS, "--quiet", "--keep-columns", "note,meta,tags"]
    out = tmp_path / "out.parquet"
    result = run_cli(tmp_path / "in.parquet", "-o", out, *flags, "--on-error", mode)
    if mode == "fail":
        assert result.returncode == 2 and "Traceback" not in result.stderr
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("score-batch: error:")]
        assert "row 1: column 'query_id' holds bytes that are not valid UTF-8" in line
        return
    assert result.returncode == 0, result.stderr
    reference = tmp_path / "plain.out.parquet"
    assert run_cli(tmp_path / "plain.parquet", "-o", reference, *flags[:-2]).returncode == 0
    table = pq.read_table(out)
    table.validate(full=True)  # every string column valid UTF-8
    rows = table.to_pylist()  # pyarrow's reading, as pandas reads it
    scored = [row for row in rows if row["score"] is not None]
    assert [row["score"] for row in scored] == pq.read_table(reference).column("score").to_pylist()
    assert [row["note"] for row in scored] == ["v0", "v6"]
    if mode == "skip":
        assert len(rows) == 2
        failed = [
            json.loads(line) for line in (tmp_path / "out.parquet.errors.jsonl").read_text().splitlines()
        ]
    else:
        failed = [row for row in rows if row["error"] is not None]
        assert len(rows) == 7
    assert [row["error"].split(" (")[0] for row in failed] == [
        f"row {row}: column {name!r} holds bytes that are not valid UTF-8"
        for name, row in BAD_COLUMNS.items()
    ]


def test_bytes_that_are_not_utf8_never_reach_a_json_lines_output(qwen3_causal, tmp_path):
    bad_bytes_input(tmp_path / "in.parquet")
    out = tmp_path / "out.jsonl"
    flags = ["--quiet", "--keep-columns", "note,meta,tags", "--on-error", "record"]
    result = run_cli(tmp_path / "in.parquet", "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, *flags)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_bytes().decode("utf-8").splitlines()]
    assert [row["error"] is not None for row in rows] == [False, True, True, True, True, True, False]
