"""JSON lines nested deeper than the reader takes (io_formats/arrow_types.MAX_DEPTH): that row's error under
--on-error record/skip, one `score-batch: error:` line under fail, in a column the run does not read or in
the item column, whatever Python's recursion limit; nested values are walked without recursion."""

from __future__ import annotations

import json
import sys

import pytest

from score_batch.io_formats.arrow_types import MAX_DEPTH
from score_batch.io_formats.batch_requests import parse_request
from score_batch.io_formats.jsonl import parse_line
from score_batch.io_formats.rows import BadLine, has_surrogate
from tests.test_cli import LABEL_FLAGS, run_cli

DEPTHS = (700, 1500, 100_000)
COLUMNS = ("junk", "item")  # a column the run does not read, and the item column
CASES = [(depth, column) for depth in DEPTHS for column in COLUMNS]


def deep_line(depth: int, column: str) -> str:
    """A row whose `column` holds arrays nested depth levels deep."""
    deep = "[" * depth + "]" * depth
    if column == "item":
        return '{"query": "q one", "item": ' + deep + "}"
    return '{"query": "q one", "item": " the", "junk": ' + deep + "}"


def deep_input(path, cases) -> list[int]:
    """Clean rows around a deep line per (depth, column); the deep lines' row indexes."""
    lines = [json.dumps({"query": "q two", "item": " to"})]
    for depth, column in cases:
        lines += [deep_line(depth, column), json.dumps({"query": "q one", "item": " flag"})]
    path.write_text("\n".join(lines) + "\n")
    return list(range(1, len(lines), 2))


def score(model, source, out, mode):
    return run_cli(source, "-o", out, "--model", model, *LABEL_FLAGS, "--quiet", "--on-error", mode)


@pytest.mark.parametrize("mode", ["record", "skip", "record, recursion limit 10**6"])
def test_a_line_nested_too_deeply_is_that_rows_error(qwen3_causal, tmp_path, mode):
    deep = deep_input(tmp_path / "in.jsonl", CASES)
    limit = sys.getrecursionlimit()
    try:  # json.loads would take such a line then, and recurse once a level: the reader counts first
        if "limit" in mode:
            sys.setrecursionlimit(10**6)
        result = score(qwen3_causal, tmp_path / "in.jsonl", tmp_path / "out.jsonl", mode.split(",")[0])
    finally:
        sys.setrecursionlimit(limit)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    failed = rows if "record" in mode else []
    if "skip" in mode:
        failed = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()]
        assert len(rows) == 7 and all(row["score"] is not None for row in rows)
    else:
        assert [k for k, row in enumerate(rows) if row["error"]] == deep
    errors = [row["error"] for row in failed if row["error"]]
    expected = [f"line {k + 1}: nested {depth + 1} levels deep" for k, (depth, _) in zip(deep, CASES)]
    assert [error.split(" (")[0].split(": ", 1)[1] for error in errors] == expected


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("column", COLUMNS)
def test_a_line_nested_too_deeply_under_fail_is_one_error_line(qwen3_causal, tmp_path, depth, column):
    deep_input(tmp_path / "in.jsonl", [(depth, column)])
    result = score(qwen3_causal, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "fail")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("score-batch: error:")]
    assert f"row 1: line 2: nested {depth + 1} levels deep" in line and f"at most {MAX_DEPTH}" in line
    assert not (tmp_path / "out.jsonl").exists()


def test_the_reader_takes_a_line_of_max_depth_and_refuses_one_level_more():
    def line(depth):  # the line's object is its first level
        return ('{"junk": ' + "[" * (depth - 1) + "]" * (depth - 1) + ', "s": "[[[{{{"}').encode()

    assert parse_line(line(MAX_DEPTH), "1") == {"junk": json.loads(line(MAX_DEPTH))["junk"], "s": "[[[{{{"}
    assert parse_line(line(MAX_DEPTH + 1), "1") == BadLine(
        "1",
        f"nested {MAX_DEPTH + 1} levels deep (arrays and objects); score-batch reads at most {MAX_DEPTH} levels",
    )
    escaped = (
        b'{"s": "\\"' + b"[" * 1000 + b'"}'
    )  # brackets inside a string (after an escaped quote) nest nothing
    assert parse_line(escaped, "1") == json.loads(escaped)


def test_brackets_after_an_unterminated_string_are_its_text_not_nesting():
    unterminated = parse_line(b'{"query": "q one", "item": "x' + b"[" * 300, "1")
    assert unterminated.message.startswith("not valid JSON (Unterminated string"), unterminated
    deep_first = b'{"junk": ' + b"[" * 300 + b'"x'  # nested too deeply before the string
    assert parse_line(deep_first, "1").message.startswith("nested 301 levels deep")


def test_a_batch_request_nested_too_deeply_is_that_requests_error():
    request = parse_request(b'{"custom_id": "a", "junk": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 3, 0)
    assert request.error is not None and request.error.message.startswith("line 3: nested 100001 levels deep")


def test_nested_values_are_walked_without_recursion():
    value: list = ["\ud800"]  # a lone surrogate at the bottom of 100,000 levels
    for _ in range(100_000):
        value = [value]
    assert has_surrogate(value)
    clean: dict = {"k": "text"}
    for _ in range(100_000):
        clean = {"k": [clean]}
    assert not has_surrogate(clean)
