"""Output targets: every spelling of one object-store object is one target for the collision checks."""

from __future__ import annotations

import pytest

from tests.test_cli import LABEL_FLAGS, run_cli
from tests.test_job import many_rows
from tests.test_object_stores import SCHEMA, get_table, keys, put_parquet, s3, s3_server  # noqa: F401

pytestmark = pytest.mark.slow
SPELLINGS = [
    "s3://{b}/data//in.parquet",
    "s3://{b}//data/in.parquet",
    "s3://{b}/data/./in.parquet",
    "s3://{b}/data/in.parquet/",
    "s3://{b}/data/../data/in.parquet",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_spellings_of_the_input_object_are_the_input(qwen3_causal, s3, spelling):  # noqa: F811
    client, bucket, options = s3
    put_parquet(client, bucket, "data/in.parquet", many_rows(2, 2), SCHEMA)
    before = get_table(client, bucket, "data/in.parquet")
    output = spelling.format(b=bucket)
    for extra in ([], ["--overwrite"], ["--overwrite", "--dry-run"]):
        result = run_cli(
            f"s3://{bucket}/data/in.parquet",
            "-o",
            output,
            *options,
            "--model",
            qwen3_causal,
            *LABEL_FLAGS,
            *extra,
        )
        assert result.returncode == 2, (extra, result.stderr)
        assert "Traceback" not in result.stderr
        if extra:
            assert "would overwrite or mix into input file" in result.stderr, result.stderr
    assert get_table(client, bucket, "data/in.parquet").equals(before)
    assert keys(client, bucket) == ["data/in.parquet"]


def test_a_double_slash_output_elsewhere_is_written_at_its_folded_key(qwen3_causal, s3):  # noqa: F811
    client, bucket, options = s3
    put_parquet(client, bucket, "data/in.parquet", many_rows(2, 2), SCHEMA)
    result = run_cli(
        f"s3://{bucket}/data/in.parquet", "-o", f"s3://{bucket}/out//scores.parquet", *options,
        "--model", qwen3_causal, *LABEL_FLAGS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert keys(client, bucket) == ["data/in.parquet", "out/scores.parquet"]
    assert get_table(client, bucket, "out/scores.parquet").num_rows == 4
