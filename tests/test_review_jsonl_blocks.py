"""JSONL blocks parsed by pyarrow (io_formats/window.json_window) give each line's row, values and error as Python's
json reads that line alone: lines pyarrow's parser takes and Python's refuses (-NaN, Inf, deep nesting, an object
over two lines beside two objects on one line) and escapes both take (pairs, an escaped backslash, NUL)."""

from __future__ import annotations

import json
import math
import random

import pytest

from score_batch.io_formats import readers
from score_batch.io_formats.readers import column_types, input_mapping, open_source
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.io_formats.window import json_window
from tests.test_columnar_reader import as_rows, record_path_rows, window_rows

KEEP = ColumnOverrides(keep_columns=("n", "meta"))
ROW = b'{"query": "q", "item": "x", "item_id": 9, "n": 2.5, "meta": {"x": 2}'  # its closing brace left off


def clean(count: int) -> list[bytes]:
    rows = [{"query": "q", "item": f"i{k}", "item_id": k, "n": 1.5, "meta": {"x": 1}} for k in range(count)]
    return [json.dumps(row).encode() for row in rows]


def assert_line_rows(tmp_path, lines: list[bytes]) -> list:
    """The rows of clean lines around these, read in blocks of every size, equal the line by line rows."""
    (tmp_path / "in.jsonl").write_bytes(b"\n".join([*clean(3), *lines, *clean(3)]) + b"\n")
    source = open_source(str(tmp_path / "in.jsonl"))
    expected = record_path_rows(source, KEEP)
    for size in (1, 2, 100):
        assert window_rows(source, KEEP, size) == expected
    return expected


NOT_PYTHON_JSON = {  # pyarrow's parser reads these lines, Python's json refuses them
    "-NaN in a column nobody reads": ROW + b', "junk": -NaN}',
    "Inf in a column nobody reads": ROW + b', "junk": Inf}',
    "-Inf in a list nobody reads": ROW + b', "junk": [1, -Inf]}',
    "-NaN in a kept column": ROW.replace(b'"n": 2.5', b'"n": -NaN') + b"}",
    "Inf in a kept column": ROW.replace(b'"n": 2.5', b'"n": Inf') + b"}",
    "arrays nested past Python's recursion limit": ROW + b', "junk": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    "objects nested past Python's recursion limit": ROW
    + b', "junk": '
    + b'{"a": ' * 3000
    + b"1"
    + b"}" * 3001,
}


@pytest.mark.parametrize("name", NOT_PYTHON_JSON)
def test_a_line_python_json_refuses_is_that_rows_error(tmp_path, name):
    rows = assert_line_rows(tmp_path, [NOT_PYTHON_JSON[name]])
    why = "line 4: nested 3001 levels deep" if "nested" in name else "line 4: not valid JSON"
    assert rows[3].error.startswith(why)


def test_an_object_over_two_lines_beside_two_objects_on_one_line_are_three_errors(tmp_path):
    """pyarrow reads the three lines as three objects (the count of lines): the rows would shift by one."""
    for gap in (b" ", b"\r", b"\t"):
        rows = assert_line_rows(tmp_path, [b'{"query": "a",', b'"item": "b"}', ROW + b"}" + gap + ROW + b"}"])
        assert [row.error[:22] for row in rows[3:6]] == [f"line {k}: not valid JSON" for k in (4, 5, 6)]
        assert [row.error for row in rows[:3] + rows[6:]] == [None] * 6


def test_two_objects_on_a_line_before_an_object_over_two_lines(tmp_path):
    """The other order, and a line with an object's end and the next one's start (four objects: the count sees)."""
    lines = [ROW + b"} " + ROW + b"}", b'{"query": "a",', b'"item": "b"}']
    rows = assert_line_rows(tmp_path, lines)
    assert all(row.error.startswith(f"line {k}: not valid JSON") for k, row in zip((4, 5, 6), rows[3:6]))
    lines = [ROW + b"} " + ROW + b"}", ROW + b', "n2": 1} {"query": "a",', b'"item": "b"}']
    rows = assert_line_rows(tmp_path, lines)
    assert all(row.error.startswith(f"line {k}: not valid JSON") for k, row in zip((4, 5, 6), rows[3:6]))


ESCAPES = {  # both parsers read these the same: the block path may take them
    "escaped backslash then ud800": (b'"\\\\ud800"', "\\ud800"),
    "surrogate pair": (b'"\\ud83d\\ude00"', "\U0001f600"),
    "upper-case pair": (b'"\\uD83D\\uDE00"', "\U0001f600"),
    "NUL": (b'"a\\u0000b"', "a\0b"),
    "UTF-8 beyond ASCII": ('"h\u00e9 \U0001f600 \u2028"'.encode(), "h\u00e9 \U0001f600 \u2028"),
    "escaped slash": (b'"a\\/b"', "a/b"),
}


@pytest.mark.parametrize("name", ESCAPES)
def test_escapes_both_parsers_read_take_the_block_path(tmp_path, name):
    raw, text = ESCAPES[name]
    line = ROW.replace(b'"item": "x"', b'"item": ' + raw) + b', "j\\u00fcnk": ' + raw + b"}"
    rows = assert_line_rows(tmp_path, [line])
    assert rows[3].items == [text] and rows[3].error is None
    source = open_source(str(tmp_path / "in.jsonl"))
    mapping = input_mapping(source, KEEP)
    assert json_window(0, [*clean(2), line], {}, mapping, column_types(source, mapping)) is not None


LONE = {  # a lone surrogate, however it comes, read or not: the line by line path decides
    "lone high in the item": ROW.replace(b'"item": "x"', b'"item": "\\ud800"') + b"}",
    "lone low in the item": ROW.replace(b'"item": "x"', b'"item": "\\udc00"') + b"}",
    "pair in the wrong order": ROW.replace(b'"item": "x"', b'"item": "\\udc00\\ud800"') + b"}",
    "high then a letter": ROW.replace(b'"item": "x"', b'"item": "\\ud800\\u0041"') + b"}",
    "lone in a key": ROW + b', "\\ud800": 1}',
    "lone in a key of a kept struct": ROW.replace(b'{"x": 2}', b'{"x": 2, "\\udfff": 1}') + b"}",
    "lone in a kept struct's value": ROW.replace(b'{"x": 2}', b'{"x": 2, "y": "\\udbff"}') + b"}",
    "lone nested in a column nobody reads": ROW + b', "junk": {"a": [1, "\\uDC00"]}}',
    "CESU-8 surrogate bytes in the item": ROW.replace(b'"item": "x"', b'"item": "\xed\xa0\x80"') + b"}",
    "CESU-8 surrogate bytes nobody reads": ROW + b', "junk": "\xed\xa0\x80"}',
    "overlong UTF-8 in the item": ROW.replace(b'"item": "x"', b'"item": "\xc0\xaf"') + b"}",
    "overlong UTF-8 nobody reads": ROW + b', "junk": "\xe0\x80\xaf"}',
}


@pytest.mark.parametrize("name", LONE)
def test_lone_surrogates_and_bad_utf8_anywhere_give_the_line_rows(tmp_path, name):
    assert_line_rows(tmp_path, [LONE[name]])


def test_python_json_numbers_give_the_line_rows(tmp_path):
    lines = [
        ROW.replace(b'"n": 2.5', b'"n": ' + number) + b"}"
        for number in (
            b"NaN",
            b"Infinity",
            b"-Infinity",
            b"1e400",
            b"-0",
            b"0.1000000000000000055511151231257827",
        )
    ]
    lines += [ROW + b', "junk": ' + number + b"}" for number in (b"NaN", b"-Infinity", b"1" * 40, b"1e400")]
    lines.append(ROW + b', "junk": "Inf", "info": ": Inf, -NaN"}')  # in text: no number
    lines.append(b" " * 3 + ROW + b"}\r")
    assert_line_rows(tmp_path, lines)


def test_a_very_long_line(tmp_path):
    rows = assert_line_rows(
        tmp_path, [ROW.replace(b'"item": "x"', b'"item": "' + b"ab" * 2_000_000 + b'"') + b"}"]
    )
    assert len(rows[3].items[0]) == 4_000_000


def test_clean_blocks_with_crlf_indents_and_brackets_stay_columnar(tmp_path):
    """The checks send only the lines above to the line by line path: CRLF, indented lines, many rows with
    lists and objects, 'Infinity' and 'Inf' in text still parse as one block."""
    rows = [
        {
            "query": "Inf: Infinity",
            "item": f"i{k}",
            "item_id": k,
            "n": -1e308,
            "meta": {"x": [k], "y": {"z": [[k]]}},
        }
        for k in range(300)
    ]
    lines = [b"  " + json.dumps(row).encode() + b" \r\n" for row in rows]
    lines[7] = lines[7].replace(b"-1e+308", b"-Infinity")
    (tmp_path / "in.jsonl").write_bytes(b"".join(lines))
    source = open_source(str(tmp_path / "in.jsonl"))
    mapping = input_mapping(source, KEEP)
    window = json_window(0, lines, {}, mapping, column_types(source, mapping))
    assert window is not None and as_rows(window) == record_path_rows(source, KEEP)
    assert as_rows(window)[7].kept["n"] == float("-inf")


FRAGMENTS = [  # pieces of objects a block parser could join across lines, or split within one
    b'{"query": "a",',
    b'"item": "b"}',
    b'"item": "b"} {"query": "c",',
    b'"item": "b"}, {"query": "c",',
    b"{",
    b"}",
    b'"n": 1}',
    b'{"query": "a", "item": "b", "meta": {"x": 1}',
    b'{"query": "a", "item": "b"} {"query": "c", "item": "d"}',
    b'{"query": "a", "item": "b"}\r{"query": "c", "item": "d"}',
    b'{"query": "a", "item": "b"}{"query": "c", "item": "d"}',
    b'{"query": "a", "item": "b", "n": -NaN}',
    b'{"query": "a", "item": "b", "n": Inf}',
    b'{"query": "a", "item": "b", "junk": ' + b"[" * 1500 + b"]" * 1500 + b"}",
    b'[{"query": "a", "item": "b"}]',
    b'"x"',
]


@pytest.mark.parametrize("seed", range(12))
def test_fragments_joined_or_split_by_the_block_parser_give_the_line_rows(tmp_path, monkeypatch, seed):
    """Small blocks (where a line of two objects and an object over two lines meet in one) of random lines."""
    rng = random.Random(seed)
    monkeypatch.setattr(readers, "BATCH_ROWS", rng.choice([2, 3, 4, 7]))
    lines = [
        rng.choice(FRAGMENTS)
        if rng.random() < 0.5
        else ROW.replace(b'"item": "x"', b'"item": "i%d"' % k) + b"}"
        for k in range(rng.randint(5, 60))
    ]
    assert_line_rows(tmp_path, lines)


def test_an_integer_minus_zero_in_a_float_column_is_zero_as_python_reads_it(tmp_path):
    """JSON's -0 is the integer 0 to Python's json (a float column holds 0.0); pyarrow read it as -0.0."""
    lines = [ROW.replace(b'"n": 2.5', b'"n": ' + number) + b"}" for number in (b"-0", b"-0.0", b"-0e1", b"0")]
    expected = assert_line_rows(tmp_path, lines)  # == takes -0.0 for 0.0: the signs are compared here
    rows = window_rows(open_source(str(tmp_path / "in.jsonl")), KEEP, 100)
    signs = [[math.copysign(1, row.kept["n"]) for row in got[3:7]] for got in (rows, expected)]
    assert signs == [[1, -1, -1, 1]] * 2
