"""--report is replaced by a "running" report at the start: a run killed with -9 leaves that, never the verdict
of an earlier run."""

from __future__ import annotations

import json

import pytest

from tests.test_job import start_cli, wait_for_parts

pytestmark = pytest.mark.slow


def test_a_killed_run_leaves_a_running_report_not_the_last_verdict(job):
    from tests.test_cli import run_cli

    base, _, tmp_path = job
    report = tmp_path / "report.json"
    assert run_cli(*base, "-o", tmp_path / "first.parquet", "--report", report).returncode == 0
    assert json.loads(report.read_text())["status"] == "succeeded"
    out = tmp_path / "out.parquet"
    process = start_cli(*base, "-o", out, "--resume", "--report", report)
    try:
        wait_for_parts(tmp_path / "out.parquet.parts", 1, process)
    finally:
        process.kill()  # SIGKILL: no handler runs, nothing is written at the end
        process.wait()
    written = json.loads(report.read_text())
    assert written["status"] == "running" and written["pid"] == process.pid
    assert written["started_at"] and written["ended_at"] is None and written["exit_code"] is None
    assert written["settings"]["output"] == str(out)
    assert not list(tmp_path.glob(".report.json*"))  # replaced through a renamed temporary file, none left
    resumed = run_cli(*base, "-o", out, "--resume", "--report", report)
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads(report.read_text())
    assert final["status"] == "succeeded" and final["pid"] != process.pid and final["ended_at"]
