"""Ranking keys of several columns (--query-id-col dt,user_id,query): rankings, --top-k and query_id use the
composite key; checked against a pandas groupby-rank over the unranked output and read back with polars;
the columnar rank_rows against pandas on random tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.columns import ERROR, QUERY_KEY
from score_batch.job.outputs.query_ranking import rank_parts
from score_batch.job.preflight.contract import OutputContract
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl

ITEMS = [" to", " the flag of", " Japan", " the", " a city", " over there", " here"]
KEY = ["dt", "user_id", "query"]


def nightly_rows() -> list[dict]:
    """Two days × two users (one of them null) × two queries, the groups interleaved across the input."""
    rows = []
    for i in range(28):
        rows.append(
            {
                "dt": ["2026-11-26", "2026-11-27"][i % 2],
                "user_id": [7, None][(i // 2) % 2],
                "query": ["I pledge allegiance", "Tokyo is a city in"][(i // 4) % 2],
                "item": ITEMS[i % len(ITEMS)],
            }
        )
    return rows


def reference_ranks(rows: list[dict], scores: list[float], key: list[str], top_k: int | None) -> pd.DataFrame:
    """pandas: each group's rank by score, ties by input order (method=first); nulls are a key value."""
    frame = pd.DataFrame(rows).assign(score=scores, row=range(len(rows)))
    frame["rank"] = frame.groupby(key, dropna=False, sort=False)["score"].rank(
        method="first", ascending=False
    )
    frame["rank"] = frame["rank"].astype(int)
    return frame if top_k is None else frame[frame["rank"] <= top_k]


@pytest.mark.parametrize("top_k", [None, 2])
def test_a_composite_key_ranks_within_each_combination(qwen3_causal, tmp_path, top_k):
    rows = nightly_rows()
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [
        data,
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "--window-rows",
        "5",
        "--query-id-col",
        ",".join(KEY),
    ]
    plain = run_cli(*base, "-o", tmp_path / "plain.parquet")
    assert plain.returncode == 0, plain.stderr
    scores = pq.read_table(tmp_path / "plain.parquet")["score"].to_pylist()  # input order
    flag = ["--top-k", str(top_k)] if top_k else ["--rank"]
    ranked = run_cli(*base, *flag, "-o", tmp_path / "ranked.parquet")
    assert ranked.returncode == 0, ranked.stderr
    pl = pytest.importorskip("polars")
    got = pl.read_parquet(tmp_path / "ranked.parquet").unnest("query_id")  # the struct's fields as columns
    assert got.columns[:3] == KEY
    expected = reference_ranks(rows, scores, KEY, top_k)
    assert len(got) == len(expected)
    user = [None if pd.isna(u) else int(u) for u in expected["user_id"]]  # pandas reads null as NaN
    want = {(r.dt, u, r.query, r.row): r.rank for r, u in zip(expected.itertuples(), user)}
    have = {(r["dt"], r["user_id"], r["query"], r["item_id"]): r["rank"] for r in got.iter_rows(named=True)}
    assert have == want
    assert got.filter(pl.col("rank") == 1).height == 8  # 2 days × 2 users (null one included) × 2 queries


def test_a_key_with_the_partition_column_ranks_within_each_partition(qwen3_causal, tmp_path):
    rows = nightly_rows()
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    common = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "4", "--query-id-col", "dt,query"]
    plain = run_cli(*common, "-o", tmp_path / "plain.parquet")
    assert plain.returncode == 0, plain.stderr
    scores = pq.read_table(tmp_path / "plain.parquet")["score"].to_pylist()
    out = tmp_path / "out"
    flags = ["--keep-columns", "dt", "--partition-by", "dt", "--top-k", "3", "-o", out]
    result = run_cli(*common, *flags)
    assert result.returncode == 0, result.stderr
    expected = reference_ranks(rows, scores, ["dt", "query"], 3)
    for dt, day in expected.groupby("dt"):
        part = ds.dataset(out / f"dt={dt}", format="parquet").to_table().to_pylist()
        assert sorted((r["query_id"]["query"], r["item_id"], r["rank"]) for r in part) == sorted(
            zip(day["query"], day["row"], day["rank"])
        )
        assert {r["query_id"]["dt"] for r in part} == {dt}


def test_one_id_column_keeps_its_type_and_a_missing_key_column_is_named(qwen3_causal, tmp_path):
    rows = [{**row, "user_id": str(row["user_id"])} for row in nightly_rows()[:6]]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--rank"]
    one = run_cli(*base, "--query-id-col", "user_id", "-o", tmp_path / "one.parquet")
    assert one.returncode == 0, one.stderr
    assert pq.read_schema(tmp_path / "one.parquet").field("query_id").type == pa.string()
    missing = run_cli(*base, "--query-id-col", "dt,user,query", "-o", tmp_path / "x.parquet")
    assert missing.returncode == 2
    assert "'user' (given with --query-id-col)" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def keyed(data, model) -> list:
    """The CLI arguments of a run of data ranked by the composite key (dt, user_id)."""
    return [data, "--model", model, *LABEL_FLAGS, "--query-id-col", "dt,user_id"]


def test_a_key_column_of_mixed_types_is_refused_naming_it(qwen3_causal, tmp_path):
    rows = nightly_rows()[:4]
    rows[2]["user_id"] = "seven"
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    result = run_cli(*keyed(data, qwen3_causal), "--rank", "-o", tmp_path / "o.parquet")
    assert result.returncode == 2
    assert "column 'user_id' mixes number" in result.stderr and "Traceback" not in result.stderr


def test_a_composite_key_in_jsonl_is_an_object(qwen3_causal, tmp_path):
    rows = nightly_rows()[:4]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    result = run_cli(*keyed(data, qwen3_causal), "--top-k", "1", "-o", "-", "-q")
    assert result.returncode == 0, result.stderr
    import json

    got = [json.loads(line)["query_id"] for line in result.stdout.splitlines()]
    assert got == [{"dt": r["dt"], "user_id": r["user_id"]} for r in rows]  # four distinct keys


# --- the columnar ranking against pandas, on random tables ------------------------------------------------


def random_part(seed: int, n: int) -> tuple[pa.Table, OutputContract]:
    """A ranked part of n rows: few keys, scores with exact ties, nulls, NaN and failed rows."""
    rng = np.random.default_rng(seed)
    contract = OutputContract((pa.string(), pa.int64()), (), None, "record", True, True, None)
    keys = [f"k{k}" for k in rng.integers(0, 5, n)]
    scores = rng.choice([0.25, 0.5, 0.75, -0.0, 0.0, np.inf, np.nan], n).astype(np.float32)
    failed = rng.random(n) < 0.1
    columns = {
        "row_index": list(range(n)),
        "query_id": keys,
        "item_id": list(range(n)),
        "score": [None if f else float(s) for f, s in zip(failed, scores)],
        "scores": [None if f else [float(s)] for f, s in zip(failed, scores)],
        "score_key": [None] * n,
        QUERY_KEY: keys,
        ERROR: ["bad" if f else None for f in failed],
    }
    return contract.part_table(columns), contract


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("top_k", [None, 1, 3])
def test_rank_rows_equals_a_pandas_groupby_rank(seed, top_k):
    table, contract = random_part(seed, 60)
    contract = OutputContract(
        *[
            getattr(contract, f)
            for f in ("id_types", "kept", "pooled_dim", "on_error", "query_ids_given", "ranked")
        ],
        top_k,
    )
    windows = [table.slice(0, 17), table.slice(17, 30), table.slice(47)]
    ranked = rank_parts(windows, contract)[0].to_pandas()
    frame = table.to_pandas()
    frame["score"] = frame["score"].astype("float64")
    scored = frame[frame["score"].notna()].copy()
    scored["rank"] = scored.groupby(QUERY_KEY, sort=False)["score"].rank(method="first", ascending=False)
    if top_k is not None:
        scored = scored[scored["rank"] <= top_k]
    order = {key: i for i, key in enumerate(dict.fromkeys(frame[QUERY_KEY]))}  # queries by first row
    expected = pd.concat([scored, frame[frame["score"].isna()]])
    expected["first"] = expected[QUERY_KEY].map(order)
    expected["failed"] = expected["score"].isna()
    expected = expected.sort_values(["first", "failed", "rank", "row_index"])
    assert ranked["row_index"].tolist() == expected["row_index"].tolist()
    assert ranked["rank"].fillna(0).astype(int).tolist() == expected["rank"].fillna(0).astype(int).tolist()


@pytest.mark.slow
def test_ray_ranks_a_composite_key_as_a_local_run_does(qwen3_causal, tmp_path):
    pytest.importorskip("ray")
    data = write_jsonl(tmp_path / "in.jsonl", nightly_rows())
    common = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--query-id-col", ",".join(KEY), "--top-k", "2"]
    local = run_cli(*common, "-o", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    ray = run_cli(
        *common, "-o", tmp_path / "ray_out", "--ray", "--num-workers", "1", "-q", fresh_process=True
    )
    assert ray.returncode == 0, ray.stderr
    expected = pq.read_table(tmp_path / "local.parquet").to_pylist()
    got = ds.dataset(tmp_path / "ray_out", format="parquet").to_table().to_pylist()
    keys = ("query_id", "item_id", "rank")
    assert [tuple(r[k] for k in keys) for r in got] == [tuple(r[k] for k in keys) for r in expected]
