"""The scoring phase every runner shares (job/runners/phase.py): the report from scored windows, signals, the
sink."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from score_batch.engine import EngineConfig
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.report import RunReport
from score_batch.job.run_config import RunConfig
from score_batch.job.runners.phase import ScoredWindow, ScoringPhase
from score_batch.signals import Stopped
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import many_rows


class RecordingSink:
    """A sink that records what the phase asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def commit(self, *args):
        self.calls.append(("commit", args))
        return 3

    def abort(self, keep_checkpoints: bool) -> None:
        self.calls.append(("abort", keep_checkpoints))


def config(**overrides) -> RunConfig:
    fields = dict(input="in.jsonl", output="out.parquet", model_dir=Path("m"), columns=ColumnOverrides())
    return RunConfig(**{**fields, "engine": EngineConfig(), "quiet": True, **overrides})


def test_the_report_is_built_from_the_windows():
    report, sink = RunReport(), RecordingSink()
    with ScoringPhase(config(), report, sink) as phase:
        phase.add(ScoredWindow(4, 6, 1, scores=[0.5, 0.25, None], query_items=[("a", 4), ("b", 2)], reused=2))
        phase.add(ScoredWindow(3, 0, 0, scores=[0.75], query_items=[("a", 3)], resumed=True))
        phase.add(ScoredWindow(2, 3, 3, written=False))  # the window that stopped an --on-error fail run
        phase.commit("contract")
    # items_scored: what ran now, the 2 reused items left out (report version 2)
    assert (report.rows_read, report.items, report.items_failed, report.items_scored) == (9, 9, 4, 3)
    assert (report.rows_skipped_by_resume, report.reused, report.items_skipped) == (3, 2, 3)
    assert report.rows_written == 6  # a sink that does not count them: the items less the skipped ones
    assert report.score_stats["scores"]["count"] == 3 and report.score_stats["items_per_query"]
    assert sink.calls == [("commit", ("contract",))]


def test_a_signal_before_commit_publishes_nothing_and_keeps_checkpoints():
    report, sink = RunReport(), RecordingSink()
    with pytest.raises(Stopped):
        with ScoringPhase(config(), report, sink) as phase:
            phase.add(ScoredWindow(1, 1, 0, scores=[0.5]))
            os.kill(os.getpid(), signal.SIGTERM)  # deferred: recorded, raised at the next safe point
            phase.commit()
    assert sink.calls == [("abort", True)]
    assert report.score_stats["scores"]["count"] == 1


def test_a_user_mistake_drops_the_checkpoints_and_nothing_counted_reports_no_stats():
    from score_batch.io_formats.errors import InputError

    report, sink = RunReport(), RecordingSink()
    with pytest.raises(InputError):
        with ScoringPhase(config(), report, sink):
            raise InputError("bad row")
    assert sink.calls == [("abort", False)] and report.score_stats == {}


def test_items_scored_leaves_out_the_window_that_failed_the_run(qwen3_causal, tmp_path):
    rows = many_rows(4, 3)
    rows[7]["item"] = " word" * 200  # window 2 (rows 6-11) holds an item over --max-item-tokens
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    report = tmp_path / "r.json"
    flags = ["--window-rows", "6", "--max-item-tokens", "40", "--report", report]
    ran = run_cli(data, "--model", qwen3_causal, *LABEL_FLAGS, *flags, "-o", tmp_path / "o.parquet")
    assert ran.returncode == 2, ran.stderr
    written = json.loads(report.read_text())
    assert written["items_scored"] == 6 and written["items"] == 12 and written["items_failed"] == 1
