"""Rankings (--rank, --top-k) against a sort of the full scores; operations: env vars, --version, progress lines, logs."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, REPO, run_cli, write_jsonl


def ranking_rows() -> list[dict]:
    """Three queries whose rows interleave, with one failing row; no item twice under one query.

    Two copies of one item score equal only up to float rounding (their pack positions differ), so their
    order could flip between runs or machines: exact ties are tested on hand-built tables instead
    (tests/test_ranking_groups.py).
    """
    rows = []
    for i in range(5):
        for q in ("a", "b", "c"):
            item = " the flag" if i == 1 else f" item {i} of {q}"
            rows.append(
                {"query_id": q, "query": f"query {q} about Tokyo", "item_id": f"{q}{i}", "item": item}
            )
    rows[4]["item"] = None  # b1 fails
    return rows


def expected_order(scored: list[dict], top_k: int | None) -> list[tuple[str, int | None]]:
    """(item_id, rank) in the documented order, from plain Python sorting of the unranked scores."""
    queries = list(dict.fromkeys(row["query_id"] for row in scored))
    order = []
    for query in queries:
        rows = [(i, row) for i, row in enumerate(scored) if row["query_id"] == query]
        good = sorted((r for r in rows if r[1]["score"] is not None), key=lambda r: (-r[1]["score"], r[0]))
        good = good[:top_k] if top_k else good
        order += [(row["item_id"], rank) for rank, (_, row) in enumerate(good, start=1)]
        order += [(row["item_id"], None) for _, row in rows if row["score"] is None]
    return order


@pytest.mark.parametrize("top_k", [None, 2])
def test_rank_and_top_k_follow_a_sort_of_the_full_scores_across_windows(qwen3_causal, tmp_path, top_k):
    data = write_jsonl(tmp_path / "in.jsonl", ranking_rows())
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "--window-rows", "4"]
    plain = run_cli(*base, "-o", tmp_path / "plain.parquet")
    assert plain.returncode == 0, plain.stderr
    scored = pq.read_table(tmp_path / "plain.parquet").to_pylist()
    for query in ("a", "b", "c"):  # no near ties: the order cannot hinge on float rounding
        values = sorted(r["score"] for r in scored if r["query_id"] == query and r["score"] is not None)
        assert min(b - a for a, b in zip(values, values[1:])) > 1e-6
    flag = ["--top-k", str(top_k)] if top_k else ["--rank"]
    ranked = run_cli(*base, *flag, "-o", tmp_path / "ranked.parquet")
    assert ranked.returncode == 0, ranked.stderr
    table = pq.read_table(tmp_path / "ranked.parquet")
    assert table.column_names[:4] == ["query_id", "item_id", "score", "rank"]
    got = [(row["item_id"], row["rank"]) for row in table.to_pylist()]
    assert got == expected_order(scored, top_k)
    by_id = {row["item_id"]: row["score"] for row in scored}
    assert all(row["score"] == by_id[row["item_id"]] for row in table.to_pylist())
    # The same ranking on stdout.
    streamed = run_cli(*base, *flag, "-o", "-", "-q")
    assert [
        (json.loads(line)["item_id"], json.loads(line)["rank"]) for line in streamed.stdout.splitlines()
    ] == got


def test_top_k_under_skip_lists_failed_rows_and_ranks_the_rest(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", ranking_rows())
    out = tmp_path / "o.parquet"
    result = run_cli(
        data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "skip", "--top-k", "1", "-o", out
    )
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(out).to_pylist()
    assert [row["query_id"] for row in rows] == ["a", "b", "c"] and {row["rank"] for row in rows} == {1}
    skipped = [json.loads(line) for line in (tmp_path / "o.parquet.errors.jsonl").read_text().splitlines()]
    assert [s["item_id"] for s in skipped] == ["b1"]


def test_options_from_environment_variables_and_flags_win(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", ranking_rows()[:3])
    env = {"SCORE_BATCH_MODEL": str(qwen3_causal), "SCORE_BATCH_TOP_K": "1", "SCORE_BATCH_ON_ERROR": "record"}
    out = tmp_path / "o.parquet"
    result = run_cli(data, "-o", out, *LABEL_FLAGS, env=env)
    assert result.returncode == 0, result.stderr
    assert pq.read_table(out).column("rank").to_pylist() == [1, 1, 1]
    flag_wins = run_cli(data, "-o", out, *LABEL_FLAGS, "--top-k", "5", "--overwrite", env=env)
    assert flag_wins.returncode == 0, flag_wins.stderr
    assert pq.read_table(out).num_rows == 3
    bad = run_cli(data, "-o", out, *LABEL_FLAGS, "--overwrite", env={**env, "SCORE_BATCH_WINDOW_ROWS": "0"})
    assert bad.returncode == 2 and "--window-rows" in bad.stderr


def test_version_threads_and_json_logs(qwen3_causal, tmp_path):
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("score-batch ")
    data = write_jsonl(tmp_path / "in.jsonl", ranking_rows()[:3])
    result = run_cli(
        data,
        "-o",
        tmp_path / "o.parquet",
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "--threads",
        "1",
        "--log-format",
        "json",
        "--report",
        tmp_path / "r.json",
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert records and all(r["level"] in ("INFO", "WARNING") and r["message"] for r in records)
    assert json.loads((tmp_path / "r.json").read_text())["settings"]["threads"] == 1
    refused = run_cli(
        data, "-o", tmp_path / "p.parquet", "--model", qwen3_causal, *LABEL_FLAGS, "--threads", "0"
    )
    assert refused.returncode == 2 and "--threads" in refused.stderr


def json_lines(stderr: str) -> list[dict]:
    """Every line of stderr as a JSON object (fails on any other line)."""
    lines = stderr.splitlines()
    assert lines, "nothing on stderr"
    return [json.loads(line) for line in lines]


def test_json_log_format_makes_every_stderr_line_a_json_object(qwen3_causal, tmp_path):
    """The summary, the report on stderr, `score-batch: error:` lines and usage errors: one object per line."""
    data = write_jsonl(tmp_path / "in.jsonl", ranking_rows()[:3])
    out = tmp_path / "o.parquet"
    flags = ["--model", qwen3_causal, *LABEL_FLAGS, "--log-format", "json"]
    done = run_cli(data, "-o", out, *flags, "--report", "-", fresh_process=True)
    assert done.returncode == 0, done.stderr
    records = json_lines(done.stderr)
    assert [r["message"] for r in records if r.get("logger") == "score_batch.cli"][0].startswith(
        "scored 3 items"
    )
    assert [r["status"] for r in records if "status" in r] == ["succeeded"]  # --report -
    exists = run_cli(data, "-o", out, *flags)
    assert exists.returncode == 2
    assert [(r["level"], "--overwrite" in r["message"]) for r in json_lines(exists.stderr)][-1] == (
        "ERROR",
        True,
    )
    bad_value = run_cli(data, "-o", tmp_path / "p.parquet", *flags, "--threads", "0")
    assert bad_value.returncode == 2 and "--threads" in json_lines(bad_value.stderr)[-1]["message"]
    for usage, env in (
        (["--log-format=json", "--threads", "x"], {}),
        (["--bogus"], {"SCORE_BATCH_LOG_FORMAT": "json"}),
    ):
        refused = run_cli(data, "-o", tmp_path / "p.parquet", *usage, env=env, fresh_process=True)
        assert refused.returncode == 2
        assert [r["level"] for r in json_lines(refused.stderr)] == ["ERROR"], refused.stderr


@pytest.mark.slow
def test_progress_lines_appear_during_a_run_when_stderr_is_a_pipe(qwen3_causal, tmp_path):
    rows = [{"query": f"query {q}", "item": f" item {i}"} for q in range(60) for i in range(4)]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    command = [
        sys.executable,
        "-m",
        "score_batch.cli.main",
        data,
        "-o",
        tmp_path / "o.parquet",
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "--window-rows",
        "8",
        "--max-batch-tokens",
        "64",
        "--progress-seconds",
        "0.05",
    ]
    process = subprocess.Popen(list(map(str, command)), cwd=REPO, stderr=subprocess.PIPE, text=True)
    first_progress_line = None
    for line in process.stderr:
        if "progress:" in line:
            first_progress_line = line
            break
    running_when_seen = process.poll() is None
    process.stderr.read()
    assert process.wait(timeout=300) == 0
    assert first_progress_line is not None and running_when_seen
    assert "items/s" in first_progress_line and "ETA" in first_progress_line
