"""Hostile inputs: every row accounted for, types from the whole input, a clear exit 2 instead of a traceback.

Each class of bad input from issue 14's reading side has a test here: through the command (in-process)
where the behaviour is end to end, or through io_formats.readers directly where that is simpler.
"""

from __future__ import annotations

import gc
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.errors import InputError
from score_batch.io_formats.readers import (
    column_types,
    input_mapping,
    open_source,
    read_unit,
    read_units,
    read_windows,
)
from score_batch.io_formats.schema import ColumnOverrides, resolve_columns
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_columnar_reader import as_rows

TEXT = {"query": "I pledge allegiance", "item": " to"}


def score(qwen3_causal, src, out, *flags, stdin=None):
    """Run the command on src → out with the tiny model; the result (exit code, stdout, stderr)."""
    return run_cli(src, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--quiet", *flags, stdin=stdin)


def assert_clean_exit_2(result, *needles):
    """Exit 2, a message naming every needle, and no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def rows_of(source, overrides=ColumnOverrides(), window_rows=1000):
    """All InputRows of a source (with its mapping)."""
    mapping, windows = read_windows(source, overrides, window_rows)
    return mapping, [row for window in windows for row in as_rows(window)]


# ------------------------------------------------------------------------------ Parquet: types


def test_parquet_directory_types_unified_and_partial_files_ignored(tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    first = pa.table(
        {
            "query": ["q"],
            "item": ["a"],
            "query_id": pa.array([1], pa.int32()),
            "price": pa.array([None], pa.null()),
            "n": pa.array([1], pa.int64()),
        }
    )
    second = pa.table(
        {
            "query": ["q"],
            "item": ["b"],
            "query_id": pa.array([2], pa.int64()),
            "price": pa.array([2.5], pa.float64()),
            "n": pa.array([2.5], pa.float64()),
        }
    )
    pq.write_table(first, data / "part-0.parquet")
    pq.write_table(second, data / "part-1.parquet")
    (data / "_SUCCESS").write_text("")
    (data / "_temporary.parquet").write_bytes(b"partial")
    (data / ".part-2.parquet").write_bytes(b"hidden partial")
    (data / ".part-3.parquet.tmp-123").write_bytes(b"partial")
    (data / "nested.parquet").mkdir()
    source = open_source(str(data))
    assert [f.location.name for f in source.files] == ["part-0.parquet", "part-1.parquet"]
    mapping, rows = rows_of(source, ColumnOverrides(keep_columns=("price", "n")))
    assert column_types(source, mapping) == {"query_id": pa.int64(), "price": pa.float64(), "n": pa.float64()}
    assert [r.kept["n"] for r in rows] == [1.0, 2.5] and all(isinstance(r.kept["n"], float) for r in rows)
    assert source.total_rows() == 2


def test_parquet_files_that_disagree_exit_2_naming_files_and_column(qwen3_causal, tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    pq.write_table(pa.table({**{k: [v] for k, v in TEXT.items()}, "query_id": ["a"]}), data / "a.parquet")
    pq.write_table(pa.table({**{k: [v] for k, v in TEXT.items()}, "query_id": [7]}), data / "b.parquet")
    result = score(qwen3_causal, data, tmp_path / "out.parquet")
    assert_clean_exit_2(result, "'query_id'", "a.parquet", "b.parquet")
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize(
    "second, needle",
    [
        (pa.array([2**63], pa.uint64()), "disagree"),  # int64 + uint64 would lose values
        (None, "not in"),  # the column is missing from one file
    ],
)
def test_parquet_lossy_or_missing_column_is_refused(tmp_path, second, needle):
    data = tmp_path / "in"
    data.mkdir()
    pq.write_table(
        pa.table({"query": ["q"], "item": ["a"], "tag": pa.array([1], pa.int64())}), data / "a.parquet"
    )
    other = {"query": ["q"], "item": ["b"]} | ({} if second is None else {"tag": second})
    pq.write_table(pa.table(other), data / "b.parquet")
    source = open_source(str(data))
    mapping = resolve_columns(["query", "item", "tag"], ColumnOverrides(keep_columns=("tag",)), str(data))
    with pytest.raises(InputError, match=needle) as error:
        column_types(source, mapping)
    assert "'tag'" in str(error.value) and "a.parquet" in str(error.value) and "b.parquet" in str(error.value)


def test_parquet_column_null_in_the_whole_first_window_keeps_its_type(qwen3_causal, tmp_path):
    src = tmp_path / "in.parquet"
    rows = [{**TEXT, "tag": None}] * 3 + [{**TEXT, "tag": 5}]
    pq.write_table(pa.Table.from_pylist(rows, schema=_schema(tag=pa.int64())), src)
    out = tmp_path / "out.parquet"
    result = score(qwen3_causal, src, out, "--keep-columns", "tag", "--window-rows", "2")
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out)
    assert table.schema.field("tag").type == pa.int64()
    assert table.column("tag").to_pylist() == [None, None, None, 5]


def _schema(**extra):
    return pa.schema([("query", pa.string()), ("item", pa.string()), *extra.items()])


# --------------------------------------------------------------------------- Parquet: damage


def _good_parquet(path: Path, rows: int = 10) -> Path:
    pq.write_table(pa.Table.from_pylist([TEXT] * rows), path)
    return path


@pytest.mark.parametrize("damage", ["empty", "not parquet", "truncated", "jsonl renamed"])
def test_damaged_parquet_file_exits_2_naming_it(qwen3_causal, tmp_path, damage):
    src = tmp_path / "in.parquet"
    if damage == "empty":
        src.write_bytes(b"")
        needle = "empty"
    elif damage == "not parquet":
        src.write_bytes(b"hello, this is not a parquet file at all\n" * 4)
        needle = "not a readable Parquet file"
    elif damage == "truncated":
        data = _good_parquet(tmp_path / "good.parquet").read_bytes()
        src.write_bytes(data[: len(data) // 2])
        needle = "not a readable Parquet file"
    else:
        src.write_text(json.dumps(TEXT) + "\n")
        needle = "not a readable Parquet file"
    result = score(qwen3_causal, src, tmp_path / "out.parquet")
    assert_clean_exit_2(result, str(src), needle)


def test_corrupt_parquet_data_pages_exit_2_naming_the_file(qwen3_causal, tmp_path):
    src = tmp_path / "in.parquet"
    rows = [{"query": f"query number {i} " * 5, "item": f"item {i} " * 5} for i in range(2000)]
    pq.write_table(pa.Table.from_pylist(rows), src, compression="snappy")
    data = bytearray(src.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for i in range(100, len(data) - footer - 100):  # every data byte, footer untouched
        data[i] = 0xAB
    src.write_bytes(bytes(data))
    result = score(qwen3_causal, src, tmp_path / "out.parquet")
    assert_clean_exit_2(result, str(src), "cannot read this Parquet file")


def test_read_units_of_a_directory_index_rows_and_convert_types(tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    pq.write_table(
        pa.table({"query": ["q"] * 3, "item": ["a"] * 3, "query_id": [1, 2, 3]}), data / "a.parquet"
    )
    pq.write_table(pa.table({"query": ["q"], "item": ["b"], "query_id": [4.5]}), data / "b.parquet")
    source = open_source(str(data))
    mapping = input_mapping(source, ColumnOverrides())
    types = column_types(source, mapping)
    rows = [row for unit in read_units(source) for row in as_rows(read_unit(unit, mapping, types))]
    assert [(r.index, r.query_id) for r in rows] == [(0, 1.0), (1, 2.0), (2, 3.0), (3, 4.5)]
    assert all(isinstance(r.query_id, float) for r in rows)


def test_directory_without_readable_parquet_files_exits_2(qwen3_causal, tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    (data / "_SUCCESS").write_text("")
    (data / ".x.parquet.tmp-1").write_text("")
    (data / "sub.parquet").mkdir()
    result = score(qwen3_causal, data, tmp_path / "out.parquet")
    assert_clean_exit_2(result, str(data), "no .parquet files")


# ----------------------------------------------------------------------------- JSONL: types


def test_jsonl_types_come_from_every_line(tmp_path):
    rows = [{**TEXT, "query_id": i + 0.5, "price": 10} for i in range(60)]
    rows.append({**TEXT, "query_id": 60, "price": 60.5, "late": [1, 2], "flag": True})
    rows.append({**TEXT, "query_id": 61, "price": None, "late": [{"a": 1}], "flag": None})
    source = open_source(str(write_jsonl(tmp_path / "in.jsonl", rows[:-1])))
    mapping, read = rows_of(source, ColumnOverrides(keep_columns=("price", "late", "flag")), window_rows=7)
    assert column_types(source, mapping) == {
        "query_id": pa.float64(),
        "price": pa.float64(),
        "late": pa.list_(pa.int64()),
        "flag": pa.bool_(),
    }
    assert len({r.query_id for r in read}) == 61 and read[-1].query_id == 60.0
    assert read[-1].kept == {"price": 60.5, "late": [1, 2], "flag": True} and read[0].kept["late"] is None
    mixed = open_source(str(write_jsonl(tmp_path / "mixed.jsonl", rows)))
    with pytest.raises(InputError, match="'late'"):  # a list of ints, then a list of objects
        column_types(mixed, input_mapping(mixed, ColumnOverrides(keep_columns=("late",))))


def test_float_ids_and_later_floats_are_written_as_float64(qwen3_causal, tmp_path):
    rows = [{**TEXT, "query_id": i + 0.5, "item_id": i, "price": 10} for i in range(60)]
    rows.append({**TEXT, "query_id": 60.5, "item_id": 60.5, "price": 60.5})
    out = tmp_path / "out.parquet"
    result = score(
        qwen3_causal,
        write_jsonl(tmp_path / "in.jsonl", rows),
        out,
        "--keep-columns",
        "price",
        "--window-rows",
        "8",
    )
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out)
    assert table.schema.field("query_id").type == pa.float64()
    assert table.schema.field("item_id").type == pa.float64()
    assert table.schema.field("price").type == pa.float64()
    assert table.column("query_id").to_pylist() == [i + 0.5 for i in range(61)]
    assert table.column("price").to_pylist()[-1] == 60.5


def test_column_first_seen_on_a_later_line_can_be_kept(qwen3_causal, tmp_path):
    rows = [TEXT, {**TEXT, "note": "second"}, TEXT]
    out = tmp_path / "out.jsonl"
    result = score(qwen3_causal, write_jsonl(tmp_path / "in.jsonl", rows), out, "--keep-columns", "note")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["note"] for line in out.read_text().splitlines()] == [None, "second", None]


def test_column_first_seen_after_the_first_window_keeps_its_type(qwen3_causal, tmp_path):
    rows = [TEXT, TEXT, TEXT, {**TEXT, "count": 3}]
    out = tmp_path / "out.parquet"
    result = score(
        qwen3_causal,
        write_jsonl(tmp_path / "in.jsonl", rows),
        out,
        "--keep-columns",
        "count",
        "--window-rows",
        "2",
    )
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out)
    assert table.schema.field("count").type == pa.int64()
    assert table.column("count").to_pylist() == [None, None, None, 3]


def test_numbers_mixed_with_text_exit_2_before_scoring(qwen3_causal, tmp_path):
    rows = [{**TEXT, "tag": "x"}] * 3 + [{**TEXT, "tag": 4}]
    out = tmp_path / "out.parquet"
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    result = score(
        qwen3_causal, src, out, "--keep-columns", "tag", "--on-error", "record", "--window-rows", "2"
    )
    assert_clean_exit_2(result, "'tag'", "text (first on line 1)", "number (first on line 4)")
    assert not out.exists() and not Path(f"{out}.parts").exists()


def test_integer_beyond_int64_exits_2_naming_column_and_line(qwen3_causal, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps({**TEXT, "query_id": 1})
        + "\n"
        + '{"query": "q", "item": "i", "query_id": 99999999999999999999}\n'
    )
    result = score(qwen3_causal, src, tmp_path / "out.parquet")
    assert_clean_exit_2(result, "'query_id'", "line 2", "does not fit in 64 bits")


# ---------------------------------------------------------------------- JSONL: unreadable rows


def test_unparsable_lines_keep_null_ids_and_their_row_index(tmp_path):
    src = tmp_path / "in.jsonl"
    good = json.dumps({**TEXT, "query_id": "a", "item_id": "a1"})
    src.write_bytes(
        b"\n".join(
            [good.encode(), b"{broken", b"[1, 2]", b'{"query": "caf\xe9", "item": "x"}', good.encode()]
        )
        + b"\n"
    )
    source = open_source(str(src))
    mapping, rows = rows_of(source)
    assert column_types(source, mapping) == {"query_id": pa.string(), "item_id": pa.string()}
    assert [r.index for r in rows] == [0, 1, 2, 3, 4]
    assert [r.error is None for r in rows] == [True, False, False, False, True]
    for row, needle in zip(
        rows[1:4], ["line 2: not valid JSON", "line 3: not a JSON object", "line 4: not valid UTF-8"]
    ):
        assert row.error.startswith(needle)
        assert row.query_id is None and row.item_ids == [None] and row.kept == {}


def test_unparsable_lines_with_text_ids_are_recorded_and_the_run_goes_on(qwen3_causal, tmp_path):
    src = tmp_path / "in.jsonl"
    good = json.dumps({**TEXT, "query_id": "a", "item_id": "a1"}).encode()
    src.write_bytes(b"\n".join([good, b"{broken", b'{"query": "\xff", "item": "x"}', good]) + b"\n")
    out = tmp_path / "out.jsonl"
    result = score(qwen3_causal, src, out, "--on-error", "record", "--window-rows", "1")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["query_id"] for line in lines] == ["a", None, None, "a"]
    assert "line 2" in lines[1]["error"] and "line 3" in lines[2]["error"] and lines[0]["error"] is None


def test_non_utf8_line_is_a_row_error_not_a_crash(qwen3_causal, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(
        json.dumps(TEXT).encode()
        + b'\n{"query": "caf\xe9", "item": "x"}\n'
        + json.dumps(TEXT).encode()
        + b"\n"
    )
    result = score(qwen3_causal, src, tmp_path / "out.jsonl", "--on-error", "skip")
    assert result.returncode == 0, result.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
    [skipped] = [
        json.loads(line) for line in Path(f"{tmp_path / 'out.jsonl'}.errors.jsonl").read_text().splitlines()
    ]
    assert skipped["row_index"] == 1 and "line 2: not valid UTF-8" in skipped["error"]
    fail = score(qwen3_causal, src, tmp_path / "out2.jsonl")
    assert_clean_exit_2(fail, "line 2", "not valid UTF-8")


def test_byte_order_mark_is_ignored(qwen3_causal, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + json.dumps({**TEXT, "query_id": "a"}).encode() + b"\n")
    out = tmp_path / "out.jsonl"
    result = score(qwen3_causal, src, out)
    assert result.returncode == 0, result.stderr
    [line] = [json.loads(line) for line in out.read_text().splitlines()]
    assert line["query_id"] == "a" and line["score"] is not None


def test_lone_surrogate_is_a_row_error_naming_the_column(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        "\n".join(
            [
                json.dumps({**TEXT, "query_id": "a", "tag": "ok"}),
                '{"query": "q", "item": "i", "query_id": "b\\ud800", "tag": "ok"}',
                '{"query": "q", "item": "i", "query_id": "c", "tag": "x\\udfff"}',
                '{"query": "q\\ud800", "item": "i", "query_id": "d", "tag": "ok"}',
            ]
        )
        + "\n"
    )
    _, rows = rows_of(open_source(str(src)), ColumnOverrides(keep_columns=("tag",)))
    assert rows[0].error is None
    assert "'query_id'" in rows[1].error and "surrogate" in rows[1].error and rows[1].query_id is None
    assert "'tag'" in rows[2].error and rows[2].kept["tag"] is None and rows[2].query_id == "c"
    assert "'query'" in rows[3].error and "surrogate" in rows[3].error
    for row in rows:  # everything that reaches the output can be written as UTF-8
        pa.array([row.query_id, *row.kept.values()], pa.string())


def test_lone_surrogate_row_is_recorded_end_to_end(qwen3_causal, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps({**TEXT, "query_id": "a"}) + "\n" + '{"query": "q", "item": "i", "query_id": "b\\ud800"}\n'
    )
    out = tmp_path / "out.parquet"
    result = score(qwen3_causal, src, out, "--on-error", "record")
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out)
    assert table.column("query_id").to_pylist() == ["a", None]
    assert "'query_id'" in table.column("error")[1].as_py()


# ---------------------------------------------------------------------------------- stdin


def test_stdin_is_spooled_typed_from_every_line_and_the_spool_removed(qwen3_causal, tmp_path, monkeypatch):
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_dir))
    stdin = json.dumps(TEXT) + "\n" + json.dumps({**TEXT, "note": "late"}) + "\nnot json\n"
    result = run_cli(
        "-", "-o", "-", "--model", qwen3_causal, *LABEL_FLAGS, "--quiet", "--keep-columns", "note",
        "--on-error", "record", stdin=stdin,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["note"] for line in lines] == [None, "late", None]
    assert lines[2]["score"] is None and "line 3: not valid JSON" in lines[2]["error"]
    gc.collect()
    assert list(spool_dir.iterdir()) == []


# --------------------------------------------------------------------------- nested items


def test_null_missing_or_empty_items_are_row_errors(tmp_path):
    rows = [
        {"query": "q", "items": ["a", "b"]},
        {"query": "q", "items": None},
        {"query": "q"},
        {"query": "q", "items": []},
        {"query": "q", "items": "a"},
    ]
    _, read = rows_of(open_source(str(write_jsonl(tmp_path / "in.jsonl", rows))))
    assert [r.error for r in read] == [
        None,
        "column 'items' is null",
        "column 'items' is null",
        "column 'items' is an empty list (no items to score)",
        "column 'items' is not a list",
    ]
    assert [len(r.item_ids) for r in read] == [2, 1, 1, 1, 1]  # every row reaches the output


@pytest.mark.parametrize("mode", ["record", "skip", "fail"])
def test_null_items_row_is_accounted_for_under_every_mode(qwen3_causal, tmp_path, mode):
    rows = [{"query": "I pledge allegiance", "items": [" to", " the"]}, {"query": "Tokyo is", "items": None}]
    out = tmp_path / "out.jsonl"
    result = score(qwen3_causal, write_jsonl(tmp_path / "in.jsonl", rows), out, "--on-error", mode)
    if mode == "fail":
        assert_clean_exit_2(result, "row 1", "column 'items' is null")
        return
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    if mode == "record":
        ids = [line["query_id"] for line in lines]  # generated from each query's text (docs/ranking.md)
        assert ids[0] == ids[1] != ids[2] and [line["item_id"] for line in lines] == [0, 1, None]
        assert "column 'items' is null" in lines[2]["error"] and lines[2]["score"] is None
    else:
        assert len(lines) == 2
        [skipped] = [json.loads(line) for line in Path(f"{out}.errors.jsonl").read_text().splitlines()]
        assert skipped["row_index"] == 1 and "column 'items' is null" in skipped["error"]


# ---------------------------------------------------------------------------- keep columns


@pytest.mark.parametrize(
    "keep, needle",
    [
        ("query_id", "'query_id' is already in the output as query_id"),
        ("item_id", "'item_id' is already in the output as item_id"),
        ("tag,tag", "'tag' twice"),
        ("row_index", "would overwrite"),
    ],
)
def test_keep_columns_naming_an_output_column_exits_2(qwen3_causal, tmp_path, keep, needle):
    rows = [{**TEXT, "query_id": "a", "item_id": "a1", "tag": 1, "row_index": 0}]
    result = score(
        qwen3_causal, write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "o.jsonl", "--keep-columns", keep
    )
    assert_clean_exit_2(result, needle)


def test_keep_columns_naming_a_renamed_id_column_is_refused():
    overrides = ColumnOverrides(query_id_col="qid", keep_columns=("qid",))
    with pytest.raises(InputError, match="'qid' is already in the output as query_id"):
        resolve_columns(["query", "item", "qid"], overrides, "in.jsonl")


# ------------------------------------------------------------------------------ empty input


def test_empty_jsonl_maps_from_the_flags(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n\n")
    source = open_source(str(src))
    mapping, rows = rows_of(source, ColumnOverrides(keep_columns=("tag",)))
    assert (mapping.layout, mapping.query, mapping.items, mapping.keep) == ("long", "query", "item", ("tag",))
    assert rows == [] and column_types(source, mapping) == {"tag": pa.null()}


def test_empty_jsonl_writes_an_empty_output(qwen3_causal, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("")
    out = tmp_path / "out.parquet"
    result = score(qwen3_causal, src, out)
    assert result.returncode == 0, result.stderr
    assert pq.read_table(out).num_rows == 0


def test_null_query_id_in_a_text_id_column_does_not_change_its_type(qwen3_causal, tmp_path):
    rows = [{**TEXT, "query_id": "a"}, {**TEXT, "query_id": None}, {**TEXT, "query_id": "a"}]
    out = tmp_path / "out.parquet"
    result = score(qwen3_causal, write_jsonl(tmp_path / "in.jsonl", rows), out, "--on-error", "record")
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out)
    assert table.schema.field("query_id").type == pa.string()
    ids = table.column("query_id").to_pylist()
    assert ids[0] == ids[2] == "a" and ids[1] != "a"


# Paths: nothing the run writes may touch what it reads, or another thing it writes.

PATH_ROWS = [
    {"query": "I pledge allegiance", "item": " to"},
    {"query": None, "item": " the"},
]


@pytest.mark.parametrize(
    "flags, clash",
    [
        (["--on-error", "skip", "--errors-file", "{input}"], "input file"),
        (["--on-error", "skip", "--errors-file", "{out}"], "same path"),
        (["--report", "{out}"], "same path"),
        (["--report", "{input}", "--overwrite"], "input file"),
        (["-o", "{tmp}/sub/../in.jsonl", "--overwrite"], "input file"),
        (["-o", "{tmp}/link.jsonl", "--overwrite"], "input file"),
        (["-o", "{tmp}/data/scores.parquet"], "input directory"),
    ],
)
def test_written_paths_never_touch_read_paths(qwen3_causal, tmp_path, flags, clash):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    pq.write_table(pa.Table.from_pylist(PATH_ROWS), data_dir / "part.parquet")
    (tmp_path / "sub").mkdir()
    data = write_jsonl(tmp_path / "in.jsonl", PATH_ROWS)
    (tmp_path / "link.jsonl").symlink_to(data)
    before = data.read_bytes()
    filled = [f.format(input=data, out=tmp_path / "out.parquet", tmp=tmp_path) for f in flags]
    source = data_dir if "input directory" == clash else data
    if "-o" not in filled:
        filled += ["-o", str(tmp_path / "out.parquet")]
    if "--on-error" not in filled:
        filled += ["--on-error", "record"]
    result = run_cli(source, *filled, "--model", qwen3_causal, *LABEL_FLAGS)
    assert result.returncode == 2, result.stderr
    assert clash in result.stderr and "Traceback" not in result.stderr
    assert data.read_bytes() == before
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("side", ["--errors-file", "--report"])
def test_existing_side_files_need_overwrite(qwen3_causal, tmp_path, side):
    data = write_jsonl(tmp_path / "in.jsonl", PATH_ROWS)
    existing = tmp_path / "keep.json"
    existing.write_text('{"status": "succeeded"}')
    flags = ["--on-error", "skip" if side == "--errors-file" else "record"]
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, *flags, side, existing]
    refused = run_cli(*base, "-o", tmp_path / "o.parquet")
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert existing.read_text() == '{"status": "succeeded"}'
    assert run_cli(*base, "-o", tmp_path / "o.parquet", "--overwrite").returncode == 0
    assert existing.read_text() != '{"status": "succeeded"}'


def test_output_that_is_a_directory_and_dry_run_checks(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PATH_ROWS)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS]
    (tmp_path / "dir.parquet").mkdir()
    assert "is a directory" in run_cli(*base, "-o", tmp_path / "dir.parquet").stderr
    (tmp_path / "exists.parquet").write_bytes(b"old")
    dry = run_cli(*base, "-o", tmp_path / "exists.parquet", "--dry-run")
    assert dry.returncode == 2 and "--overwrite" in dry.stderr
    missing = run_cli(*base, "-o", tmp_path / "nowhere" / "o.parquet", "--dry-run")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_overwrite_rerun_removes_the_stale_errors_file(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PATH_ROWS)
    out = tmp_path / "o.parquet"
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "-o", out]
    assert run_cli(*base, "--on-error", "skip").returncode == 0
    assert (tmp_path / "o.parquet.errors.jsonl").exists()
    rerun = run_cli(*base, "--on-error", "record", "--overwrite")
    assert rerun.returncode == 0, rerun.stderr
    assert not (tmp_path / "o.parquet.errors.jsonl").exists()
    assert pq.read_table(out).column("error").null_count == 1
