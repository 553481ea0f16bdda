"""One list of the columns the job writes (OutputContract.written_columns): --keep-columns may not take any of
them, refused with exit 2 before a model loads; the list is read off the schemas, so it cannot drift."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.columns import DUPLICATES, REUSE_INCOMPLETE, REUSED_FLAG
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.schema import ColumnMapping
from score_batch.job.preflight.contract import OutputContract, check_kept_columns
from score_batch.job.runners import local, ray_run
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl

ALL_WRITTEN = OutputContract.written_columns(ranked=True, pooled=True)


@pytest.mark.parametrize("ranked", [False, True])
@pytest.mark.parametrize("pooled", [False, True])
def test_written_columns_are_every_column_of_every_file_but_the_kept_ones(ranked, pooled):
    mapping = ColumnMapping("long", "query", "item", None, None, ("tag",))
    contract = OutputContract.from_types(
        mapping, {"tag": pa.int64()}, 4 if pooled else None, "record", ranked
    )
    files = [contract.part_schema(), contract.final_schema(), contract.ray_schema()]
    if ranked:
        files.append(contract.ranked_schema())
    names = {name for schema in files for name in schema.names} | {
        "row_index",
        "query_id",
        "item_id",
        "error",
        REUSED_FLAG,  # columns of the Ray actors' batches
        REUSE_INCOMPLETE,
        DUPLICATES,
    }
    assert set(OutputContract.written_columns(ranked=ranked, pooled=pooled)) == names - {"tag"}
    assert ("rank" in names) == ranked and ("pooled_hidden_state" in names) == pooled


def test_rank_and_pooled_names_are_free_when_not_written():
    check_kept_columns(("rank", "query_key", "pooled_hidden_state"), ranked=False, pooled=False)
    with pytest.raises(InputError, match="--keep-columns 'rank' would overwrite .* with --rank / --top-k"):
        check_kept_columns(("tag", "rank"), ranked=True, pooled=False)
    with pytest.raises(InputError, match="'pooled_hidden_state' would overwrite"):
        check_kept_columns(("pooled_hidden_state",), ranked=False, pooled=True)


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model or tokenizer load fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(local, "load_engine", refuse)
    monkeypatch.setattr(ray_run, "load_planner", refuse)


@pytest.mark.parametrize("name", ALL_WRITTEN)
def test_keep_columns_naming_a_written_column_exits_2_before_the_model_loads(
    qwen3_causal, tmp_path, name, no_model_load
):
    rows = [{"query": "I pledge allegiance", "item": " to", "tag": 1, name: 1}]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    flags = ["--rank", "--pooled-hidden-states", "--keep-columns", f"tag,{name}"]
    result = run_cli(data, "-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS, *flags)
    assert result.returncode == 2, result.stderr
    assert (
        f"'{name}'" in result.stderr
        and "--keep-columns" in result.stderr
        and "Traceback" not in result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1  # one clear line
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("flag", [["--rank"], ["--top-k", "1"]])
def test_keep_columns_rank_with_a_ranking_exits_2(qwen3_causal, tmp_path, flag, no_model_load):
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": " to", "rank": 3}])
    result = run_cli(data, "-o", "-", "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "rank", *flag)
    assert result.returncode == 2 and "'rank' would overwrite" in result.stderr, result.stderr


def test_keep_columns_rank_without_a_ranking_is_passed_through(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": " to", "rank": 3}])
    out = tmp_path / "o.parquet"
    result = run_cli(data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "rank", "-q")
    assert result.returncode == 0, result.stderr
    assert pq.read_table(out).column("rank").to_pylist() == [3]
