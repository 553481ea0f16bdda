"""Windows scored one behind another (job/runners/window_runs): the next window's first batch is launched
before the last one's part is written, and the output, pooled vectors and report counts are those of windows
scored in turn (--no-pipeline), bit for bit, repeats of a window still in flight copied as in turn."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from score_batch.engine.run import packed_runner
from score_batch.job.checkpoint import parts
from score_batch.job.runners import window_runs
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl

COUNTS = ("items", "items_scored", "items_failed", "duplicates", "packed_tokens", "batches", "rows_written")


def overlap_rows() -> list[dict]:
    """Groups of 1-4 rows, each a window of 2 rows or fewer; a group's query id its own, its query text shared
    by pairs of groups, so every " Japan" but the first two repeats a pair of the window just before."""
    texts = ["Tokyo is a city in", "the quick brown fox"]
    rows = []
    for k, size in enumerate([2, 1, 3, 2, 1, 4, 2, 1, 2]):
        query = texts[k // 2 % 2]
        rows += [
            {"query_id": k, "query": query, "item": f" item {k} {j}" if j else " Japan"} for j in range(size)
        ]
    return rows


def test_overlapped_windows_equal_windows_in_turn(qwen3_causal, tmp_path, monkeypatch):
    data = write_jsonl(tmp_path / "in.jsonl", overlap_rows())
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "2", "--max-batch-tokens", "24"]
    base += ["--pooled-hidden-states", "--query-id-col", "query_id"]
    events: list[tuple[str, int]] = []
    started, written = packed_runner.PackedRunner.start, parts.PartStore.write

    def start(runner, plan, on_items=None):
        events.append(("start", len(plan.batches)))
        return started(runner, plan, on_items)

    def write(store, window, table, input_hash):
        events.append(("write", window))
        return written(store, window, table, input_hash)

    monkeypatch.setattr(packed_runner.PackedRunner, "start", start)
    monkeypatch.setattr(parts.PartStore, "write", write)
    drains = []
    drain = window_runs.WindowRuns.drain
    monkeypatch.setattr(window_runs.WindowRuns, "drain", lambda runs: drains.append(1) or drain(runs))
    reports = {}
    for mode in ("--pipeline", "--no-pipeline"):
        events.clear()
        drains.clear()
        report = tmp_path / f"{mode}.json"
        ran = run_cli(*base, mode, "-o", tmp_path / f"{mode}.parquet", "--report", report)
        assert ran.returncode == 0, ran.stderr
        reports[mode] = json.loads(report.read_text())
        writes = [at for at, (kind, _) in enumerate(events) if kind == "write"]
        starts = [at for at, (kind, _) in enumerate(events) if kind == "start"]
        ahead = sum(start_at < write_at for start_at, write_at in zip(starts[1:], writes))
        if mode == "--pipeline":  # window N+1 started before window N's part was written
            assert ahead >= 3 and len(writes) == 9, events  # the windows not waiting for a repeat's
            assert len(drains) >= 4  # the repeats' windows waited for the window they repeat (and the end)
        else:
            assert ahead == 0, events
    overlapped, in_turn = (pq.read_table(tmp_path / f"{mode}.parquet") for mode in reports)
    assert overlapped.equals(in_turn)  # scores and vectors bit for bit, rows in input order
    assert overlapped.column("item_id").to_pylist() == list(range(len(overlap_rows())))  # the row indexes
    assert {k: reports["--pipeline"][k] for k in COUNTS} == {k: reports["--no-pipeline"][k] for k in COUNTS}
    assert reports["--pipeline"]["duplicates"] == 7  # the repeats were copied, not scored again
