"""Output locations: every spelling of one object-store object is one target for the collision checks."""

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


def _contract(where):
    """The Location operations a run relies on, the same on every store."""
    from score_batch.io_formats.locations import Location

    assert isinstance(where, Location)
    out = where.child("out.parquet")
    assert out.sibling(".lock").name == "out.parquet.lock" and out.parent.key() == where.key()
    assert not out.exists() and out.read_bytes() is None
    lock = out.sibling(".lock")
    assert lock.create_exclusive(b"first") and not lock.create_exclusive(b"second")
    assert lock.read_bytes() == b"first"
    out.write_bytes(b"old")
    out.write_bytes(b"new")  # replaced in one step
    assert out.read_bytes() == b"new" and out.is_file()
    staged = out.staging_file()
    staged.write_bytes(b"published")
    out.publish_file(staged)
    assert out.read_bytes() == b"published" and not staged.exists()
    leftover = out.temp_sibling()
    leftover.write_bytes(b"half")
    assert leftover.name.startswith(".out.parquet.tmp-")
    assert out.remove_leftovers() == [leftover.uri] and not leftover.exists()
    parts = out.sibling(".parts")
    parts.make_dirs()
    parts.child("a").write_bytes(b"1")
    parts.child("b").write_bytes(b"2")
    assert sorted(parts.list_names()) == ["a", "b"]
    parts.delete_tree()
    assert parts.list_names() == []
    lock.delete()
    lock.delete()  # already gone is fine
    assert sorted(where.list_names()) == ["out.parquet"]


def test_local_target_operations(tmp_path):
    from score_batch.io_formats.locations import parse_location

    _contract(parse_location(str(tmp_path), write=True))
    assert parse_location(f"{tmp_path}/./a//b").key() == parse_location(f"{tmp_path}/a/b").key()


def test_object_target_operations(s3):  # noqa: F811
    from score_batch.io_formats.locations import parse_location
    from score_batch.io_formats.remote import parse_storage_options

    _, bucket, options = s3
    storage = parse_storage_options([options[1]])
    _contract(parse_location(f"s3://{bucket}/dir", storage, write=True))
    assert parse_location(f"s3://{bucket}/dir//x/", storage).key() == f"s3://{bucket}/dir/x"
    # a trailing `/` names the same object: its lock is named as it is written (dir.lock, not dir/.lock)
    assert parse_location(f"s3://{bucket}/dir/", storage).sibling(".lock").uri == f"s3://{bucket}/dir.lock"
