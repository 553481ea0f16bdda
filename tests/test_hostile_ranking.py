"""Hostile ranking inputs: composite keys of odd types, the generated query_id, the failed-rate verdict of a
ranked run retried, ranking flags refused. Checked against pandas groupby-ranks, hashlib and pyarrow reads, never
against the code itself."""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl

ITEMS = [" to", " the flag of", " Japan", " the", " a city", " over there", " here"]


def ranks_by(frame: pd.DataFrame, key: list[str], top_k: int | None = None) -> pd.DataFrame:
    """pandas: each group's rank by score, ties by input order; nulls (NaN) a key value."""
    frame = frame.assign(
        rank=frame.groupby(key, dropna=False, sort=False)["score"]
        .rank(method="first", ascending=False)
        .astype(int)
    )
    return frame if top_k is None else frame[frame["rank"] <= top_k]


def digest(query) -> int:
    """docs/ranking.md's generated query_id, written out with hashlib."""
    data = b"t" + query.encode() if isinstance(query, str) else b"i" + json.dumps(query).encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1


def test_minus_zero_and_zero_in_a_key_column_are_one_ranking(qwen3_causal, tmp_path):
    """-0.0 == 0.0: one ranking with one rank 1, as pandas, SQL's GROUP BY and DuckDB group them."""
    ks = [0.0, -0.0, 0.0, -0.0, 1.5, -0.0]
    rows = [{"k": k, "query": "Tokyo is a city in", "item": ITEMS[i]} for i, k in enumerate(ks)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    base = [tmp_path / "in.parquet", "--model", qwen3_causal, *LABEL_FLAGS, "--query-id-col", "k,query"]
    assert run_cli(*base, "-o", tmp_path / "plain.parquet").returncode == 0
    assert run_cli(*base, "--rank", "-o", tmp_path / "ranked.parquet").returncode == 0
    frame = pd.DataFrame(rows).assign(score=pq.read_table(tmp_path / "plain.parquet")["score"].to_pylist())
    want = ranks_by(frame.assign(item_id=range(len(rows))), ["k", "query"])
    got = pq.read_table(tmp_path / "ranked.parquet").to_pandas()
    assert dict(zip(got["item_id"], got["rank"])) == dict(zip(want["item_id"], want["rank"]))
    assert (got["rank"] == 1).sum() == 2  # {0.0, -0.0} and {1.5}


def test_a_key_column_only_some_files_have_is_null_in_the_others(qwen3_causal, tmp_path):
    """dt from a partition directory in one file, none for a file at the top: its rows' dt is null, a ranking
    of their own (a key value, never joined to the dated rows)."""
    data = tmp_path / "in"
    (data / "dt=2026-11-27").mkdir(parents=True)
    dated = {"query": ["q"] * 3, "item": ITEMS[:3]}
    undated = {"query": ["q"] * 3, "item": ITEMS[3:6]}
    pq.write_table(pa.table(dated), data / "dt=2026-11-27" / "a.parquet")
    pq.write_table(pa.table(undated), data / "b.parquet")
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--query-id-col", "dt,query"]
    ran = run_cli(*base, "-o", tmp_path / "plain.parquet")
    if ran.returncode == 2:  # refused before scoring: one line naming the column and both files
        assert "'dt'" in ran.stderr and "b.parquet" in ran.stderr and "a.parquet" in ran.stderr
        assert len(ran.stderr.strip().splitlines()) == 1 and not (tmp_path / "plain.parquet").exists()
        return
    assert ran.returncode == 0, ran.stderr
    ran = run_cli(*base, "--top-k", "2", "-o", tmp_path / "top.parquet")
    assert ran.returncode == 0, ran.stderr
    plain = pq.read_table(tmp_path / "plain.parquet").flatten().to_pandas()
    assert plain["query_id.dt"].isna().sum() == 3 and plain["query_id.dt"].notna().sum() == 3
    want = ranks_by(plain, ["query_id.dt", "query_id.query"], top_k=2)
    got = pq.read_table(tmp_path / "top.parquet").to_pandas()
    assert sorted(zip(got["item_id"], got["rank"])) == sorted(zip(want["item_id"], want["rank"]))


def test_the_generated_query_id_is_the_documented_digest(qwen3_causal, tmp_path):
    """Texts equal after Unicode normalization still differ (two ids), token-id queries get the JSON digest."""
    texts = ["caf\u00e9", "cafe\u0301", "caf\u00e9 ", "caf\u00e9"]
    rows = [{"query": q, "item": ITEMS[i]} for i, q in enumerate(texts)]
    ran = score(qwen3_causal, write_jsonl(tmp_path / "t.jsonl", rows), "-o", tmp_path / "t.parquet")
    assert ran.returncode == 0, ran.stderr
    assert pq.read_table(tmp_path / "t.parquet")["query_id"].to_pylist() == [digest(q) for q in texts]
    tokens = [{"query_tokens": [5, 6, 7], "item_tokens": [8]}, {"query_tokens": [5, 6], "item_tokens": [8]}]
    ran = score(qwen3_causal, write_jsonl(tmp_path / "i.jsonl", tokens), "-o", tmp_path / "i.parquet")
    assert ran.returncode == 0, ran.stderr
    want = [digest([5, 6, 7]), digest([5, 6])]
    assert pq.read_table(tmp_path / "i.parquet")["query_id"].to_pylist() == want


def score(model, data, *flags, **how):
    """One score run of DATA with the tiny model and its label tokens."""
    return run_cli(data, "--model", model, *LABEL_FLAGS, *flags, **how)


def failing_rows(n: int = 21) -> list[dict]:
    """Three queries, every fifth item null (a row error)."""
    return [
        {"query": ["q a", "q b", "q c"][i % 3], "item": None if i % 5 == 4 else ITEMS[i % 7]}
        for i in range(n)
    ]


def jsonl_rows(path) -> list[dict]:
    return [json.loads(line) for line in open(path) if line.strip()]


def test_the_input_and_model_spelled_another_way_are_the_same_run(qwen3_causal, tmp_path):
    """The identity checks the input and the model by content: ./in.jsonl, an absolute path or a symlinked
    model directory on a retry is "already complete", not "completed differently: setting input …"."""
    data = write_jsonl(tmp_path / "in.jsonl", failing_rows(6))
    (tmp_path / "m").symlink_to(qwen3_causal)
    flags = ["--on-error", "record", "--resume", "-o", "o.parquet", *LABEL_FLAGS]
    first = run_cli("in.jsonl", "--model", qwen3_causal, *flags, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    for spelled, model in (("./in.jsonl", qwen3_causal), (str(data), qwen3_causal), ("in.jsonl", "m")):
        again = run_cli(spelled, "--model", model, *flags, cwd=tmp_path)
        assert again.returncode == 0 and "already complete" in again.stderr, (spelled, model, again.stderr)
    changed = write_jsonl(tmp_path / "other.jsonl", failing_rows(7))  # another content: still refused
    refused = run_cli(changed, "--model", qwen3_causal, *flags, cwd=tmp_path)
    assert refused.returncode == 2 and "the input changed" in refused.stderr, refused.stderr


def test_a_failed_row_of_a_composite_key_names_its_key_as_json(qwen3_causal, tmp_path):
    """The error message names a struct query_id as the errors file holds it (JSON), not as Python's repr."""
    day = dt.date(2026, 11, 27)
    rows = [{"dt": day, "user_id": None, "query": "q", "item": item} for item in (" to", None)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    key = ["--query-id-col", "dt,user_id,query", "--on-error", "skip"]
    ran = score(qwen3_causal, "in.parquet", *key, "--errors-file", "e.jsonl", "-o", "o.parquet", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    (error,) = jsonl_rows(tmp_path / "e.jsonl")
    assert error["query_id"] == {"dt": "2026-11-27", "user_id": None, "query": "q"}
    assert error["error"].endswith(f"(query_id={json.dumps(error['query_id'])}, item_id=1)"), error["error"]


def test_a_hostile_batch_file_answers_every_request_as_plain_scores_rank_it(qwen3_causal, tmp_path):
    """Duplicate custom_ids, an empty document, a repeated document, top_n huge / 0 / -1 / 1, requests of one
    query across windows: one line per request in order, results best first, top_n kept, each score the plain
    run's score of the pair (window sizes 1 and 1000 alike)."""
    docs = ["", " to", " the flag of", " Japan", " to"]
    top_ns = [10**12, 0, -1, 1, 3]
    requests = [
        {
            "custom_id": "same",
            "method": "POST",
            "url": "/v1/rerank",
            "body": {"query": ["q a", "q b"][i % 2], "documents": docs[: 2 + i % 4], "top_n": top_ns[i % 5]},
        }
        for i in range(10)
    ]
    batch = write_jsonl(tmp_path / "req.jsonl", requests)
    pairs = [{"query": r["body"]["query"], "item": d} for r in requests for d in r["body"]["documents"]]
    assert (
        score(
            qwen3_causal, write_jsonl(tmp_path / "pairs.jsonl", pairs), "-o", tmp_path / "p.parquet"
        ).returncode
        == 0
    )
    plain = iter(pq.read_table(tmp_path / "p.parquet")["score"].to_pylist())
    want = [[next(plain) for _ in r["body"]["documents"]] for r in requests]
    for window in ("1", "1000"):
        out = tmp_path / f"out{window}.jsonl"
        ran = run_cli(
            "run-batch",
            "-i",
            batch,
            "-o",
            out,
            "--model",
            qwen3_causal,
            *LABEL_FLAGS,
            "--window-rows",
            window,
        )
        assert ran.returncode == 0, ran.stderr
        lines = jsonl_rows(out)
        assert [line["custom_id"] for line in lines] == ["same"] * len(requests)
        for request, line, scores in zip(requests, lines, want):
            body, top_n = request["body"], request["body"]["top_n"]
            results = line["response"]["body"]["results"]
            assert line["error"] is None and len(results) == (
                min(top_n, len(scores)) if top_n > 0 else len(scores)
            )
            got = [r["relevance_score"] for r in results]
            assert got == sorted(got, reverse=True)
            assert [r["document"]["text"] for r in results] == [
                body["documents"][r["index"]] for r in results
            ]
            assert np.allclose(got, [scores[r["index"]] for r in results], rtol=1e-5, atol=0)


@pytest.mark.parametrize("output", ["o.parquet", "o.jsonl"])
def test_a_retry_of_a_run_over_the_failed_rate_fails_again(qwen3_causal, tmp_path, output):
    """Airflow retries a failed task: a --resume of a run that ended over --max-failed-rate (exit 4) must not
    turn green ("already complete", exit 0, status succeeded) while the output still holds the failures."""
    rows = [{"query": "q", "item": None if i % 2 else " to"} for i in range(6)]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    flags = ["--top-k", "1", "--on-error", "skip", "--max-failed-rate", "0.1", "--resume"]
    paths = ["-o", tmp_path / output, "--report", tmp_path / "r.json"]
    for attempt in range(2):
        ran = score(qwen3_causal, data, *flags, *paths)
        assert ran.returncode == 4, (attempt, ran.stderr)
        assert "3 of 6 items failed" in ran.stderr
        assert json.loads((tmp_path / "r.json").read_text())["status"] == "failed"
    relaxed = score(qwen3_causal, data, *flags[:-3], "--max-failed-rate", "0.5", "--resume", *paths)
    assert relaxed.returncode == 0 and "already complete" in relaxed.stderr, relaxed.stderr


@pytest.mark.parametrize(
    "flags,said",
    [
        (["--top-k", "0"], "--top-k"),
        (["--rank", "--ranked-output", "v.parquet"], "--ranked-output is removed: pass --rank"),
        (["--rank", "--query-id-col", ","], "names no column"),
        (["--rank", "--query-id-col", "dt, dt"], "names 'dt' twice"),
        (["--rank", "--query-id-col", "dt,user"], "'user'"),
        (["--rank", "--query-id-col", "dt,query", "--keep-columns", "query_id"], "query_id"),
    ],
)
def test_hostile_ranking_flags_are_one_line_exit_2(qwen3_causal, tmp_path, flags, said):
    rows = [{"dt": "2026-11-27", "query_id": 1, "query": "q", "item": " to"}]
    ran = score(qwen3_causal, write_jsonl(tmp_path / "in.jsonl", rows), "-o", tmp_path / "o.parquet", *flags)
    assert ran.returncode == 2 and said in ran.stderr, ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1 and "Traceback" not in ran.stderr


def test_spaces_around_the_key_columns_name_the_same_key(qwen3_causal, tmp_path):
    """' dt , query ' is the key dt,query: the same output, query_id's fields named without the spaces."""
    rows = [{"dt": ["d1", "d2"][i % 2], "query": "q", "item": ITEMS[i]} for i in range(4)]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    for name, key in (("a", "dt,query"), ("b", " dt , query ")):
        ran = score(qwen3_causal, data, "--rank", "--query-id-col", key, "-o", tmp_path / f"{name}.parquet")
        assert ran.returncode == 0, ran.stderr
    a, b = (pq.read_table(tmp_path / f"{name}.parquet") for name in "ab")
    assert [f.name for f in b.schema.field("query_id").type] == ["dt", "query"]
    assert a.select(["query_id", "item_id", "rank"]).equals(b.select(["query_id", "item_id", "rank"]))
