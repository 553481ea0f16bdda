"""--ranked-output: one run writes every row to OUTPUT and the ranked view beside it, each equal to what a
run of its own writes (read back with polars), published with OUTPUT's guarantees; every row accounted for."""

from __future__ import annotations

import json
import os
import signal

import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_ranking_keys import nightly_rows

pl = pytest.importorskip("polars")


def rows_of(path) -> list[dict]:
    """An output's rows as polars reads them (a JSONL file or a Parquet file or dataset)."""
    path = str(path)
    return (pl.read_ndjson(path) if path.endswith(".jsonl") else pl.read_parquet(path)).to_dicts()


@pytest.fixture
def data(tmp_path):
    rows = nightly_rows()
    rows[5]["item"] = None  # a failed row
    return write_jsonl(tmp_path / "in.jsonl", rows)


@pytest.mark.parametrize("on_error, form", [("record", "jsonl"), ("skip", "parquet")])
def test_one_run_writes_what_two_runs_write(qwen3_causal, tmp_path, data, on_error, form):
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "6", "--on-error", on_error]
    base += ["--query-id-col", "dt,query"]
    full, view = tmp_path / "full.parquet", tmp_path / f"view.{form}"
    both = run_cli(
        *base, "--top-k", "2", "-o", full, "--ranked-output", view, "--report", tmp_path / "r.json"
    )
    assert both.returncode == 0, both.stderr
    alone_full = run_cli(*base, "-o", tmp_path / "alone_full.parquet")
    assert alone_full.returncode == 0, alone_full.stderr
    alone_view = run_cli(*base, "--top-k", "2", "-o", tmp_path / f"alone_view.{form}")
    assert alone_view.returncode == 0, alone_view.stderr
    assert rows_of(full) == rows_of(tmp_path / "alone_full.parquet")  # every row, unranked
    assert "rank" not in pq.read_schema(full).names
    assert rows_of(view) == rows_of(tmp_path / f"alone_view.{form}")  # the --top-k run's output
    report = json.loads((tmp_path / "r.json").read_text())
    skipped = 1 if on_error == "skip" else 0
    assert report["rows_written"] == len(nightly_rows()) - skipped == len(rows_of(full))
    assert report["rows_ranked"] == len(rows_of(view))  # the view's rows, counted apart
    assert f"wrote {len(rows_of(full))} rows" in both.stderr and "the best" not in both.stderr  # OUTPUT: all
    assert f"{len(rows_of(view))} to the ranked view" in both.stderr
    assert run_cli(*base, "-o", tmp_path / "x.parquet", "--report", tmp_path / "r2.json").returncode == 0
    assert json.loads((tmp_path / "r2.json").read_text())["rows_ranked"] is None  # no view
    if on_error == "skip":  # the failed row is listed once
        assert len((tmp_path / "full.parquet.errors.jsonl").read_text().splitlines()) == 1
    # --reuse of the full output reuses every pair, no warning; of a Parquet view it warns: some pairs only.
    reuse_full = run_cli(*base, "-o", tmp_path / "again.parquet", "--reuse", full)
    assert reuse_full.returncode == 0 and "--top-k output" not in reuse_full.stderr, reuse_full.stderr
    assert rows_of(tmp_path / "again.parquet") == rows_of(full)
    if form == "parquet":
        reuse_view = run_cli(*base, "-o", tmp_path / "again2.parquet", "--reuse", view)
        assert reuse_view.returncode == 0 and "--top-k output" in reuse_view.stderr, reuse_view.stderr


def test_a_partitioned_run_partitions_both(qwen3_causal, tmp_path, data):
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "--query-id-col", "dt,query"]
    base += ["--keep-columns", "dt", "--partition-by", "dt", "--top-k", "1"]
    result = run_cli(*base, "-o", tmp_path / "full", "--ranked-output", tmp_path / "view")
    assert result.returncode == 0, result.stderr
    alone = run_cli(*base, "-o", tmp_path / "alone")
    assert alone.returncode == 0, alone.stderr
    for dt in ("2026-11-26", "2026-11-27"):
        assert rows_of(tmp_path / "view" / f"dt={dt}") == rows_of(tmp_path / "alone" / f"dt={dt}")
    assert sum(len(rows_of(p)) for p in (tmp_path / "full").glob("dt=*")) == len(nightly_rows())


def test_the_view_is_refused_where_it_cannot_be_written(qwen3_causal, tmp_path, data):
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record"]
    out = tmp_path / "o.parquet"
    cases = {
        "needs --rank or --top-k": [*base, "-o", out, "--ranked-output", tmp_path / "v.parquet"],
        "not -": [*base, "--rank", "-o", "-", "--ranked-output", tmp_path / "v.parquet"],
        "are the same path": [*base, "--rank", "-o", out, "--ranked-output", out],
        "would overwrite or mix into input file": [
            *base,
            "--rank",
            "-o",
            out,
            "--ranked-output",
            data,
            "--overwrite",
        ],
        ".parquet or .jsonl": [*base, "--rank", "-o", out, "--ranked-output", tmp_path / "v.csv"],
    }
    for said, args in cases.items():
        result = run_cli(*args)
        assert result.returncode == 2, (said, result.stderr)
        assert said in result.stderr and "--ranked-output" in result.stderr, (said, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_an_existing_view_is_replaced_only_by_overwrite_or_resume(qwen3_causal, tmp_path, data):
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "--rank"]
    out, view = tmp_path / "o.parquet", tmp_path / "v.parquet"
    view.write_bytes(b"stale")  # a view published by a run cut off before its OUTPUT
    refused = run_cli(*base, "-o", out, "--ranked-output", view)
    assert refused.returncode == 2 and "already exists; pass --overwrite" in refused.stderr, refused.stderr
    assert view.read_bytes() == b"stale" and not out.exists()
    resumed = run_cli(*base, "-o", out, "--ranked-output", view, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert len(rows_of(view)) == len(rows_of(out)) == len(nightly_rows())
    again = run_cli(*base, "-o", out, "--ranked-output", view, "--overwrite")
    assert again.returncode == 0, again.stderr


def test_a_run_stopped_between_the_two_publishes_resumes_to_both(job, monkeypatch):
    base, reference, tmp_path = job
    out, view = tmp_path / "out.parquet", tmp_path / "view.parquet"
    ranked = run_cli(*base, "--top-k", "3", "-o", tmp_path / "ranked.parquet")
    assert ranked.returncode == 0, ranked.stderr
    from score_batch.io_formats.parts import PartStore

    original, reads = PartStore.read, []

    def signal_once_the_view_is_out(self, window):
        reads.append(window)
        if view.exists() and not out.exists() and len(reads) == len(set(reads)) + 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the first read of the full pass, after the view's publish
        return original(self, window)

    monkeypatch.setattr(PartStore, "read", signal_once_the_view_is_out)
    stopped = run_cli(*base, "--top-k", "3", "-o", out, "--ranked-output", view)
    assert stopped.returncode == 143
    assert view.exists() and not out.exists() and (tmp_path / "out.parquet.parts").exists()
    monkeypatch.setattr(PartStore, "read", original)
    refused = run_cli(*base, "--top-k", "3", "-o", out, "--ranked-output", view)
    assert refused.returncode == 2  # the parts of a stopped run: --resume or --overwrite
    resumed = run_cli(*base, "--top-k", "3", "-o", out, "--ranked-output", view, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert rows_of(out) == rows_of(reference) and rows_of(view) == rows_of(tmp_path / "ranked.parquet")
    assert not (tmp_path / "out.parquet.parts").exists()
