"""score-batch --ray on a local Ray (CPU, 2 workers): same rows and scores as a local run, a killed actor
retried, per-row errors under --on-error, and a clear exit without Ray installed."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, write_jsonl
from tests.test_cli import run_cli as run_in_process


def run_cli(*args, **kwargs):
    """Ray runs start their own processes: a fresh command process gives each test its own Ray."""
    return run_in_process(*args, fresh_process=True, **kwargs)


pytestmark = pytest.mark.slow


def _rows(n_queries: int = 12) -> list[dict]:
    """Long-layout rows whose queries are interleaved, so groups span row groups and files."""
    rows = []
    for k in range(6):
        for q in range(n_queries):
            item = " the flag of" * (k % 3) + f" item {k}"
            rows.append(
                {"query_id": f"q{q}", "query": f"Tokyo is a city {q}", "item_id": f"q{q}-{k}", "item": item}
            )
    rows[7]["item"] = None  # a row error
    return rows


def _compare(ray_dir, local_file, error_column: bool):
    ray_table = pq.read_table(ray_dir).sort_by("row_index")
    local = pq.read_table(local_file)
    assert ray_table.schema.remove(ray_table.schema.get_field_index("row_index")) == local.schema
    assert ray_table.column("item_id").to_pylist() == local.column("item_id").to_pylist()
    ours = np.array(ray_table.column("score").to_pylist(), dtype=np.float64)
    theirs = np.array(local.column("score").to_pylist(), dtype=np.float64)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.nanmax(np.abs(ours - theirs)) <= 1e-6
    if error_column:
        assert ray_table.column("error").to_pylist() == local.column("error").to_pylist()
    return ray_table


def test_ray_run_equals_local_run_and_survives_a_killed_actor(qwen3_causal, tmp_path):
    pytest.importorskip("ray")
    rows = _rows()
    src = tmp_path / "in"
    src.mkdir()
    table = pa.Table.from_pylist(rows)
    pq.write_table(table.slice(0, 40), src / "a.parquet", row_group_size=16)  # groups span row groups
    pq.write_table(table.slice(40), src / "b.parquet", row_group_size=16)  # … and files
    common = [src, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "-q"]
    local = run_cli(*common, "-o", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    marker = tmp_path / "killed-once"
    out = tmp_path / "out"
    result = run_cli(
        *common, "-o", out, "--ray", "--num-workers", "2", env={"SCORE_BATCH_FAULT_ONCE": str(marker)}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert marker.exists()  # one actor process died mid-run and Ray retried its batch
    ray_table = _compare(out, tmp_path / "local.parquet", error_column=True)
    assert ray_table.column("row_index").to_pylist() == list(range(len(rows)))
    assert "column 'item' is null" in ray_table.column("error")[7].as_py()
    again = run_cli(*common, "-o", out, "--ray")
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_ray_nested_jsonl_with_skip(qwen3_causal, tmp_path):
    pytest.importorskip("ray")
    nested = [
        {"query": "I pledge allegiance", "items": [" to", " the flag of", "x" * 3000], "tag": "a"},
        {"query": "Tokyo is a city in", "items": [" Japan", " the country"], "tag": "b"},
        {"query": "héllo wörld", "items": [" ünïcödé"], "tag": "c"},
    ]
    src = write_jsonl(tmp_path / "in.jsonl", nested)
    common = [src, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "skip", "--keep-columns", "tag", "-q"]
    common += ["--max-item-tokens", "64"]
    local = run_cli(*common, "-o", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    out = tmp_path / "out"
    result = run_cli(*common, "-o", out, "--ray", "--num-workers", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    _compare(out, tmp_path / "local.parquet", error_column=False)
    skipped = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert [(s["row_index"], s["item_id"]) for s in skipped] == [(0, 2)]


def test_ray_usage_errors_and_missing_ray(qwen3_causal, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"query": "a", "item": " b"}])
    blocked = run_cli(
        "-c",
        "import sys; sys.modules['ray'] = None; sys.argv[0] = 'score-batch'; from cli.main import run; run()",
        src,
        "-o",
        tmp_path / "out",
        "--ray",
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        python_args=True,
    )
    assert blocked.returncode == 2 and "pip install -e '.[ray]'" in blocked.stderr
    pytest.importorskip("ray")
    to_stdout = run_cli(src, "-o", "-", "--ray", "--model", qwen3_causal, *LABEL_FLAGS)
    assert to_stdout.returncode == 2 and "OUTPUT_DIR" in to_stdout.stderr
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"query": "a", "item": " b"}, {"query": "a", "item": None}])
    failed = run_cli(bad, "-o", tmp_path / "out", "--ray", "--model", qwen3_causal, *LABEL_FLAGS, "-q")
    assert failed.returncode == 2 and "row 1: column 'item' is null" in failed.stderr
    assert not (tmp_path / "out").exists()
