"""--partition-by: OUTPUT as a hive-partitioned Parquet directory, with the guarantees of a file output
(nothing partial, --overwrite, --resume after kill -9, checks before scoring), locally and on S3."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import many_rows, start_cli, wait_for_parts
from tests.test_object_stores import keys, s3, s3_server  # noqa: F401  (the moto S3 fixtures)

pytestmark = pytest.mark.slow
COUNTRIES = ("US", "DE", "JP")


@pytest.fixture
def countries(qwen3_causal, tmp_path):
    """A 240-row input with a country column (kept), scored in 40 windows; the unpartitioned output."""
    rows = [dict(row, country=COUNTRIES[row["query_id"] % 3]) for row in many_rows()]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "6", "--max-batch-tokens", "64"]
    base += ["--keep-columns", "country"]
    reference = tmp_path / "reference.parquet"
    ran = run_cli(*base, "-o", reference)
    assert ran.returncode == 0, ran.stderr
    return base, pq.read_table(reference), tmp_path


def partitions(files: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """Each partition directory's rows: its part files in name order (files: relative path → table)."""
    grouped: dict[str, list[pa.Table]] = {}
    for name in sorted(files):
        directory, _, base = name.rpartition("/")
        assert base.startswith("part-") and base.endswith(".parquet"), name
        grouped.setdefault(directory, []).append(files[name])
    return {directory: pa.concat_tables(tables) for directory, tables in grouped.items()}


def local_files(out: Path) -> dict[str, pa.Table]:
    """The data files of a local partitioned output (markers and metadata left out)."""
    return {
        path.relative_to(out).as_posix(): pq.read_table(path)
        for path in out.rglob("*.parquet")
        if not path.name.startswith(("_", "."))
    }


def assert_partitioned_like(files: dict[str, pa.Table], reference: pa.Table, by: tuple[str, ...]) -> None:
    """Every partition holds exactly the reference's rows with its values, in the reference's order."""
    got = partitions(files)
    expected: dict[str, pa.Table] = {}
    for values in sorted({tuple(row[c] for c in by) for row in reference.select(list(by)).to_pylist()}):
        mask = None
        for column, value in zip(by, values):
            match = pc.equal(reference[column], pa.scalar(value, reference.schema.field(column).type))
            mask = match if mask is None else pc.and_(mask, match)
        directory = "/".join(f"{column}={value}" for column, value in zip(by, values))
        expected[directory] = reference.filter(mask).drop_columns(list(by))
    assert sorted(got) == sorted(expected)
    for directory, table in expected.items():
        assert got[directory].equals(table), directory
    assert sum(t.num_rows for t in got.values()) == reference.num_rows


def test_partitioned_by_a_kept_column_equals_the_unpartitioned_output(countries):
    base, reference, tmp_path = countries
    out = tmp_path / "scores"
    ran = run_cli(*base, "-o", out, "--partition-by", "country")
    assert ran.returncode == 0, ran.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "_SUCCESS",
        *sorted(f"country={c}" for c in COUNTRIES),
    ]
    assert_partitioned_like(local_files(out), reference, ("country",))
    assert (out / "_SUCCESS").stat().st_size == 0  # polars' read_parquet(directory) skips empty files only
    # what a downstream reader does: the dataset with hive partitions, pruned by the partition column
    dataset = ds.dataset(out, format="parquet", partitioning="hive")
    us = dataset.to_table(filter=ds.field("country") == "US")
    assert us.num_rows == reference.filter(pc.equal(reference["country"], "US")).num_rows
    assert dataset.count_rows() == reference.num_rows
    assert not list(tmp_path.glob(".scores.tmp-*")) and not (tmp_path / "scores.parts").exists()
    assert not (tmp_path / "scores.lock").exists()


def test_two_columns_ranking_and_skipped_rows_behave_as_without_partitions(countries):
    base, _, tmp_path = countries
    rows = [dict(row, country=COUNTRIES[row["query_id"] % 3]) for row in many_rows()]
    for row in rows[::7]:
        row["item"] = row["item"] * 8  # over --max-item-tokens: skipped, listed in the errors file
    base = [write_jsonl(tmp_path / "long.jsonl", rows), *base[1:]]
    flags = ["--top-k", "2", "--on-error", "skip", "--max-item-tokens", "24"]
    ranked = tmp_path / "ranked.parquet"
    assert run_cli(*base, *flags, "-o", ranked).returncode == 0
    out = tmp_path / "ranked"
    ran = run_cli(*base, *flags, "-o", out, "--partition-by", "country,query_id")
    assert ran.returncode == 0, ran.stderr
    reference = pq.read_table(ranked)
    assert "rank" in reference.column_names and reference.num_rows == 40 * 2
    assert_partitioned_like(local_files(out), reference, ("country", "query_id"))
    errors = (tmp_path / "ranked.errors.jsonl").read_text()
    assert len(errors.splitlines()) == len(rows[::7])
    assert errors == (tmp_path / "ranked.parquet.errors.jsonl").read_text()


def test_a_column_that_is_not_an_id_or_kept_exits_2_before_scoring(countries):
    base, _, tmp_path = countries
    out = tmp_path / "scores"
    for by, named in (("score", "'score'"), ("country,region", "'region'"), ("country,country", "twice")):
        ran = run_cli(*base, "-o", out, "--partition-by", by)
        assert ran.returncode == 2, ran.stderr
        assert named in ran.stderr
        if by == "score":
            assert "query_id, item_id, country" in ran.stderr  # the allowed columns are named
    dry = run_cli(*base, "-o", out, "--partition-by", "rank", "--rank", "--dry-run")
    assert dry.returncode == 2 and "'rank'" in dry.stderr
    as_file = run_cli(*base, "-o", tmp_path / "scores.parquet", "--partition-by", "country")
    assert as_file.returncode == 2 and "directory" in as_file.stderr
    assert not out.exists() and not (tmp_path / "scores.parts").exists()
    assert not (tmp_path / "scores.lock").exists()


def test_an_existing_output_directory_needs_overwrite(countries):
    base, reference, tmp_path = countries
    out = tmp_path / "scores"
    assert run_cli(*base, "-o", out, "--partition-by", "country").returncode == 0
    before = local_files(out)
    refused = run_cli(*base, "-o", out, "--partition-by", "country")
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    replaced = run_cli(*base, "-o", out, "--partition-by", "country", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    after = local_files(out)
    assert sorted(after) == sorted(before) and all(after[n].equals(before[n]) for n in before)
    assert not list(tmp_path.glob(".scores.tmp-*"))
    # a directory this tool did not write (no _SUCCESS) is never deleted, even with --overwrite
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    kept = run_cli(*base, "-o", other, "--partition-by", "country", "--overwrite")
    assert kept.returncode == 2 and "_SUCCESS" in kept.stderr
    assert (other / "notes.txt").read_text() == "keep me"


def test_kill_9_then_resume_gives_the_same_dataset(countries):
    base, reference, tmp_path = countries
    out = tmp_path / "scores"
    parts = tmp_path / "scores.parts"
    process = start_cli(*base, "-o", out, "--partition-by", "country")
    wait_for_parts(parts, 3, process)
    process.kill()
    process.wait()
    assert not out.exists()  # nothing partial at the destination
    refused = run_cli(*base, "-o", out, "--partition-by", "country")
    assert refused.returncode == 2 and "--resume" in refused.stderr
    resumed = run_cli(*base, "-o", out, "--partition-by", "country", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert_partitioned_like(local_files(out), reference, ("country",))
    assert not parts.exists() and not list(tmp_path.glob(".scores.tmp-*"))


def test_partitioned_output_on_s3_is_committed_by_success_last(countries, s3):  # noqa: F811
    client, bucket, options = s3
    base, reference, _ = countries
    uri = f"s3://{bucket}/scores/dt=2026-11-22"
    ran = run_cli(*base, *options, "-o", uri, "--partition-by", "country")
    assert ran.returncode == 0, ran.stderr
    prefix = "scores/dt=2026-11-22/"
    names = [key[len(prefix) :] for key in keys(client, bucket, prefix)]
    assert "_SUCCESS" in names
    files = {
        name: pq.read_table(io.BytesIO(client.get_object(Bucket=bucket, Key=prefix + name)["Body"].read()))
        for name in names
        if name.endswith(".parquet")
    }
    assert_partitioned_like(files, reference, ("country",))
    leftovers = [k for k in keys(client, bucket) if not k.startswith(prefix)]
    assert leftovers == [], leftovers  # no staging prefix, parts or lock left beside it
    refused = run_cli(*base, *options, "-o", uri, "--partition-by", "country")
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    replaced = run_cli(*base, *options, "-o", uri, "--partition-by", "country", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert [key[len(prefix) :] for key in keys(client, bucket, prefix)] == names


def test_kill_9_on_s3_then_resume_replaces_a_publish_cut_off_midway(countries, s3):  # noqa: F811
    client, bucket, options = s3
    base, reference, _ = countries
    uri = f"s3://{bucket}/scores/out"
    process = start_cli(*base, *options, "-o", uri, "--partition-by", "country")
    deadline = time.time() + 120
    while len([k for k in keys(client, bucket, "scores/out.parts/") if "/part-" in k]) < 3:
        assert process.poll() is None, process.stderr.read()
        assert time.time() < deadline, "no parts appeared"
        time.sleep(0.05)
    process.kill()
    process.wait(timeout=60)
    assert keys(client, bucket, "scores/out/") == []  # nothing at the destination
    # as if an earlier publish had been cut off: objects at OUTPUT without _SUCCESS, a staging prefix beside it
    buffer = io.BytesIO()
    pq.write_table(reference.slice(0, 1), buffer)
    client.put_object(
        Bucket=bucket, Key="scores/out/country=XX/part-00000000.parquet", Body=buffer.getvalue()
    )
    client.put_object(Bucket=bucket, Key="scores/.out.tmp-0123456789abcdef/country=US/x.parquet", Body=b"x")
    refused = run_cli(*base, *options, "-o", uri, "--partition-by", "country")
    assert refused.returncode == 2, refused.stderr
    resumed = run_cli(*base, *options, "-o", uri, "--partition-by", "country", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    prefix = "scores/out/"
    names = [key[len(prefix) :] for key in keys(client, bucket, prefix)]
    assert "_SUCCESS" in names
    files = {
        name: pq.read_table(io.BytesIO(client.get_object(Bucket=bucket, Key=prefix + name)["Body"].read()))
        for name in names
        if name.endswith(".parquet")
    }
    assert_partitioned_like(files, reference, ("country",))  # the stray partition is gone
    assert [k for k in keys(client, bucket) if not k.startswith(prefix)] == [
        "scores/out.done"
    ]  # --resume's record


def test_polars_pandas_duckdb_and_pyarrow_open_the_directory_with_their_idiomatic_calls(
    qwen3_causal, tmp_path
):
    """docs/formats.md's five plain calls open a dataset partitioned by a date and a dictionary (pandas
    categorical) column, every row with the reference's values; polars and DuckDB type the date as written,
    pyarrow and pandas as their hive inference does; given the metadata file's schema, every tool types
    every column as written (a dictionary partition column by its values)."""
    import datetime

    import duckdb

    pl = pytest.importorskip("polars")
    pd = pytest.importorskip("pandas")
    rows = many_rows(6, 4)
    days = [datetime.date(2026, 11, 20 + row["query_id"] % 2) for row in rows]
    table = pa.Table.from_pylist(rows).append_column("dt", pa.array(days, pa.date32()))
    table = table.append_column(
        "country", pa.array([COUNTRIES[r["query_id"] % 3] for r in rows]).dictionary_encode()
    )
    data = tmp_path / "in.parquet"
    pq.write_table(table, data)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "dt,country", "--window-rows", "8"]
    reference = tmp_path / "reference.parquet"
    ran = run_cli(*base, "-o", reference)
    assert ran.returncode == 0, ran.stderr
    want = pq.read_table(reference)
    assert want.schema.field("country").type == pa.dictionary(pa.int32(), pa.string())  # kept as read
    want = want.set_column(want.column_names.index("country"), "country", want["country"].cast(pa.string()))
    want = want.sort_by("item_id")
    out = tmp_path / "dataset"
    ran = run_cli(*base, "-o", out, "--partition-by", "dt,country")
    assert ran.returncode == 0, ran.stderr
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["_SUCCESS"]  # nothing that polars refuses

    def same_rows(got: pa.Table, dt: pa.DataType, country: pa.DataType) -> None:
        """got holds want's rows, its partition columns of these types (strings: the dates' ISO text; polars'
        and pandas' large strings taken as strings)."""
        got = got.select(want.column_names).sort_by("item_id")
        types = [pa.string() if t == pa.large_string() else t for t in (got["dt"].type, got["country"].type)]
        assert types == [dt, country]
        assert got.cast(want.schema).equals(want)

    # the plain calls, each library's own partition types
    same_rows(pl.read_parquet(out).to_arrow(), pa.date32(), pa.string())
    same_rows(pl.scan_parquet(out, hive_partitioning=True).collect().to_arrow(), pa.date32(), pa.string())
    query = f"SELECT * FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true)"
    same_rows(duckdb.sql(query).to_arrow_table(), pa.date32(), pa.string())
    same_rows(ds.dataset(out, partitioning="hive").to_table(), pa.string(), pa.string())
    frame = pd.read_parquet(out)
    assert isinstance(frame["dt"].dtype, pd.CategoricalDtype)  # pandas' hive inference: categoricals
    got = pa.Table.from_pandas(frame.astype({"dt": str, "country": str}), preserve_index=False)
    same_rows(got, pa.string(), pa.string())
    # given the partition columns' types (docs/formats.md): every column typed as written
    partitioning = ds.partitioning(pa.schema([("dt", pa.date32()), ("country", pa.string())]), flavor="hive")
    same_rows(ds.dataset(out, partitioning=partitioning).to_table(), pa.date32(), pa.string())
    same_rows(pq.read_table(out, partitioning=partitioning), pa.date32(), pa.string())
    frame = pd.read_parquet(out, partitioning=partitioning)
    assert not any(isinstance(dtype, pd.CategoricalDtype) for dtype in frame.dtypes)
    same_rows(pa.Table.from_pandas(frame, preserve_index=False), pa.date32(), pa.string())
