"""--quiet hides progress and the summary only: failed and skipped rows are always reported, and a run with
failed items ends with one warning line that counts them."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl


def rows(n: int = 12, bad: tuple[int, ...] = (5,)) -> list[dict]:
    """n long-layout rows, the ones in bad with a null item (a row error)."""
    out = []
    for i in range(n):
        item = None if i in bad else f" item {i}"
        out.append({"query_id": f"q{i % 3}", "query": "Tokyo is a city in", "item_id": f"i{i}", "item": item})
    return out


def warnings(stderr: str) -> list[str]:
    """The WARNING lines of a text log."""
    return [line for line in stderr.splitlines() if line.startswith("score-batch: WARNING: ")]


@pytest.fixture
def data(tmp_path):
    return write_jsonl(tmp_path / "in.jsonl", rows())


@pytest.mark.parametrize("rank", [False, True])
def test_quiet_skip_to_stdout_reports_the_skipped_row_and_the_count(qwen3_causal, data, rank):
    flags = ["--rank"] if rank else []
    result = run_cli(
        data, "--model", qwen3_causal, *LABEL_FLAGS, "-q", "--on-error", "skip", "-o", "-", *flags
    )
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(printed) == 11 and "i5" not in {row["item_id"] for row in printed}
    lines = warnings(result.stderr)
    assert len(lines) == 2 and len(result.stderr.splitlines()) == 2  # the row, then the count; no summary
    skipped = json.loads(lines[0].split("skipped ", 1)[1])
    assert skipped["row_index"] == 5 and skipped["item_id"] == "i5" and "null" in skipped["error"]
    assert "1 of 12 items failed" in lines[1] and "--errors-file" in lines[1]


def test_quiet_skip_to_a_file_lists_rows_in_the_errors_file_and_warns_once(qwen3_causal, data, tmp_path):
    out = tmp_path / "o.parquet"
    result = run_cli(data, "--model", qwen3_causal, *LABEL_FLAGS, "-q", "--on-error", "skip", "-o", out)
    assert result.returncode == 0, result.stderr
    assert pq.read_table(out).num_rows == 11
    listed = [json.loads(line) for line in (tmp_path / "o.parquet.errors.jsonl").read_text().splitlines()]
    assert [row["row_index"] for row in listed] == [5]
    assert result.stderr.splitlines() == warnings(result.stderr)
    (line,) = warnings(result.stderr)
    assert "1 of 12 items failed" in line and str(tmp_path / "o.parquet.errors.jsonl") in line


def test_errors_file_with_stdout_and_quiet(qwen3_causal, data, tmp_path):
    listed = tmp_path / "errors.jsonl"
    result = run_cli(
        data,
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "-q",
        "--on-error",
        "skip",
        "--errors-file",
        listed,
        "-o",
        "-",
    )
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["row_index"] for line in listed.read_text().splitlines()] == [5]
    (line,) = result.stderr.splitlines()
    assert "1 of 12 items failed" in line and str(listed) in line


def test_quiet_record_warns_with_the_count(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", rows(bad=(2, 7)))
    result = run_cli(data, "--model", qwen3_causal, *LABEL_FLAGS, "-q", "--on-error", "record", "-o", "-")
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["item_id"] for row in printed if row["error"]] == ["i2", "i7"]
    (line,) = result.stderr.splitlines()
    assert "WARNING" in line and "2 of 12 items failed" in line


def test_one_warning_without_quiet_and_none_for_a_clean_run(qwen3_causal, data, tmp_path):
    loud = run_cli(
        data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "skip", "-o", tmp_path / "a.parquet"
    )
    assert loud.returncode == 0, loud.stderr
    assert (
        len(warnings(loud.stderr)) == 1 and "score-batch: scored 11 items" in loud.stderr
    )  # and the summary
    clean = write_jsonl(tmp_path / "clean.jsonl", rows(bad=()))
    quiet = run_cli(clean, "--model", qwen3_causal, *LABEL_FLAGS, "-q", "-o", "-")
    assert quiet.returncode == 0 and quiet.stderr == "" and len(quiet.stdout.splitlines()) == 12


def test_a_dry_run_warns_about_the_items_that_would_fail(qwen3_causal, data, tmp_path):
    result = run_cli(
        data, "--model", qwen3_causal, *LABEL_FLAGS, "-q", "--on-error", "skip", "--dry-run", "-o", "-"
    )
    assert result.returncode == 0, result.stderr
    (line,) = warnings(result.stderr)
    assert "dry run: 1 of 12 items would fail" in line


def test_a_batch_file_under_quiet_names_the_failed_request_and_counts_once(qwen3_causal, tmp_path):
    requests = [
        {
            "custom_id": "r1",
            "method": "POST",
            "url": "/v1/rerank",
            "body": {"query": "q", "documents": [" a"]},
        },
        {"custom_id": "r2", "method": "POST", "url": "/v1/rerank", "body": {"query": "q"}},
    ]
    data = write_jsonl(tmp_path / "batch.jsonl", requests)
    result = run_cli(data, "--model", qwen3_causal, *LABEL_FLAGS, "-q", "-o", "-")
    assert result.returncode == 0, result.stderr
    lines = warnings(result.stderr)
    assert len(lines) == 2 and "'r2'" in lines[0] and "1 of 2 requests failed" in lines[1]


@pytest.mark.parametrize("mode", ["record", "fail"])
def test_an_errors_file_outside_skip_is_named_as_unwritten(qwen3_causal, data, tmp_path, mode):
    listed, out = tmp_path / "errors.jsonl", tmp_path / "o.parquet"
    flags = ["--model", qwen3_causal, *LABEL_FLAGS, "-q", "--on-error", mode, "--errors-file", listed]
    result = run_cli(data, *flags, "-o", out)
    assert result.returncode == (0 if mode == "record" else 2), result.stderr
    said = f"--errors-file {listed} is written only under --on-error skip; under --on-error {mode}"
    assert said in warnings(result.stderr)[0]
    assert not listed.exists()
    if mode == "record":
        assert pq.read_table(out)["error"].null_count == 11  # the failed row is in the output


def test_errors_file_dash_is_the_log_not_a_file_named_dash(qwen3_causal, data, tmp_path):
    out = tmp_path / "o.parquet"
    flags = ["--model", qwen3_causal, *LABEL_FLAGS, "-q", "--on-error", "skip", "--errors-file", "-"]
    for _ in range(2):  # a second run is not refused over a file named '-'
        result = run_cli(data, *flags, "-o", out, "--overwrite", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        lines = warnings(result.stderr)
        assert json.loads(lines[0].split("skipped ", 1)[1])["row_index"] == 5
        assert "listed in the log above" in lines[1]
    assert not (tmp_path / "-").exists() and not (tmp_path / "o.parquet.errors.jsonl").exists()
    assert pq.read_table(out).num_rows == 11
