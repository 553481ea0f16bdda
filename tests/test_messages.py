"""Messages that point the right way: each names the flag or path that fixes it, one line, exit 2; empty
queries and items are scored and counted in one warning; the Python API's names import from score_batch."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from score_batch.io_formats.readers import open_source, read_windows
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.report import RunReport
from score_batch.job.runners.phase import ScoredWindow, ScoringPhase
from score_batch.job.windows import empty_counts
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_phase import RecordingSink, config


def refused(tmp_path, model, rows, *flags, fresh_process=False) -> str:
    """The one error line of a run that must exit 2 (no traceback)."""
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    flags = flags if "-o" in flags else (*flags, "-o", tmp_path / "o.parquet")
    ran = run_cli(src, "--model", model, *LABEL_FLAGS, *flags, fresh_process=fresh_process)
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr
    errors = [line for line in ran.stderr.splitlines() if line.startswith("score-batch: error:")]
    assert len(errors) == 1, ran.stderr
    return errors[0]


def test_no_item_column_names_the_flags(qwen3_causal, tmp_path):
    line = refused(tmp_path, qwen3_causal, [{"query": "q", "body": "b"}])
    assert "no item column" in line and "--item-col" in line and "--items-col" in line and "'body'" in line


@pytest.mark.parametrize("flag", ["--item-col", "--query-col", "--query-id-col", "--item-id-col"])
def test_a_missing_mapped_column_names_its_flag(qwen3_causal, tmp_path, flag):
    line = refused(tmp_path, qwen3_causal, [{"query": "q", "item": "i"}], flag, "nope")
    assert f"column 'nope' (given with {flag}) is not in the input" in line


def test_an_unknown_flag_suggests_the_one_it_begins(qwen3_causal, tmp_path):
    # the command line's own parser: a fresh process, as a user runs it
    line = refused(tmp_path, qwen3_causal, [{"query": "q", "item": "i"}], "--pooled", fresh_process=True)
    assert "did you mean --pooled-hidden-states?" in line and "--profile" not in line


def test_an_output_under_a_file_says_the_file_is_in_the_way(qwen3_causal, tmp_path):
    (tmp_path / "afile").write_text("x")
    for output in ("afile/x.parquet", "afile/sub/x.parquet"):
        line = refused(tmp_path, qwen3_causal, [{"query": "q", "item": "i"}], "-o", tmp_path / output)
        assert f"{str(tmp_path / 'afile')!r} is a file, not a directory" in line
        assert "does not exist" not in line


def test_a_report_under_a_file_says_so(qwen3_causal, tmp_path):
    (tmp_path / "afile").write_text("x")
    line = refused(
        tmp_path, qwen3_causal, [{"query": "q", "item": "i"}], "--report", tmp_path / "afile/r.json"
    )
    assert "is a file, not a directory" in line


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_where_no_file_can_be_created_is_one_line_exit_2(qwen3_causal, tmp_path):
    line = refused(tmp_path, qwen3_causal, [{"query": "q", "item": "i"}], "-o", "/proc/x.parquet")
    assert "output '/proc/x.parquet': no file can be created in '/proc'" in line


def test_empty_queries_and_items_are_counted_from_the_rows_read(tmp_path):
    rows = [
        {"query": "", "item": "a"},
        {"query": "q", "item": ""},
        {"query": "", "item": ""},
        {"query": "q", "item": "b"},
        {"query": " ", "item": "c"},  # whitespace is text: not empty
    ]
    source = open_source(str(write_jsonl(tmp_path / "in.jsonl", rows)))
    _, windows = read_windows(source, ColumnOverrides(), 2)
    assert [empty_counts(window) for window in windows] == [(1, 1), (1, 1), (0, 0)]
    source.close()


def test_empty_queries_and_items_are_scored_and_warned_about_with_their_count(caplog):
    report = RunReport()
    with caplog.at_level(logging.WARNING, logger="score_batch.job.runners.phase"):
        with ScoringPhase(config(), report, RecordingSink()) as phase:
            phase.add(ScoredWindow(4, 4, 0, empty_queries=1, empty_items=2))
            phase.add(ScoredWindow(3, 3, 0, empty_items=1))
            phase.commit()
    assert (report.empty_queries, report.empty_items, report.items_scored) == (1, 3, 7)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "1 of 7 rows have an empty query and 3 of 7 items are empty; scored as given, around their templates "
        "(docs/semantics.md: empty queries and items)"
    ]


def test_group_and_its_result_import_from_the_package():
    from score_batch import Group, GroupResult
    from score_batch.engine.types import Group as EngineGroup

    assert Group is EngineGroup and GroupResult.__name__ == "GroupResult"
    assert Group("q", ["a"]).items == ["a"]
