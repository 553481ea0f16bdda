"""--reuse of an earlier output cut down by a downstream job (only score_key + score, or + scores; Parquet or
JSONL) or holding nulls: only rows with every value this run writes are copied, the rest scored again and
counted; never a null or a NaN copied as a score; an output without a score column is refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.earlier import complete_rows
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import many_rows

pytestmark = pytest.mark.slow
ITEMS = 18  # 6 queries × 3 items


@pytest.fixture(scope="module")
def fresh(qwen3_causal, tmp_path_factory):
    """The input, the run's flags, and a fresh run's output of it (the reference and the earlier output)."""
    root = tmp_path_factory.mktemp("trimmed")
    data = write_jsonl(root / "in.jsonl", many_rows(6, 3))
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "4"]
    output = root / "fresh.parquet"
    ran = run_cli(*base, "-o", output)
    assert ran.returncode == 0, ran.stderr
    return base, pq.read_table(output)


def write_earlier(table: pa.Table, path):
    """An earlier output as a downstream job keeps it: Parquet, or JSON lines (NaN written as null)."""
    if path.suffix == ".parquet":
        pq.write_table(table, path)
        return path
    clean = [{k: _json_safe(v) for k, v in row.items()} for row in table.to_pylist()]
    return write_jsonl(path, clean)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def rerun(base, tmp_path, *earlier):
    """A run of the same input reusing earlier (in order): its exit, stderr, report and output table."""
    out, report = tmp_path / "out.parquet", tmp_path / "report.json"
    reuse = [flag for path in earlier for flag in ("--reuse", path)]
    ran = run_cli(*base, "-o", out, "--overwrite", *reuse, "--report", report)
    assert ran.returncode == 0, ran.stderr
    return ran.stderr, json.loads(report.read_text()), pq.read_table(out)


def assert_as_fresh(out: pa.Table, fresh: pa.Table, copied: set, earlier: pa.Table | None = None) -> None:
    """Every row's values equal the fresh run's (scored again: within the batch-invariance bound; copied: the
    earlier output's bits); no score is null or NaN."""
    assert out["item_id"].to_pylist() == fresh["item_id"].to_pylist()
    assert out["score_key"].to_pylist() == fresh["score_key"].to_pylist()
    score = out["score"].to_numpy()
    assert out["score"].null_count == 0 and np.isfinite(score).all()
    scores = np.array(out["scores"].to_pylist(), np.float32)  # [items, 2]
    assert np.isfinite(scores).all()
    np.testing.assert_allclose(score, fresh["score"].to_numpy(), atol=1e-6)
    np.testing.assert_allclose(scores, np.array(fresh["scores"].to_pylist(), np.float32), atol=1e-6)
    if earlier is not None:
        old = dict(zip(earlier["score_key"].to_pylist(), earlier["score"].to_pylist()))
        for key, value in zip(out["score_key"].to_pylist(), score.tolist()):
            if key in copied:
                assert np.float32(value).tobytes() == np.float32(old[key]).tobytes()


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
@pytest.mark.parametrize("kept, missing", [("score", "scores"), ("scores", "score")])
def test_a_trimmed_earlier_output_is_scored_again_never_copied_as_nulls(
    fresh, tmp_path, suffix, kept, missing
):
    base, reference = fresh
    earlier = write_earlier(reference.select(["score_key", kept]), tmp_path / f"trimmed{suffix}")
    stderr, report, out = rerun(base, tmp_path, earlier)
    assert (report["reused"], report["reuse_incomplete"], report["items_scored"]) == (0, ITEMS, ITEMS)
    assert f"--reuse {earlier} has no {missing} column, which this run writes" in stderr
    assert f"{ITEMS} pairs scored again (an earlier output lacked a value)" in stderr.splitlines()[-1]
    assert_as_fresh(out, reference, set())


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_only_the_earlier_rows_with_every_value_are_copied(fresh, tmp_path, suffix):
    base, reference = fresh
    rows = reference.to_pylist()
    rows[1]["score"] = None
    rows[4]["scores"] = None
    rows[7]["scores"] = [rows[7]["scores"][0], float("nan")]  # JSONL: a null in the list
    rows[9]["score"] = float("nan")  # JSONL: null
    rows[12]["scores"] = []
    earlier = write_earlier(pa.Table.from_pylist(rows, reference.schema), tmp_path / f"holes{suffix}")
    stderr, report, out = rerun(base, tmp_path, earlier)
    holes = {rows[k]["score_key"] for k in (1, 4, 7, 9, 12)}
    assert (report["reused"], report["reuse_incomplete"], report["items_scored"]) == (ITEMS - 5, 5, 5)
    assert f"{ITEMS - 5} pairs of this run found in 1 earlier output file(s); 5 more found without" in stderr
    copied = set(reference["score_key"].to_pylist()) - holes
    assert_as_fresh(out, reference, copied, reference)


def test_a_complete_row_of_a_later_output_wins_over_an_incomplete_one(fresh, tmp_path):
    base, reference = fresh
    trimmed = write_earlier(reference.select(["score_key", "score"]), tmp_path / "trimmed.parquet")
    full = write_earlier(reference, tmp_path / "full.jsonl")
    _, report, out = rerun(base, tmp_path, trimmed, full)
    assert (report["reused"], report["reuse_incomplete"], report["items_scored"]) == (ITEMS, 0, 0)
    assert_as_fresh(out, reference, set(reference["score_key"].to_pylist()), reference)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
@pytest.mark.parametrize(
    "columns, said",
    [
        (["score_key", "item_id"], "has no score column (nor scores)"),
        (["item_id", "score", "scores"], "has no score_key column"),
    ],
)
def test_an_earlier_output_without_a_key_or_a_score_column_is_refused(fresh, tmp_path, suffix, columns, said):
    base, reference = fresh
    earlier = write_earlier(reference.select(columns), tmp_path / f"cut{suffix}")
    out = tmp_path / "out.parquet"
    ran = run_cli(*base, "-o", out, "--reuse", earlier)
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert lines[-1].startswith(f"score-batch: error: --reuse {str(earlier)!r} {said}"), lines[-1]
    assert not out.exists()


def test_complete_rows_wants_every_value_non_null_finite_and_lists_non_empty():
    table = pa.table(
        {
            "score": pa.array([0.5, None, float("nan"), 0.1, 0.2, 0.3, float("inf")], pa.float32()),
            "scores": pa.array([[0.5], [0.1], [0.1], None, [0.2, None], [], [0.1]], pa.list_(pa.float32())),
            "chunks": pa.array([1, 1, 1, 1, 1, 1, 1], pa.int32()),
        }
    )
    assert complete_rows(table, ["score", "scores", "chunks"]).tolist() == [1, 0, 0, 0, 0, 0, 0]
    assert complete_rows(table, ["score"]).tolist() == [1, 0, 0, 1, 1, 1, 0]
    assert complete_rows(table, ["score", "pooled_hidden_state"]).tolist() == [0] * 7  # a column missing
    pooled = pa.array([[1.0, 2.0], None, [3.0, float("nan")]], pa.list_(pa.float32(), 2))
    assert complete_rows(pa.table({"p": pooled}), ["p"]).tolist() == [1, 0, 0]
