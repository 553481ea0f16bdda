"""A resumed output is the uninterrupted one: its completion record and the logs carry the whole output's item
and failed counts, and --max-failed-rate judges the whole output (after a resume and on an already-complete
rerun)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.columns import ERROR
from score_batch.job.checkpoint.completion import RECORD_KEY
from tests.test_cli import LABEL_FLAGS, REPO, run_cli, write_jsonl
from tests.test_job import many_rows
from tests.test_refused_resume import stopped_after

pytestmark = pytest.mark.slow
KILLED_IN_THE_MERGE = """
import os, signal, sys
from score_batch.job.checkpoint.parts import PartStore
PartStore.read = lambda self, window: os.kill(os.getpid(), signal.SIGKILL)  # the merge's first part read
from score_batch.cli.main import run
sys.argv = ["score-batch", *sys.argv[1:]]
run()
"""


def record(output) -> bytes:
    """A Parquet output's completion record, as its schema metadata holds it."""
    return pq.read_schema(output).metadata[RECORD_KEY]


def test_a_run_whose_rows_all_fail_killed_in_its_merge_still_fails_when_resumed(qwen3_causal, tmp_path):
    rows = [dict(row, item=None) for row in many_rows(100, 4)]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "--window-rows", "4"]
    full, out = tmp_path / "full.parquet", tmp_path / "out.parquet"
    uninterrupted = run_cli(*base, "-o", full, "--resume")
    assert uninterrupted.returncode == 4 and "all 400 items failed" in uninterrupted.stderr
    args = [str(arg) for arg in (*base, "-o", out, "--resume")]
    killed = subprocess.run([sys.executable, "-c", KILLED_IN_THE_MERGE, *args], cwd=REPO, capture_output=True)
    assert killed.returncode == -9 and not out.exists()
    assert len(list((tmp_path / "out.parquet.parts").glob("part-*.parquet"))) == 100
    resumed = run_cli(*args, "--report", tmp_path / "report.json")
    assert resumed.returncode == 4, resumed.stderr
    assert "all 400 items failed" in resumed.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["status"], report["items"], report["items_failed"]) == ("failed", 400, 400)
    assert pq.read_table(out)[ERROR].null_count == 0 and pq.read_table(out).num_rows == 400
    assert json.loads(record(out))["failed"] == [400, 400] and record(out) == record(full)
    again = run_cli(*args, "--report", tmp_path / "again.json")  # already complete: the same verdict
    assert again.returncode == 4 and "all 400 items failed" in again.stderr
    assert json.loads((tmp_path / "again.json").read_text())["already_complete"] is True


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_resumed_outputs_record_and_verdict_are_the_uninterrupted_ones(
    qwen3_causal, tmp_path, monkeypatch, suffix
):
    # 2 failed items in window 0 (resumed), 1 in window 3 (scored after the resume): 3 of 120 is over 2%,
    # the resumed run's own share (1 of 60) is not
    rows = [dict(row, item=None) if k in (0, 1, 95) else row for k, row in enumerate(many_rows(20, 6))]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "30", "--on-error", "record"]
    base += ["--max-failed-rate", "0.02"]
    full, out = tmp_path / f"full{suffix}", tmp_path / f"out{suffix}"
    uninterrupted = run_cli(*base, "-o", full, "--resume", "--report", tmp_path / "full.json")
    assert uninterrupted.returncode == 4, uninterrupted.stderr
    stopped_after(2, monkeypatch, *base, "-o", out, "--resume")
    resumed = run_cli(*base, "-o", out, "--resume", "--report", tmp_path / "resumed.json")
    assert resumed.returncode == 4, resumed.stderr
    assert "3 of 120 items failed (2.5%), more than --max-failed-rate 0.02" in resumed.stderr
    report, reference = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("resumed", "full"))
    counts = ("items", "items_failed", "rows_read", "rows_written")
    assert [report[n] for n in counts] == [reference[n] for n in counts] == [120, 3, 120, 120]
    assert report["items_resumed"] == 58 and report["rows_skipped_by_resume"] == 60
    assert (
        report["items"]
        == sum(report[n] for n in ("items_scored", "items_failed", "duplicates", "reused")) + 58
    )
    if suffix == ".parquet":
        assert record(out) == record(full) and json.loads(record(out))["failed"] == [3, 120]
    else:  # OUTPUT.done: the same but for the output's size and time
        done, expected = (json.loads(p.with_name(p.name + ".done").read_text()) for p in (out, full))
        assert done.pop("output")[0] == expected.pop("output")[0] and done == expected
        assert done["record"]["failed"] == [3, 120]
    again = run_cli(*base, "-o", out, "--resume")
    assert again.returncode == 4 and "3 of 120 items failed" in again.stderr
