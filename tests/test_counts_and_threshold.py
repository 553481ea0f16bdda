"""The report's counts an alert can trust (items scored now, copies, rows written) and the failure threshold
(--max-failed-rate: exit 4 with the output written)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from score_batch.errors import EXIT_TOO_MANY_FAILED, TooManyFailed, exit_code
from score_batch.job.report import REPORT_VERSION
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import many_rows


def scored(tmp_path, model, rows, *flags, out="o.parquet"):
    """Run the command on rows with a report; (exit code, stderr, report, output path)."""
    src, report, output = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "r.json", tmp_path / out
    ran = run_cli(src, "-o", output, "--model", model, *LABEL_FLAGS, "--report", report, *flags)
    return ran.returncode, ran.stderr, json.loads(report.read_text()), output


def test_too_many_failed_has_its_own_exit_code():
    assert EXIT_TOO_MANY_FAILED == 4 and exit_code(TooManyFailed("x")) == 4


def test_a_run_where_every_item_failed_exits_4_after_writing_its_output(qwen3_causal, tmp_path):
    rows = many_rows(2, 3)
    code, stderr, report, out = scored(
        tmp_path, qwen3_causal, rows, "--on-error", "record", "--max-item-tokens", "2"
    )
    assert code == 4, stderr
    assert report["status"] == "failed" and report["exit_code"] == 4 and report["items_failed"] == 6
    assert report["error"].startswith("TooManyFailed: all 6 items failed")
    table = pq.read_table(out)  # everything scored is written: each row with its error
    assert table.num_rows == 6 and table["error"].null_count == 0
    assert [line for line in stderr.splitlines() if "error:" in line] == [
        f"score-batch: error: all 6 items failed (--max-failed-rate sets the share a run may fail); "
        f"{str(out)!r} is written, with their errors"
    ]


@pytest.mark.parametrize(("rate", "code"), [(None, 0), ("0.2", 4), ("0.25", 0), ("0", 4), ("1", 0)])
def test_max_failed_rate_is_the_largest_share_that_passes(qwen3_causal, tmp_path, rate, code):
    rows = many_rows(2, 4)
    for row in rows[:2]:  # 2 of 8 items (25%) over --max-item-tokens
        row["item"] = " word" * 60
    flags = ["--on-error", "skip", "--max-item-tokens", "40"] + (["--max-failed-rate", rate] if rate else [])
    returncode, stderr, report, out = scored(tmp_path, qwen3_causal, rows, *flags)
    assert returncode == code, stderr
    assert report["status"] == ("succeeded" if code == 0 else "failed")
    assert pq.read_table(out).num_rows == 6 == report["rows_written"]  # written either way
    if code:
        assert f"2 of 8 items failed (25.0%), more than --max-failed-rate {rate} allows" in report["error"]


def test_max_failed_rate_outside_0_to_1_is_a_usage_error(qwen3_causal, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", many_rows(1, 1))
    ran = run_cli(src, "-o", tmp_path / "o.parquet", "--model", qwen3_causal, "--max-failed-rate", "1.5")
    assert ran.returncode == 2
    assert "--max-failed-rate 1.5 must be a fraction from 0 to 1" in ran.stderr


def test_items_scored_counts_only_what_ran_and_rows_written_what_top_k_kept(qwen3_causal, tmp_path):
    rows = many_rows(3, 4)
    rows.append(dict(rows[0], item_id="copy"))  # a repeat of a pair: copied, not scored
    code, stderr, report, out = scored(tmp_path, qwen3_causal, rows, "--top-k", "2")
    assert code == 0, stderr
    assert report["report_version"] == REPORT_VERSION == 3 and "windows" not in report
    assert (report["items"], report["items_scored"], report["duplicates"]) == (13, 12, 1)
    assert report["items"] == report["items_scored"] + report["items_failed"] + report["duplicates"]
    assert report["rows_written"] == pq.read_table(out).num_rows == 6
    assert "; wrote 6 rows, the best 2 of each query;" in stderr
