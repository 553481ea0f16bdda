"""--partition-by values too long for a directory name (job/preflight/contract.PartitionNames): exit 2 naming
the column, the value's start, its encoded length and the limit, before the window is scored (--dry-run the
same); a value at the limit writes, as the filesystem itself takes it."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from score_batch.io_formats.writers import hive_directory
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_object_stores import keys, s3, s3_server  # noqa: F401  (the moto S3 fixtures)


def rows_with(split: str, rows: int = 6, at: int = 3) -> list[dict]:
    return [
        {"query": f"q{n}", "item": f" item {n}", "split": split if n == at else "ok"} for n in range(rows)
    ]


def base(qwen3_causal, data, columns: str = "split") -> list:
    return [data, "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", columns, "--partition-by", columns]


@pytest.mark.parametrize(
    "value, encoded",
    [("x" * 300, 6 + 300), ("中" * 130, 6 + 130 * 9)],  # `split=` + the value; a CJK character: %E4%B8%AD
    ids=["300-ascii", "130-cjk"],
)
def test_a_value_too_long_for_a_directory_name_exits_2_naming_it_and_dry_run_says_the_same(
    qwen3_causal, tmp_path, value, encoded
):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows_with(value)))
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    said = []
    for dry in ([], ["--dry-run"]):
        out = tmp_path / f"out{len(dry)}"
        ran = run_cli(*base(qwen3_causal, data), "-o", out, "--window-rows", "2", *dry)
        assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr[-2000:]
        (line,) = [line for line in ran.stderr.splitlines() if line.startswith("score-batch: error:")]
        assert "'split'" in line and value[:40] in line and f"{encoded} bytes" in line, line
        assert f"limit of {limit}" in line and "row 3" in line, line
        assert not out.exists() and not list(tmp_path.glob(f".out{len(dry)}.tmp-*"))
        said.append(line)
    assert said[0] == said[1]  # --dry-run reports it as the run does


def test_a_value_at_the_limit_writes_and_one_byte_more_is_refused(qwen3_causal, tmp_path):
    """The limit is the filesystem's: pyarrow itself writes `split=` + 249 characters and refuses 250."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    longest = "y" * (limit - len("split="))
    data = write_jsonl(tmp_path / "in.jsonl", rows_with(longest))
    ran = run_cli(*base(qwen3_causal, data), "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr[-2000:]
    read = ds.dataset(tmp_path / "out", partitioning="hive", format="parquet").to_table()
    assert sorted(read["split"].to_pylist()) == sorted(["ok"] * 5 + [longest])
    with pytest.raises(OSError, match="too long"):  # the filesystem's own refusal one byte on
        table = pa.table({"split": [longest + "y"], "x": [1]})
        ds.write_dataset(
            table, tmp_path / "raw", format="parquet", partitioning=["split"], partitioning_flavor="hive"
        )
    data = write_jsonl(tmp_path / "in2.jsonl", rows_with(longest + "y"))
    refused = run_cli(*base(qwen3_causal, data), "-o", tmp_path / "out2")
    assert refused.returncode == 2 and f"{limit + 1} bytes" in refused.stderr, refused.stderr[-2000:]


def test_the_directory_name_is_the_one_pyarrow_writes(tmp_path):
    """hive_directory against pyarrow's own hive partitioning, on values it percent-encodes."""
    values = ["a b", "a/b", "a=b", "100%", "中文", "~x-._", "a+b", "é", "!*'();:@&$,?#[]", "\x01", "", None]
    for n, value in enumerate(values):
        table = pa.table({"s": pa.array([value], pa.string()), "x": [1]})
        where = tmp_path / str(n)
        ds.write_dataset(table, where, format="parquet", partitioning=["s"], partitioning_flavor="hive")
        assert os.listdir(where) == [hive_directory("s", value)], value


@pytest.mark.slow
def test_an_object_key_over_the_store_s_limit_exits_2_before_scoring(qwen3_causal, tmp_path, s3):  # noqa: F811
    """Each directory name fits a file name, the whole key (prefix, two directories, file) not S3's 1,024."""
    client, bucket, options = s3
    rows = [dict(row, other="z" * 240) for row in rows_with("w" * 240)]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    command = base(qwen3_causal, data, "split,other")
    uri = f"s3://{bucket}/{'p' * 500}/out"
    ran = run_cli(*command, *options, "-o", uri)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr[-2000:]
    assert "an object key of" in ran.stderr and "limit of 1024" in ran.stderr, ran.stderr[-2000:]
    assert keys(client, bucket) == []
    short = f"s3://{bucket}/{'p' * 100}/out"  # the same values under a shorter prefix fit
    ran = run_cli(*command, *options, "-o", short)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert any(key.endswith("_SUCCESS") for key in keys(client, bucket))
