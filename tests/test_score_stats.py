"""The report's score distribution and items per query: ScoreStats against numpy, and a run's --report."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.job.score_stats import QUANTILES, ScoreStats, quantile_name
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl

NAMES = ["p01", "p05", "p25", "p50", "p75", "p95", "p99"]


def test_quantile_names():
    assert [quantile_name(q) for q in QUANTILES] == NAMES


@pytest.mark.parametrize("seed", range(5))
def test_small_runs_are_exact_and_equal_numpy(seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=int(rng.integers(1, 500))).astype(np.float32)
    stats = ScoreStats()
    for chunk in np.array_split(values, 7):  # batches of any size, some empty
        stats.add_scores(pa.array(list(chunk.astype(float)) + [None], pa.float32()))  # nulls: failed items
    stats.add_scores([float("nan"), float("inf"), None, -float("inf")])
    summary = stats.summary()["scores"]
    reference = values.astype(np.float64)
    assert summary["count"] == values.size and summary["non_finite"] == 3
    assert summary["min"] == reference.min() and summary["max"] == reference.max()
    assert summary["mean"] == pytest.approx(reference.mean(), rel=1e-12, abs=1e-12)
    expected = np.quantile(reference, QUANTILES)
    assert [summary[name] for name in NAMES] == pytest.approx(list(expected), rel=0, abs=1e-12)
    assert summary["quantiles"] == "exact"


def test_no_scores_gives_counts_only():
    stats = ScoreStats()
    stats.add_scores(pa.array([None, None], pa.float32()))
    assert stats.summary() == {
        "scores": {"count": 0, "non_finite": 0, "quantiles": "exact"},
        "items_per_query": {"queries": 0},
    }


def test_large_runs_keep_a_uniform_sample_and_exact_extremes():
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.uniform(0, 1, 60_000), rng.uniform(1, 3, 40_000)])  # a drift mid-run
    stats = ScoreStats(sample_size=4_000)
    start = 0
    for size in rng.integers(1, 9_000, size=40):
        stats.add_scores(values[start : start + size])
        start += size
    stats.add_scores(values[start:])
    summary = stats.summary()["scores"]
    assert summary["count"] == values.size and summary["quantiles"] == "sampled (4000 scores)"
    assert summary["min"] == values.min() and summary["max"] == values.max()
    assert summary["mean"] == pytest.approx(values.mean(), rel=1e-12)
    for q, name in zip(QUANTILES, NAMES):
        rank = np.mean(values <= summary[name])  # where the sampled quantile sits in the full data
        assert abs(rank - q) <= 0.02, (name, rank)
    late = np.mean(stats._sample >= 1)  # the last 40% of the run is 40% of the sample (binomial, ±3σ ≈ 0.023)
    assert abs(late - 0.4) <= 0.03


def test_the_same_input_gives_the_same_sample():
    values = np.random.default_rng(1).normal(size=20_000)
    first, second = ScoreStats(sample_size=500), ScoreStats(sample_size=500)
    for chunk in np.array_split(values, 3):
        first.add_scores(chunk)
    for chunk in np.array_split(values, 3):
        second.add_scores(chunk)
    assert first.summary() == second.summary()


def test_items_per_query_min_median_max_equal_numpy():
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 100):
        sizes = rng.integers(1, 30, size=n)
        stats = ScoreStats()
        stats.add_query_items([(("id", q), int(size)) for q, size in enumerate(sizes[: n // 2])])
        stats.add_query_items([(("id", q + n // 2), int(size)) for q, size in enumerate(sizes[n // 2 :])])
        got = stats.summary()["items_per_query"]
        assert got == {"queries": n, "min": sizes.min(), "median": np.median(sizes), "max": sizes.max()}


def test_items_per_query_counts_a_query_once_whatever_the_windows_and_the_order(monkeypatch):
    """Counts per distinct query over all calls (a query in many windows, any order), past the merge batch."""
    import score_batch.job.score_stats as score_stats

    monkeypatch.setattr(score_stats, "MERGE_EVERY", 7)
    rng = np.random.default_rng(4)
    pieces = [(("text", f"query {q}"), int(n)) for q in range(50) for n in rng.integers(1, 4, size=q % 5 + 1)]
    totals = Counter()
    for key, n in pieces:
        totals[key] += n
    expected = np.array(list(totals.values()))
    for order in (pieces, pieces[::-1], [pieces[i] for i in rng.permutation(len(pieces))]):
        stats = ScoreStats()
        for start in range(0, len(order), 3):  # windows of 3 groups
            stats.add_query_items(order[start : start + 3])
        assert stats.summary()["items_per_query"] == {
            "queries": 50,
            "min": expected.min(),
            "median": np.median(expected),
            "max": expected.max(),
        }
    bounded = score_stats.QueryItems(limit=10)
    bounded.add([(("id", q), 1) for q in range(30)] + [(("id", 0), 1)])
    summary = bounded.summary()
    assert summary["queries"] == 10 and "limit" in summary["counted"]


def test_the_report_carries_the_distribution_of_the_written_scores(qwen3_causal, tmp_path):
    rows = []
    for i in range(23):  # queries of 1..5 items, interleaved across two windows; row 9 fails
        q = i % 5
        rows.append({"query_id": f"q{q}", "query": f"Tokyo is city number {q}", "item": f" item {i}"})
    rows = [row for i, row in enumerate(rows) if i % 5 != 4 or i < 5]  # q4 keeps a single item
    rows[9]["item"] = None
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    out, report = tmp_path / "o.parquet", tmp_path / "report.json"
    result = run_cli(
        data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "-o", out, "--report", report
    )
    assert result.returncode == 0, result.stderr
    written = np.array([s for s in pq.read_table(out)["score"].to_pylist() if s is not None], np.float64)
    assert written.size == len(rows) - 1
    stats = json.loads(report.read_text())["score_stats"]
    scores = stats["scores"]
    assert scores["count"] == written.size and scores["non_finite"] == 0
    assert scores["min"] == written.min() and scores["max"] == written.max()
    assert scores["mean"] == pytest.approx(written.mean(), rel=1e-9)
    assert [scores[name] for name in NAMES] == pytest.approx(list(np.quantile(written, QUANTILES)), abs=1e-12)
    # items per query: the query groups the engine scored (one window here), the failed row's item left out
    sizes = Counter(row["query_id"] for i, row in enumerate(rows) if i != 9)
    expected = np.array(sorted(sizes.values()))
    assert stats["items_per_query"] == {
        "queries": len(sizes),
        "min": expected.min(),
        "median": np.median(expected),
        "max": expected.max(),
    }


def test_items_per_query_does_not_depend_on_windows_or_input_order(qwen3_causal, tmp_path):
    """Queries spread over windows and shuffled: one count per query id (else per query text)."""
    rng = np.random.default_rng(5)
    rows = [
        {"query_id": f"q{q}", "query": f"Tokyo is city number {q}", "item": f" item {i}"}
        for q in range(9)
        for i in range(q % 4 + 1)
    ]
    sizes = np.array([q % 4 + 1 for q in range(9)])
    expected = {"queries": 9, "min": 1, "median": float(np.median(sizes)), "max": 4}
    for name, order in (("given", rows), ("shuffled", [rows[i] for i in rng.permutation(len(rows))])):
        for with_ids in (True, False):
            written = [
                row if with_ids else {k: v for k, v in row.items() if k != "query_id"} for row in order
            ]
            data = write_jsonl(tmp_path / f"{name}-{with_ids}.jsonl", written)
            for window_rows in ("3", "2048"):
                report = tmp_path / f"{name}-{with_ids}-{window_rows}.json"
                result = run_cli(
                    data, "--model", qwen3_causal, *LABEL_FLAGS, "--dry-run", "--window-rows", window_rows,
                    "--report", report, "-o", tmp_path / "o.parquet",
                )  # fmt: skip
                assert result.returncode == 0, result.stderr
                got = json.loads(report.read_text())["score_stats"]["items_per_query"]
                assert got == expected, (name, with_ids, window_rows)


def test_scores_read_back_from_a_partitioned_directory(tmp_path):
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    from score_batch.job.score_stats import ScoreStats, written_scores

    rng = np.random.default_rng(2)
    scores = rng.normal(size=300).astype(np.float32)
    table = pa.table({"score": scores, "country": np.array(["US", "DE", "FR"])[np.arange(300) % 3]})
    table = table.set_column(
        0, "score", pa.array([None if i % 50 == 0 else float(s) for i, s in enumerate(scores)], pa.float32())
    )
    ds.write_dataset(
        table, tmp_path / "out", format="parquet", partitioning=["country"], partitioning_flavor="hive"
    )
    stats = ScoreStats()
    for batch in written_scores(str(tmp_path / "out"), pafs.LocalFileSystem()):
        stats.add_scores(batch)
    got = stats.summary()["scores"]
    kept = np.array([s for i, s in enumerate(scores) if i % 50], np.float64)
    assert got["count"] == kept.size and got["min"] == kept.min() and got["max"] == kept.max()
    assert [got[name] for name in NAMES] == pytest.approx(list(np.quantile(kept, QUANTILES)), abs=1e-12)
