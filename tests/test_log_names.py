"""The JSON log's `logger` field keeps two fixed names, whichever module logs the line (users filter on them): a
lock taken over from a dead run (score_batch.job.lock) and the failed items' warning (score_batch.job.progress)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from tests.test_cli import LABEL_FLAGS, ROWS, run_cli, write_jsonl


def test_json_log_names_the_lock_and_failed_items_loggers(qwen3_causal, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid no process holds now
    out = tmp_path / "o.parquet"
    holder = {"pid": dead.pid, "host": socket.gethostname(), "started": "2026-11-28T00:00:00Z"}
    (tmp_path / "o.parquet.lock").write_text(json.dumps(holder))
    rows = [*ROWS, {"query_id": "c", "query": "Paris is in", "item_id": "c1", "item": None, "tag": 6}]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    flags = ["--model", qwen3_causal, *LABEL_FLAGS, "--log-format", "json", "--on-error", "skip"]
    done = run_cli(data, "-o", out, *flags, "--errors-file", tmp_path / "e.jsonl", fresh_process=True)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    loggers = {r["logger"] for r in records if "taking over the lock" in r.get("message", "")}
    assert loggers == {"score_batch.job.lock"}, done.stderr
    failed = {r["logger"] for r in records if "failed and were left out" in r.get("message", "")}
    assert failed == {"score_batch.job.progress"}, done.stderr
