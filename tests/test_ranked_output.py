"""--ranked-output is removed: the flag (or its variable) is refused with one line pointing at --rank, and the
ranked view docs/ranking.md derives from a --rank output (rank <= k, with the failed rows: rank null; DuckDB or
polars) is the --top-k output."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow.parquet as pq

from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import many_rows


def test_ranked_output_is_refused_and_the_rank_filter_gives_the_top_k_view(qwen3_causal, tmp_path):
    rows = [dict(row, item=None) if k % 5 == 3 else row for k, row in enumerate(many_rows(4, 5))]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record"]
    for given, env in (
        (["--ranked-output", tmp_path / "v.parquet"], None),
        ([], {"SCORE_BATCH_RANKED_OUTPUT": "v"}),
    ):
        refused = run_cli(*base, "--rank", "-o", tmp_path / "o.parquet", *given, env=env)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert (
            line.startswith("score-batch: error: --ranked-output is removed: pass --rank")
            and "rank <= k" in line
        )
        assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "v.parquet").exists()
    scores, top2 = tmp_path / "scores.parquet", tmp_path / "top2.parquet"
    assert run_cli(*base, "--rank", "-o", scores).returncode == 0
    assert run_cli(*base, "--top-k", "2", "-o", top2).returncode == 0
    expected = pq.read_table(top2).replace_schema_metadata(None)
    with_duckdb = duckdb.sql(f"SELECT * FROM '{scores}' WHERE rank <= 2 OR rank IS NULL").to_arrow_table()
    with_polars = (
        pl.scan_parquet(scores).filter((pl.col("rank") <= 2) | pl.col("rank").is_null()).collect().to_arrow()
    )
    for view in (with_duckdb, with_polars):
        assert view.num_rows == expected.num_rows == 12  # 2 per query, and its failed items (rank null)
        assert view.to_pylist() == expected.to_pylist()
