"""Faults and concurrency: two runs at once, changed input on resume, damaged parts, leftovers, full disk, signals."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, REPO, run_cli, write_jsonl
from tests.test_job import many_rows, start_cli, wait_for_parts

pytestmark = pytest.mark.slow


def killed_run(base, out, parts: int = 3):
    """Start a run in a fresh process, let it checkpoint some parts, then kill -9 it."""
    process = start_cli(*base, "-o", out)
    wait_for_parts(out.with_name(out.name + ".parts"), parts, process)
    process.kill()
    process.wait()
    return process


def test_a_second_run_on_the_same_output_is_refused_and_a_dead_holder_is_taken_over(job):
    base, reference, tmp_path = job
    out = tmp_path / "out.parquet"
    first = start_cli(*base, "-o", out)
    wait_for_parts(tmp_path / "out.parquet.parts", 1, first)
    second = run_cli(*base, "-o", out, "--resume")
    assert second.returncode == 2
    assert f"held by pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
    first.kill()
    first.wait()
    assert (tmp_path / "out.parquet.lock").exists()  # kill -9 leaves the lock behind
    third = run_cli(*base, "-o", out, "--resume")
    assert third.returncode == 0, third.stderr
    assert "taking over the lock" in third.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))
    assert not (tmp_path / "out.parquet.lock").exists()


def test_resume_refuses_input_changed_with_the_same_size_and_mtime(job):
    base, _, tmp_path = job
    out = tmp_path / "out.parquet"
    killed_run(base, out)
    data = base[0]
    stat = data.stat()
    text = data.read_text()
    data.write_text(text.replace("item 0 to", "item 9 to", 1))  # same length, first window changed
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert data.stat().st_size == stat.st_size
    resumed = run_cli(*base, "-o", out, "--resume")
    assert resumed.returncode == 2
    assert "input changed" in resumed.stderr and not out.exists()


def test_damaged_and_unlisted_parts_are_rescored_never_merged(job):
    base, reference, tmp_path = job
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    killed_run(base, out, parts=4)
    first = parts / "part-00000000.parquet"
    first.write_bytes(first.read_bytes()[:40])  # truncated by a crash of the disk, not by us
    stray = pa.table({"row_index": [0], "query_id": [999]})
    pq.write_table(stray, parts / "part-00000039.parquet")  # not in the manifest
    resumed = run_cli(*base, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "damaged" in resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))


def test_parts_without_a_manifest_are_not_reused(job):
    base, reference, tmp_path = job
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    parts.mkdir()
    pq.write_table(pq.read_table(reference).slice(0, 6), parts / "part-00000000.parquet")
    resumed = run_cli(*base, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))


def test_leftover_temporary_files_are_removed_by_the_next_run(job):
    base, reference, tmp_path = job
    out = tmp_path / "out.parquet"
    leftovers = [tmp_path / ".out.parquet.tmp-1234abcd", tmp_path / ".out.parquet.errors.jsonl.tmp-x"]
    for leftover in leftovers:
        leftover.write_bytes(b"half a merge")
    result = run_cli(*base, "-o", out)
    assert result.returncode == 0, result.stderr
    assert not any(leftover.exists() for leftover in leftovers)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out.parquet"]


def test_sigterm_during_the_merge_exits_143_and_resume_finishes(job, monkeypatch):
    base, reference, tmp_path = job
    out = tmp_path / "out.parquet"
    from score_batch.job.checkpoint.parts import PartStore

    original = PartStore.read
    calls = []

    def read_then_signal(self, window):
        calls.append(window)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, window)

    monkeypatch.setattr(PartStore, "read", read_then_signal)
    stopped = run_cli(*base, "-o", out)
    assert stopped.returncode == 143
    assert not out.exists() and (tmp_path / "out.parquet.parts").exists()
    assert not list(tmp_path.glob(".out.parquet.tmp-*"))
    monkeypatch.setattr(PartStore, "read", original)
    resumed = run_cli(*base, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))


def test_disk_full_exits_3_with_one_line_and_resume_works_after(job, monkeypatch):
    base, reference, tmp_path = job
    out = tmp_path / "out.parquet"
    from score_batch.job.checkpoint import parts as parts_module

    original = parts_module.pq.write_table
    written = []

    def fill_up(table, where, *args, **kwargs):
        if len(written) == 5:
            raise OSError(errno.ENOSPC, "No space left on device", str(where))
        written.append(where)
        return original(table, where, *args, **kwargs)

    monkeypatch.setattr(parts_module.pq, "write_table", fill_up)
    full = run_cli(*base, "-o", out)
    assert full.returncode == 3
    assert "No space left on device" in full.stderr and "Traceback" not in full.stderr
    assert "bug" not in full.stderr
    assert not out.exists() and not list((tmp_path / "out.parquet.parts").glob(".*tmp*"))
    monkeypatch.setattr(parts_module.pq, "write_table", original)
    resumed = run_cli(*base, "-o", out, "--resume", "--report", tmp_path / "report.json")
    assert resumed.returncode == 0, resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))
    assert json.loads((tmp_path / "report.json").read_text())["rows_skipped_by_resume"] == 30


def test_report_is_written_on_failure_and_to_stderr(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": None, "item": " x"}])
    report = tmp_path / "report.json"
    failed = run_cli(
        data, "-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS, "--report", report
    )
    assert failed.returncode == 2
    written = json.loads(report.read_text())
    assert written["status"] == "failed" and written["exit_code"] == 2
    assert "'query' is null" in written["error"]
    assert written["started_at"] <= written["ended_at"] and written["versions"]["score-batch"]
    # A failed run's report does not block the retry; a succeeded one needs --overwrite.
    fixed = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": " x"}])
    retry = run_cli(
        fixed, "-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS, "--report", report
    )
    assert retry.returncode == 0, retry.stderr
    assert json.loads(report.read_text())["status"] == "succeeded"
    again = run_cli(
        fixed, "-o", tmp_path / "p.parquet", "--model", qwen3_causal, *LABEL_FLAGS, "--report", report
    )
    assert again.returncode == 2 and "--overwrite" in again.stderr and not (tmp_path / "p.parquet").exists()
    to_stderr = run_cli(fixed, "-o", "-", "--model", qwen3_causal, *LABEL_FLAGS, "--report", "-", "-q")
    assert to_stderr.returncode == 0
    assert json.loads(to_stderr.stderr)["status"] == "succeeded"


def test_empty_input_writes_an_empty_output_and_nothing_else(qwen3_causal, tmp_path):
    schema = pa.schema(
        [("query_id", pa.string()), ("query", pa.string()), ("item", pa.string()), ("tag", pa.int32())]
    )
    data = tmp_path / "in.parquet"
    pq.write_table(schema.empty_table(), data)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = run_cli(
        data, "-o", out_dir / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "tag"
    )
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out_dir / "o.parquet")
    assert table.num_rows == 0
    assert table.schema.field("query_id").type == pa.string() and table.schema.field("tag").type == pa.int32()
    assert [p.name for p in out_dir.iterdir()] == ["o.parquet"]


def test_closed_stdout_pipe_exits_0_quietly(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", many_rows(30, 4))
    command = f"{sys.executable} -m cli.main {data} -o - --model {qwen3_causal} --label-tokens ' to' --window-rows 4 | head -2"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2
    assert "Error" not in done.stderr and "Traceback" not in done.stderr


def test_pipeline_off_gives_the_same_output_and_errors(job, qwen3_causal, tmp_path):
    base, reference, _ = job
    sequential = tmp_path / "sequential.parquet"
    result = run_cli(*base, "-o", sequential, "--no-pipeline")
    assert result.returncode == 0, result.stderr
    assert pq.read_table(sequential).equals(pq.read_table(reference))  # the reference ran with the pipeline
    rows = many_rows(6, 2)
    rows[9]["query"] = None  # the error surfaces at its window, in either mode
    bad = write_jsonl(tmp_path / "bad.jsonl", rows)
    for mode in ("--pipeline", "--no-pipeline"):
        failed = run_cli(
            bad,
            "--model",
            qwen3_causal,
            *LABEL_FLAGS,
            "--window-rows",
            "2",
            "-o",
            tmp_path / "x.parquet",
            mode,
        )
        assert failed.returncode == 2 and "row 9" in failed.stderr
        assert not (tmp_path / "x.parquet").exists() and not (tmp_path / "x.parquet.parts").exists()


def test_resume_refuses_checkpoints_beyond_a_shorter_input(qwen3_causal, tmp_path, monkeypatch):
    from score_batch.job.checkpoint.parts import PartStore

    rows = "".join(json.dumps(row) + "\n" for row in many_rows(10, 6))
    out = tmp_path / "out.parquet"
    base = ["-", "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "6"]
    original, written = PartStore.write, []

    def write_then_stop(self, window, table, input_hash):
        original(self, window, table, input_hash)
        written.append(window)
        if len(written) == 5:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(PartStore, "write", write_then_stop)
    assert run_cli(*base, stdin=rows).returncode == 143
    monkeypatch.setattr(PartStore, "write", original)
    shorter = "".join(rows.splitlines(keepends=True)[:12])  # 2 windows where 5 were checkpointed
    resumed = run_cli(*base, "--resume", stdin=shorter)
    assert resumed.returncode == 2 and "input now ends after 2 windows" in resumed.stderr
    assert not out.exists()


def test_errors_file_named_like_the_default_survives(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": " a"}, {"query": None, "item": " b"}])
    out = tmp_path / "out.parquet"
    spelled = tmp_path / "sub" / ".." / "out.parquet.errors.jsonl"
    (tmp_path / "sub").mkdir()
    result = run_cli(
        data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "skip", "--errors-file", spelled
    )
    assert result.returncode == 0, result.stderr
    assert [
        json.loads(line)["row_index"]
        for line in (tmp_path / "out.parquet.errors.jsonl").read_text().splitlines()
    ] == [1]


def test_abandoned_empty_lock_is_taken_over_and_outputs_are_world_readable(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": " a"}])
    out = tmp_path / "out.parquet"
    lock = tmp_path / "out.parquet.lock"
    lock.write_text("")  # a run died between creating the lock and writing its holder
    os.utime(lock, (1, 1))
    previous = os.umask(0o022)
    try:
        result = run_cli(data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS)
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    assert "unreadable lock" in result.stderr and not lock.exists()
    assert out.stat().st_mode & 0o777 == 0o644


def test_ray_style_overwrite_never_deletes_a_directory_it_did_not_write(tmp_path):
    from score_batch.engine import EngineConfig
    from score_batch.io_formats.schema import ColumnOverrides
    from score_batch.job.preflight.checks import check_destination
    from score_batch.job.run_config import RayOptions, RunConfig

    precious = tmp_path / "projects"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    config = RunConfig(
        input="in.jsonl",
        output=str(precious),
        model_dir=tmp_path,
        columns=ColumnOverrides(),
        engine=EngineConfig(),
        overwrite=True,
        ray=RayOptions(),
    )
    with pytest.raises(Exception, match="will not delete it"):
        check_destination(config, directory=True)


def test_partition_by_a_list_column_exits_2_before_scoring(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": " a", "tags": ["x", "y"]}])
    result = run_cli(
        data,
        "-o",
        tmp_path / "out",
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "--keep-columns",
        "tags",
        "--partition-by",
        "tags",
    )
    assert result.returncode == 2 and "cannot name a directory" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.parts").exists()


def test_a_resumed_skip_run_counts_the_whole_outputs_failures_as_its_errors_file_lists_them(
    qwen3_causal, tmp_path
):
    # one failed row in each window of 6
    rows = [dict(row, item=None) if k % 6 == 0 else row for k, row in enumerate(many_rows())]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "6", "--max-batch-tokens", "64"]
    base += ["--on-error", "skip"]
    out, report = tmp_path / "out.parquet", tmp_path / "report.json"
    killed_run(base, out)
    resumed = run_cli(*base, "-o", out, "--resume", "--report", report)
    assert resumed.returncode == 0, resumed.stderr
    stats = json.loads(report.read_text())
    listed = (tmp_path / "out.parquet.errors.jsonl").read_text().splitlines()
    assert stats["items_skipped"] == len(listed) == 40 == stats["items_failed"]  # resumed windows' too
    assert stats["items"] == 240 and stats["items_resumed"] > 0
    (warning,) = [line for line in resumed.stderr.splitlines() if "were left out of the output" in line]
    assert "40 of 240 items failed" in warning
    assert pq.read_table(out).num_rows == 200
