"""Hostile ranking inputs: composite keys of odd types, the generated query_id, --ranked-output beside OUTPUT
(every row accounted for, collisions by another spelling, kill -9 and --resume), --reuse of each. Checked
against pandas groupby-ranks, hashlib and pyarrow reads, never against the code itself."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import signal

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


@pytest.mark.parametrize("output,view", [("out.parquet", "view.jsonl"), ("out.jsonl", "view.parquet")])
def test_ranked_output_under_skip_accounts_for_every_row(qwen3_causal, tmp_path, output, view):
    """OUTPUT rows + errors == input rows, each row once; the view is pandas' top-k of OUTPUT's scores."""
    rows = failing_rows()
    flags = [
        "--window-rows",
        "4",
        "--top-k",
        "2",
        "--on-error",
        "skip",
        "--errors-file",
        tmp_path / "e.jsonl",
    ]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    ran = score(qwen3_causal, data, *flags, "-o", tmp_path / output, "--ranked-output", tmp_path / view)
    assert ran.returncode == 0, ran.stderr

    def read(path):
        return (
            pq.read_table(path).to_pandas() if path.suffix == ".parquet" else pd.DataFrame(jsonl_rows(path))
        )

    out, top = read(tmp_path / output), read(tmp_path / view)
    errors = jsonl_rows(tmp_path / "e.jsonl")
    assert sorted([*out["item_id"], *(e["item_id"] for e in errors)]) == list(range(len(rows)))
    assert {e["item_id"] for e in errors} == {i for i, r in enumerate(rows) if r["item"] is None}
    want = ranks_by(out, ["query_id"], top_k=2)
    first = {query: k for k, query in reversed(list(enumerate(out["query_id"])))}  # queries by first row
    order = want.assign(first=want["query_id"].map(first)).sort_values(["first", "rank"])
    assert list(zip(top["item_id"], top["rank"])) == list(zip(order["item_id"], order["rank"]))


def test_ranked_output_spelled_another_way_is_refused(qwen3_causal, tmp_path):
    """./x, an absolute path and a path through a symlinked directory all name OUTPUT: one line, exit 2."""
    data = write_jsonl(tmp_path / "in.jsonl", failing_rows(3))
    (tmp_path / "link").symlink_to(tmp_path)
    for view in ("./out.parquet", str(tmp_path / "out.parquet"), "link/out.parquet"):
        ran = score(qwen3_causal, data, "--rank", "-o", "out.parquet", "--ranked-output", view, cwd=tmp_path)
        assert ran.returncode == 2 and "same path" in ran.stderr, (view, ran.stderr)
        assert len(ran.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.parquet").exists()


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_uninterrupted_outputs(job):
    """A --top-k run with --ranked-output killed after two parts, resumed: both files as an uninterrupted run
    writes them (the view's JSON lines byte for byte), the view at the path the resume names."""
    from tests.test_job import start_cli, wait_for_parts

    base, _, tmp_path = job
    flags = ["--top-k", "3", "--on-error", "record"]
    whole = run_cli(
        *base, *flags, "-o", tmp_path / "whole.parquet", "--ranked-output", tmp_path / "whole.jsonl"
    )
    assert whole.returncode == 0, whole.stderr
    out, view = tmp_path / "out.parquet", tmp_path / "view.jsonl"
    process = start_cli(*base, *flags, "-o", out, "--ranked-output", view)
    wait_for_parts(tmp_path / "out.parquet.parts", 2, process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not out.exists() and not view.exists()
    moved = tmp_path / "moved.jsonl"  # the operator moved the view: the parts are the same run's
    resumed = run_cli(*base, *flags, "-o", out, "--ranked-output", moved, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert moved.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert pq.read_table(out).equals(pq.read_table(tmp_path / "whole.parquet"))
    assert not os.path.exists(f"{out}.parts")


def test_reuse_of_the_view_warns_and_of_output_reuses_every_pair(qwen3_causal, tmp_path):
    """--reuse OUTPUT of a --ranked-output run reuses every scored pair; --reuse of its Parquet view warns."""
    rows = [{"query": ["q a", "q b"][i % 2], "item": ITEMS[i % 7]} for i in range(14)]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS]
    ran = run_cli(
        *base, "--top-k", "2", "-o", tmp_path / "all.parquet", "--ranked-output", tmp_path / "v.parquet"
    )
    assert ran.returncode == 0, ran.stderr
    scored = pq.read_table(tmp_path / "all.parquet")
    for reused, partial in (("all.parquet", False), ("v.parquet", True)):
        report = tmp_path / f"{reused}.report.json"
        again = run_cli(
            *base, "--reuse", tmp_path / reused, "-o", tmp_path / f"again-{reused}", "--report", report
        )
        assert again.returncode == 0, again.stderr
        counts = json.loads(report.read_text())
        got = pq.read_table(tmp_path / f"again-{reused}")["score"].to_numpy()
        assert np.allclose(got, scored["score"].to_numpy(), rtol=1e-4, atol=0), reused
        if not partial:  # every pair copied: bit for bit
            assert list(got) == scored["score"].to_pylist(), (counts, again.stderr)
        if partial:
            assert "--top-k" in again.stderr and counts["reused"] == 4  # 2 queries × top 2
        else:
            assert counts["reused"] + counts["duplicates"] == len(rows) and counts["items_scored"] == 0


@pytest.mark.parametrize("output", ["out.parquet", "out.jsonl"])
def test_resume_of_a_complete_run_whose_view_is_gone_never_says_complete(qwen3_causal, tmp_path, output):
    """An Airflow retry (--resume) after the view was removed: not "already complete" with exit 0 and no view;
    one line, exit 2, naming the view and --overwrite (which scores both again)."""
    rows = [{"query": ["q a", "q b"][i % 2], "item": ITEMS[i % 7]} for i in range(8)]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    flags = ["--top-k", "1", "-o", tmp_path / output, "--ranked-output", tmp_path / "view.jsonl", "--resume"]
    assert score(qwen3_causal, data, *flags).returncode == 0
    first = (tmp_path / "view.jsonl").read_bytes()
    (tmp_path / "view.jsonl").unlink()
    again = score(qwen3_causal, data, *flags)
    assert again.returncode == 2, again.stderr
    errors = [line for line in again.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "view.jsonl" in errors[0] and "--overwrite" in errors[0], again.stderr
    assert score(qwen3_causal, data, *flags, "--overwrite").returncode == 0
    assert (tmp_path / "view.jsonl").read_bytes() == first


def test_the_view_spelled_another_way_resumes(qwen3_causal, tmp_path):
    """The run identity holds that a view is written, not how its path is spelled: a retry with ./v.jsonl or
    the absolute path (another working directory) is the same run ("already complete"), not refused."""
    data = write_jsonl(tmp_path / "in.jsonl", failing_rows(6))
    flags = ["--top-k", "1", "--on-error", "record", "--resume"]
    first = score(qwen3_causal, data, *flags, "-o", "o.parquet", "--ranked-output", "v.jsonl", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    for view, cwd in (("./v.jsonl", tmp_path), (str(tmp_path / "v.jsonl"), tmp_path.parent)):
        again = score(
            qwen3_causal, data, *flags, "-o", tmp_path / "o.parquet", "--ranked-output", view, cwd=cwd
        )
        assert again.returncode == 0 and "already complete" in again.stderr, again.stderr


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
    paths = [
        "-o",
        tmp_path / output,
        "--ranked-output",
        tmp_path / "v.jsonl",
        "--report",
        tmp_path / "r.json",
    ]
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
        (["--ranked-output", "v.parquet"], "needs --rank or --top-k"),
        (["--rank", "-o", "-", "--ranked-output", "v.parquet"], "not -"),
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
