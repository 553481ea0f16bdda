"""Data where it lives: S3 (a real S3 API server on 127.0.0.1: moto's ThreadedMotoServer), hive partitions,
globs, several inputs and compressed JSONL, all through the CLI a user runs."""

from __future__ import annotations

import datetime
import gzip
import io
import json
import logging
import os
import signal
import socket
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import many_rows, start_cli

pytestmark = pytest.mark.slow
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-value",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server on a free port of 127.0.0.1, with fake credentials in the environment."""
    server_module = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    saved = {key: os.environ.get(key) for key in FAKE_ENV}
    os.environ.update(FAKE_ENV)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        yield endpoint, boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3(s3_server):
    """(client, bucket, the --storage-option flags): a fresh bucket per test."""
    endpoint, client = s3_server
    bucket = f"bkt-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket, ["--storage-option", f"endpoint_override={endpoint}"]


def put_parquet(client, bucket: str, key: str, rows: list[dict], schema: pa.Schema | None = None) -> None:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buffer)
    client.put_object(Bucket=bucket, Key=key, Body=buffer.getvalue())


def get_table(client, bucket: str, key: str) -> pa.Table:
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    if key.endswith(".jsonl"):
        return pa.Table.from_pylist([json.loads(line) for line in body.decode().splitlines()])
    return pq.read_table(io.BytesIO(body))


def keys(client, bucket: str, prefix: str = "") -> list[str]:
    """Object keys under prefix (pyarrow's empty `dir/` markers, which keep a prefix visible, left out)."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in listed.get("Contents", []) if not item["Key"].endswith("/"))


SCHEMA = pa.schema(
    [("query_id", pa.int64()), ("query", pa.string()), ("item_id", pa.string()), ("item", pa.string())]
)


def partitioned(client, bucket: str, empty: str | None = None) -> list[dict]:
    """Write candidates/dt=…/country=…/part-0.parquet (one partition may be empty); the rows in read order."""
    rows = many_rows(8, 3)
    layout = {
        ("2026-11-22", "DE"): rows[:9],
        ("2026-11-22", "US"): rows[9:18],
        ("2026-11-23", "DE"): rows[18:],
    }
    ordered = []
    for (dt, country), part in layout.items():
        part = [] if country == empty else part
        put_parquet(client, bucket, f"candidates/dt={dt}/country={country}/part-0.parquet", part, SCHEMA)
        ordered += [{**row, "dt": datetime.date.fromisoformat(dt), "country": country} for row in part]
    client.put_object(Bucket=bucket, Key="candidates/dt=2026-11-22/_SUCCESS", Body=b"")
    client.put_object(Bucket=bucket, Key="candidates/notes.txt", Body=b"not data")
    return ordered


def local_reference(model, rows: list[dict], tmp_path, *flags) -> pa.Table:
    src = tmp_path / "reference-input.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    out = tmp_path / "reference.parquet"
    result = run_cli(src, "-o", out, "--model", model, *LABEL_FLAGS, *flags)
    assert result.returncode == 0, result.stderr
    return pq.read_table(out)


def test_hive_partitioned_glob_on_s3_to_parquet_and_jsonl(qwen3_causal, s3, tmp_path):
    client, bucket, options = s3
    rows = partitioned(client, bucket)
    flags = ["--keep-columns", "dt,country", "--window-rows", "7"]
    reference = local_reference(qwen3_causal, rows, tmp_path, *flags)
    source = f"s3://{bucket}/candidates/dt=*/country=*/*.parquet"
    for name in ("scores.parquet", "scores.jsonl"):
        result = run_cli(
            source, "-o", f"s3://{bucket}/out/{name}", *options, "--model", qwen3_causal, *LABEL_FLAGS, *flags
        )
        assert result.returncode == 0, result.stderr
        assert "testing-secret-value" not in result.stderr
        written = get_table(client, bucket, f"out/{name}")
        assert written.column_names == reference.column_names
        assert reference.schema.field("dt").type == pa.date32()  # typed as DuckDB and polars type it
        if name.endswith(".parquet"):
            assert written.schema.field("dt").type == pa.date32()
        assert [str(v) for v in written.column("dt").to_pylist()] == [
            str(v) for v in reference.column("dt").to_pylist()
        ]
        assert written.column("item_id").to_pylist() == [r["item_id"] for r in rows]
        for got, want in zip(written.column("score").to_pylist(), reference.column("score").to_pylist()):
            assert got == pytest.approx(want, abs=1e-6)
    # published in one step: no parts, lock or temporary keys remain beside the outputs
    assert keys(client, bucket, "out/") == ["out/scores.jsonl", "out/scores.parquet"]


def test_directory_input_partition_key_as_query_id(qwen3_causal, s3):
    client, bucket, options = s3
    rows = partitioned(client, bucket)
    result = run_cli(
        f"s3://{bucket}/candidates/",
        "-o",
        f"s3://{bucket}/by-country.parquet",
        *options,
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "--query-id-col",
        "country",
    )
    assert result.returncode == 0, result.stderr
    written = get_table(client, bucket, "by-country.parquet")
    assert written.column("query_id").to_pylist() == [r["country"] for r in rows]
    assert written.schema.field("query_id").type == pa.string()


def test_kill_9_then_resume_on_s3_and_a_second_run_is_refused(qwen3_causal, s3, tmp_path):
    client, bucket, options = s3
    rows = many_rows()
    put_parquet(client, bucket, "in/rows.parquet", rows)
    flags = ["--window-rows", "6", "--max-batch-tokens", "64"]
    reference = local_reference(qwen3_causal, rows, tmp_path, *flags)
    out = f"s3://{bucket}/out/scores.parquet"
    base = [f"s3://{bucket}/in/rows.parquet", *options, "--model", qwen3_causal, *LABEL_FLAGS, *flags]
    process = start_cli(*base, "-o", out)
    deadline = time.time() + 120
    while len([k for k in keys(client, bucket, "out/") if "/part-" in k]) < 3:
        assert process.poll() is None, process.stderr.read()
        assert time.time() < deadline, "no parts appeared"
        time.sleep(0.1)
    second = run_cli(*base, "-o", out, "--resume")
    assert second.returncode == 2 and "another run is writing this output" in second.stderr, second.stderr
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert "out/scores.parquet" not in keys(client, bucket, "out/")  # nothing partial at the destination
    assert "out/scores.parquet.lock" in keys(client, bucket, "out/")  # left by the killed run
    refused = run_cli(*base, "-o", out)
    assert refused.returncode == 2 and "--resume" in refused.stderr, refused.stderr
    resumed = run_cli(*base, "-o", out, "--resume", "--report", tmp_path / "report.json")
    assert resumed.returncode == 0, resumed.stderr
    assert get_table(client, bucket, "out/scores.parquet").equals(reference)
    assert keys(client, bucket, "out/") == ["out/scores.parquet"]
    assert json.loads((tmp_path / "report.json").read_text())["rows_skipped_by_resume"] >= 18


def test_existing_output_on_s3_needs_overwrite(qwen3_causal, s3):
    client, bucket, options = s3
    put_parquet(client, bucket, "in.parquet", many_rows(2, 2))
    client.put_object(Bucket=bucket, Key="out.parquet", Body=b"precious")
    base = [
        f"s3://{bucket}/in.parquet",
        "-o",
        f"s3://{bucket}/out.parquet",
        *options,
        "--model",
        qwen3_causal,
    ]
    refused = run_cli(*base, *LABEL_FLAGS)
    assert refused.returncode == 2 and "already exists; pass --overwrite" in refused.stderr
    assert client.get_object(Bucket=bucket, Key="out.parquet")["Body"].read() == b"precious"
    replaced = run_cli(*base, *LABEL_FLAGS, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert get_table(client, bucket, "out.parquet").num_rows == 4


def test_empty_partitions_and_an_empty_input(qwen3_causal, s3):
    client, bucket, options = s3
    rows = partitioned(client, bucket, empty="US")
    run = [*options, "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "country"]
    result = run_cli(f"s3://{bucket}/candidates/", "-o", f"s3://{bucket}/some.parquet", *run)
    assert result.returncode == 0, result.stderr
    assert get_table(client, bucket, "some.parquet").column("item_id").to_pylist() == [
        r["item_id"] for r in rows
    ]
    put_parquet(client, bucket, "empty/dt=2026-11-24/part-0.parquet", [], SCHEMA)
    result = run_cli(f"s3://{bucket}/empty/dt=*/*.parquet", "-o", f"s3://{bucket}/none.jsonl", *run[:-2])
    assert result.returncode == 0, result.stderr
    assert client.get_object(Bucket=bucket, Key="none.jsonl")["Body"].read() == b""
    assert keys(client, bucket, "none") == ["none.jsonl"]


def test_output_inside_the_input_prefix_is_refused(qwen3_causal, s3):
    client, bucket, options = s3
    partitioned(client, bucket)
    result = run_cli(
        f"s3://{bucket}/candidates", "-o", f"s3://{bucket}/candidates/../candidates/x.parquet", *options,
        "--model", qwen3_causal, *LABEL_FLAGS,
    )  # fmt: skip
    assert result.returncode == 2 and "would overwrite or mix into input directory" in result.stderr


def test_lock_is_a_conditional_create(s3):
    from score_batch.io_formats.locations import parse_location
    from score_batch.io_formats.remote import parse_storage_options

    _, bucket, options = s3
    storage = parse_storage_options([options[1]])
    lock = parse_location(f"s3://{bucket}/x.parquet.lock", storage)
    assert lock.create_exclusive(b"first")
    assert not lock.create_exclusive(b"second")


def test_secrets_are_refused_as_storage_options(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", many_rows(1, 1))
    result = run_cli(
        data, "-o", "s3://bkt-x/out.parquet", "--storage-option", "secret_key=abc", "--model", qwen3_causal
    )
    assert result.returncode == 2 and "standard chain" in result.stderr and "abc" not in result.stderr
    result = run_cli(data, "-o", "s3://user:pw@bkt-x/out.parquet", "--model", qwen3_causal)
    assert result.returncode == 2 and "credentials in a URI" in result.stderr and "pw" not in result.stderr


# ------------------------------------------------------------------------------ local: several inputs


def test_several_inputs_and_compressed_jsonl_in_order(qwen3_causal, tmp_path):
    zstd = pytest.importorskip("pyarrow").Codec.is_available("zstd")
    rows = many_rows(6, 2)
    plain = write_jsonl(tmp_path / "a.jsonl", rows[:4])
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows[4:8]).encode()))
    third = tmp_path / "c.jsonl"
    write_jsonl(third, rows[8:])
    if zstd:
        import pyarrow as pa_

        with pa_.CompressedOutputStream(str(tmp_path / "c.jsonl.zst"), "zstd") as out:
            out.write("".join(json.dumps(r) + "\n" for r in rows[8:]).encode())
        third.unlink()
        third = tmp_path / "c.jsonl.zst"
    reference = local_reference(qwen3_causal, rows, tmp_path, "--window-rows", "3")
    out = tmp_path / "out.parquet"
    result = run_cli(
        plain, f"{gz},{third}", "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "3"
    )
    assert result.returncode == 0, result.stderr
    assert pq.read_table(out).equals(reference)


def test_local_hive_directory_and_glob(qwen3_causal, tmp_path):
    rows = many_rows(4, 2)
    for country, part in (("DE", rows[:4]), ("US", rows[4:])):
        (tmp_path / "data" / f"country={country}").mkdir(parents=True)
        write_jsonl(tmp_path / "data" / f"country={country}" / "part-0.jsonl", part)
    (tmp_path / "data" / "country=US" / "_SUCCESS").write_text("")
    (tmp_path / "data" / "other").mkdir()
    write_jsonl(tmp_path / "data" / "other" / "ignored.jsonl", rows)
    for source in (tmp_path / "data", f"{tmp_path}/data/country=*/*.jsonl"):
        out = tmp_path / "out.jsonl"
        result = run_cli(
            source,
            "-o",
            out,
            "--model",
            qwen3_causal,
            *LABEL_FLAGS,
            "--keep-columns",
            "country",
            "--overwrite",
        )
        assert result.returncode == 0, result.stderr
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert [(line["item_id"], line["country"]) for line in lines] == [
            (r["item_id"], "DE" if i < 4 else "US") for i, r in enumerate(rows)
        ]
        # the directory's unread file is named (an operator would otherwise lose its rows unseen); a glob reads
        # what it names and warns of nothing
        unread = "1 data file(s) in sub-directories that are not key=value partitions are not read (other/ignored.jsonl)"
        assert (unread in result.stderr) == (source == tmp_path / "data"), result.stderr


def test_inputs_that_disagree_or_mix_formats_exit_2(qwen3_causal, tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"query": "q", "item": "i", "tag": 1}])
    write_jsonl(tmp_path / "b.jsonl", [{"query": "q", "item": "i", "tag": "x"}])
    pq.write_table(pa.Table.from_pylist([{"query": "q", "item": "i"}]), tmp_path / "c.parquet")
    base = ["-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS]
    mixed = run_cli(tmp_path / "a.jsonl", tmp_path / "c.parquet", *base)
    assert mixed.returncode == 2 and "mixes Parquet" in mixed.stderr
    types = run_cli(tmp_path / "a.jsonl", tmp_path / "b.jsonl", *base, "--keep-columns", "tag")
    assert types.returncode == 2 and "'tag'" in types.stderr and "b.jsonl" in types.stderr
    missing = run_cli(tmp_path / "nope-*.jsonl", *base)
    assert missing.returncode == 2 and "matches no" in missing.stderr


def test_unreachable_endpoint_exits_3(qwen3_causal, s3_server, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    result = run_cli(
        "s3://bkt-none/in.parquet", "-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS,
        "--storage-option", f"endpoint_override=http://127.0.0.1:{closed}", "--storage-option", "connect_timeout=1",
    )  # fmt: skip
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr


# ----------------------------------------------------------------- endpoints from the AWS variables


def test_round_trip_with_the_endpoint_from_aws_endpoint_url(qwen3_causal, s3, tmp_path, monkeypatch):
    """No --storage-option at all: AWS_ENDPOINT_URL alone sends the data, the parts and the lock to the server
    (hive input, output, kill -9 mid-run, --resume), as boto3 and the AWS CLI would."""
    client, bucket, options = s3
    endpoint = options[1].split("=", 1)[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    rows = many_rows()
    ordered = []
    for number, country in enumerate(("DE", "FR", "US")):
        part = rows[number * 80 : (number + 1) * 80]
        put_parquet(client, bucket, f"hive/country={country}/part-0.parquet", part)
        ordered += [{**row, "country": country} for row in part]
    flags = ["--window-rows", "6", "--max-batch-tokens", "64", "--keep-columns", "country"]
    reference = local_reference(qwen3_causal, ordered, tmp_path, *flags)
    out = f"s3://{bucket}/out/scores.parquet"
    base = [f"s3://{bucket}/hive/", "--model", qwen3_causal, *LABEL_FLAGS, *flags]
    process = start_cli(*base, "-o", out)
    deadline = time.time() + 120
    while len([k for k in keys(client, bucket, "out/") if "/part-" in k]) < 3:
        assert process.poll() is None, process.stderr.read()
        assert time.time() < deadline, "no parts appeared on the server named by AWS_ENDPOINT_URL"
        time.sleep(0.1)
    second = run_cli(
        *base, "-o", out, "--resume"
    )  # the lock is on the same server (boto3 conditional create)
    assert second.returncode == 2 and "another run is writing this output" in second.stderr, second.stderr
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert "out/scores.parquet.lock" in keys(client, bucket, "out/")
    resumed = run_cli(*base, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert get_table(client, bucket, "out/scores.parquet").equals(reference)
    assert keys(client, bucket, "out/") == ["out/scores.parquet"]


def test_endpoint_resolution_order(s3, monkeypatch, tmp_path, qwen3_causal):
    """AWS_ENDPOINT_URL_S3 before AWS_ENDPOINT_URL; --storage-option endpoint_override before both; one answer
    for pyarrow's filesystem and the boto3 client."""
    from score_batch.io_formats.remote import s3_client_kwargs, s3_options

    client, bucket, options = s3
    endpoint = options[1].split("=", 1)[1]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint + "/")
    assert s3_options(()) == (("endpoint_override", endpoint),)
    assert s3_client_kwargs(()) == {"endpoint_url": endpoint}
    given = (("endpoint_override", closed), ("region", "eu-west-1"))
    assert s3_options(given) == given
    assert s3_client_kwargs(given) == {"endpoint_url": closed, "region_name": "eu-west-1"}
    put_parquet(client, bucket, "in.parquet", many_rows(2, 2))
    ok = run_cli(
        f"s3://{bucket}/in.parquet", "-o", f"s3://{bucket}/o.jsonl", "--model", qwen3_causal, *LABEL_FLAGS
    )
    assert ok.returncode == 0, ok.stderr  # AWS_ENDPOINT_URL_S3 (the server) beat AWS_ENDPOINT_URL (closed)
    assert get_table(client, bucket, "o.jsonl").num_rows == 4
    refused = run_cli(
        f"s3://{bucket}/in.parquet", "-o", tmp_path / "o.jsonl", "--model", qwen3_causal, *LABEL_FLAGS,
        "--storage-option", f"endpoint_override={closed}", "--storage-option", "connect_timeout=1",
    )  # fmt: skip
    assert refused.returncode == 3  # the option (a closed port) beat both variables


@pytest.mark.parametrize("boto3_installed", [True, False], ids=["managed-upload", "copy-into-place"])
def test_a_file_is_published_whole_past_the_multipart_threshold(s3, tmp_path, monkeypatch, boto3_installed):
    """A 20 MB output (boto3 uploads it in parts, which S3 shows only once complete) lands whole at its key,
    the local file consumed and no temporary key left; without boto3 the copy-into-place path does the same."""
    from score_batch.io_formats import remote
    from score_batch.io_formats.locations import parse_location
    from score_batch.io_formats.remote import parse_storage_options

    client, bucket, options = s3
    if not boto3_installed:
        monkeypatch.setattr(remote, "s3_client", lambda options, without: None)
    data = os.urandom(20 << 20)
    local = tmp_path / "out.parquet"
    local.write_bytes(data)
    storage = parse_storage_options([options[1]])
    parse_location(f"s3://{bucket}/out/scores.parquet", storage, write=True).publish_file(local)
    assert client.get_object(Bucket=bucket, Key="out/scores.parquet")["Body"].read() == data
    assert keys(client, bucket) == ["out/scores.parquet"] and not local.exists()
