"""score-batch --ray on a local Ray (CPU, 2 workers): same rows and scores as a local run, a killed actor
retried, per-row errors under --on-error, hive partitions, globs and S3 read in Ray tasks, --partition-by,
and a clear exit without Ray installed."""

from __future__ import annotations

import gzip
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, write_jsonl
from tests.test_cli import run_cli as run_in_process
from tests.test_object_stores import keys, partitioned, s3, s3_server  # noqa: F401  (moto fixtures)


def run_cli(*args, **kwargs):
    """Ray runs start their own processes: a fresh command process gives each test its own Ray."""
    return run_in_process(*args, fresh_process=True, **kwargs)


pytestmark = pytest.mark.slow

# A score-batch command whose Ray actors kill their own process once (the first to create the marker file
# argv[1]): the fault lives here, in the test; the actor class, defined in a function, travels to the Ray
# workers by value (cloudpickle).
FAULT_ONCE = """
import os, sys
import score_batch.job.runners.ray_run as ray_run
from score_batch.cli.main import run


def fault_once(marker):
    class FaultOnceActor(ray_run.ScoreActor):
        def __call__(self, batch):
            try:
                with open(marker, "x"):
                    pass
            except FileExistsError:
                return super().__call__(batch)
            os._exit(1)

    return FaultOnceActor


ray_run.ScoreActor = fault_once(sys.argv[1])
sys.argv = ["score-batch", *sys.argv[2:]]
run()
"""


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
    result = run_in_process(
        "-c", FAULT_ONCE, marker, *common, "-o", out, "--ray", "--num-workers", "2", python_args=True
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
    src = write_jsonl(tmp_path / "in.jsonl", nested[:2])
    compressed = tmp_path / "more.jsonl.gz"  # a second INPUT, gzip-compressed
    compressed.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in nested[2:]).encode()))
    common = [src, compressed, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "skip", "--keep-columns"]
    common += ["tag", "-q"]
    common += ["--max-item-tokens", "64"]
    local = run_cli(*common, "-o", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    out = tmp_path / "out"
    result = run_cli(*common, "-o", out, "--ray", "--num-workers", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    # -q: no line of Ray's own (its loggers, Ray Data's, the core worker's), only score-batch's warning
    assert [line.split(":")[0] for line in result.stderr.splitlines()] == ["score-batch"], result.stderr
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


def _hive_and_glob(tmp_path) -> tuple[list[str], list[dict]]:
    """Two INPUTs: a hive-partitioned directory (dt=…/country=…) and a glob; the rows in read order."""
    rows = _rows()
    hive = tmp_path / "hive"
    ordered = []
    layout = {
        ("2026-11-22", "DE"): rows[:20],
        ("2026-11-22", "US"): rows[20:40],
        ("2026-11-23", "DE"): rows[40:52],
    }
    for (dt, country), part in layout.items():
        directory = hive / f"dt={dt}" / f"country={country}"
        directory.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(part), directory / "part-0.parquet", row_group_size=8)
        ordered += [{**row, "dt": dt, "country": country} for row in part]
    (hive / "dt=2026-11-22" / "_SUCCESS").write_text("")
    extra = tmp_path / "extra"
    extra.mkdir()
    for name, part in (("b-1", rows[52:62]), ("b-2", rows[62:])):
        pq.write_table(
            pa.Table.from_pylist([{**row, "country": "JP"} for row in part]), extra / f"{name}.parquet"
        )
        ordered += [{**row, "dt": None, "country": "JP"} for row in part]
    pq.write_table(pa.Table.from_pylist(rows[:3]), extra / "c-1.parquet")  # not matched by the glob
    return [str(hive), str(extra / "b-*.parquet")], ordered


def test_ray_reads_hive_partitions_and_a_glob_like_a_local_run_and_partitions_its_output(
    qwen3_causal, tmp_path
):
    pytest.importorskip("ray")
    inputs, ordered = _hive_and_glob(tmp_path)
    common = [*inputs, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "-q"]
    common += ["--keep-columns", "country"]
    local = run_cli(*common, "-o", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    out = tmp_path / "out"
    result = run_cli(*common, "-o", out, "--ray", "--num-workers", "2", "--report", tmp_path / "ray.json")
    assert result.returncode == 0, result.stderr[-3000:]
    ray_table = _compare(out, tmp_path / "local.parquet", error_column=True)
    assert ray_table.column("row_index").to_pylist() == list(range(len(ordered)))
    assert ray_table.column("country").to_pylist() == [row["country"] for row in ordered]
    assert ray_table.column("item_id").to_pylist() == [row["item_id"] for row in ordered]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("_", "."))) == ["_SUCCESS"]
    report = json.loads((tmp_path / "ray.json").read_text())
    assert (report["rows_read"], report["items"], report["items_failed"]) == (len(ordered), len(ordered), 1)
    assert (report["device"], report["dtype"], report["packing"]) == ("cpu", "float32", "mis")

    by_country = tmp_path / "by-country"
    result = run_cli(*common, "-o", by_country, "--ray", "--num-workers", "2", "--partition-by", "country")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in by_country.iterdir()) == [
        "_SUCCESS",
        "country=DE",
        "country=JP",
        "country=US",
    ]
    for file in by_country.glob("country=*/*.parquet"):
        assert "country" not in pq.read_schema(file).names  # the value lives in the directory name
    partitioning = ds.partitioning(pa.schema([("country", pa.string())]), flavor="hive")
    back = ds.dataset(by_country, format="parquet", partitioning=partitioning).to_table()
    back = back.select(ray_table.column_names).sort_by("row_index")
    assert back.equals(ray_table)


def test_ray_reads_and_writes_s3(qwen3_causal, s3, tmp_path):  # noqa: F811
    pytest.importorskip("ray")
    client, bucket, options = s3
    ordered = partitioned(client, bucket)
    local_in = tmp_path / "reference.parquet"
    pq.write_table(pa.Table.from_pylist(ordered), local_in)
    flags = ["--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "dt,country", "-q"]
    local = run_cli(local_in, "-o", tmp_path / "local.parquet", *flags)
    assert local.returncode == 0, local.stderr
    glob = f"s3://{bucket}/candidates/dt=*/country=*/*.parquet"
    ray_flags = [*flags, *options, "--ray", "--num-workers", "2"]
    result = run_cli(glob, "-o", f"s3://{bucket}/scores", *ray_flags, "--partition-by", "country")
    assert result.returncode == 0, result.stderr[-3000:]
    written = keys(client, bucket, "scores")
    assert written[-1] == "scores/_SUCCESS" or "scores/_SUCCESS" in written
    assert {key.split("/")[1] for key in written} == {
        "_SUCCESS",
        "country=DE",
        "country=US",
    }
    assert not [key for key in keys(client, bucket) if "/." in key or key.startswith(".")]  # no staging left
    tables = []
    for key in written:
        if key.endswith(".parquet"):
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            country = key.split("/")[1].split("=", 1)[1]
            table = pq.read_table(io.BytesIO(body))
            tables.append(table.append_column("country", pa.array([country] * table.num_rows)))
    got = pa.concat_tables(tables).sort_by("row_index")
    reference = pq.read_table(tmp_path / "local.parquet")
    assert got.column("row_index").to_pylist() == list(range(len(ordered)))
    for name in ("query_id", "item_id", "dt", "country"):
        assert got.column(name).to_pylist() == reference.column(name).to_pylist(), name
        assert got.schema.field(name).type == reference.schema.field(name).type, name
    ours = np.array(got.column("score").to_pylist(), dtype=np.float64)
    theirs = np.array(reference.column("score").to_pylist(), dtype=np.float64)
    assert np.nanmax(np.abs(ours - theirs)) <= 1e-6
    again = run_cli(glob, "-o", f"s3://{bucket}/scores", *ray_flags)
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_ray_top_k_equals_the_local_ranking(qwen3_causal, tmp_path):
    from tests.test_rankings_and_ops import ranking_rows

    data = write_jsonl(tmp_path / "in.jsonl", ranking_rows())
    common = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "--top-k", "2"]
    local = run_in_process(*common, "-o", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    ray = run_cli(*common, "-o", tmp_path / "ray_out", "--ray", "--num-workers", "1", "-q")
    assert ray.returncode == 0, ray.stderr
    expected = pq.read_table(tmp_path / "local.parquet").to_pylist()
    got = ds.dataset(tmp_path / "ray_out", format="parquet").to_table().to_pylist()
    assert [(r["item_id"], r["rank"]) for r in got] == [(r["item_id"], r["rank"]) for r in expected]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(got, expected) if a["score"] is not None) <= 1e-6


# A score-batch command whose Ray actors get two query groups per batch (RayOptions.groups_per_batch, which
# the command leaves at its default), so a repeated pair lands in a later batch of the same actor.
SMALL_BATCHES = """
import dataclasses, sys
import score_batch.job as job
from score_batch.cli.main import run

real_run = job.run
job.run = lambda config: real_run(
    dataclasses.replace(config, ray=dataclasses.replace(config.ray, groups_per_batch=2))
)
sys.argv = ["score-batch", *sys.argv[1:]]
run()
"""


def test_ray_actor_copies_pairs_it_wrote_in_earlier_batches(qwen3_causal, tmp_path):
    pytest.importorskip("ray")
    first = [
        {"query": "Tokyo is a city in", "items": [" Japan", " Japan"]},  # a repeat within one batch
        *({"query": f"I pledge allegiance {k}", "items": [" to", f" the flag {k}"]} for k in range(7)),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", first + first)  # every row again, batches later
    common = [src, "--model", qwen3_causal, *LABEL_FLAGS, "-q", "--report"]
    local = run_cli(*common, tmp_path / "local.json", "-o", tmp_path / "local.parquet", "--window-rows", "4")
    assert local.returncode == 0, local.stderr
    out = tmp_path / "out"
    result = run_in_process(
        "-c", SMALL_BATCHES, *common, tmp_path / "ray.json", "-o", out, "--ray", python_args=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ray_table = _compare(out, tmp_path / "local.parquet", error_column=False).sort_by("row_index")
    scores = ray_table.column("scores").to_pylist()
    half = len(scores) // 2
    assert scores[half:] == scores[:half] and scores[0] == scores[1]  # every copy is its first, bit for bit
    reports = [json.loads((tmp_path / f"{name}.json").read_text()) for name in ("local", "ray")]
    assert [report["duplicates"] for report in reports] == [17, 17]  # 1 within a batch, 16 across


# A score-batch command whose Ray actors note the schema of every batch they get (in the directory argv[1]).
SCHEMAS = """
import os, sys, uuid
import score_batch.job.runners.ray_run as ray_run
from score_batch.cli.main import run


def noting(directory):
    class NotingActor(ray_run.ScoreActor):
        def __call__(self, batch):
            with open(os.path.join(directory, uuid.uuid4().hex), "wb") as file:
                file.write(batch.schema.serialize().to_pybytes() if hasattr(batch, "schema") else b"")
            return super().__call__(batch)

    return NotingActor


ray_run.ScoreActor = noting(sys.argv[1])
sys.argv = ["score-batch", *sys.argv[2:]]
run()
"""


def test_ray_moves_the_inputs_own_columns_as_arrow_and_scores_as_a_local_run_bit_for_bit(
    qwen3_causal, tmp_path
):
    """What reaches a Ray actor is Arrow: the input's own columns (as lists, a query group a row) with the row
    index and the error found at read, nothing pickled; on an input whose query groups straddle the read units
    (row groups and files, each read in its own task), the output equals a local run's bit for bit (one
    batch: the same groups as the local run's one window, so the same plan, both on one torch thread)."""
    pytest.importorskip("ray")
    rows = _rows()
    for k, row in enumerate(rows):
        row["n"] = k * 0.5
    rows[9]["query"] = None
    src = tmp_path / "in"
    src.mkdir()
    table = pa.Table.from_pylist(rows)
    pq.write_table(table.slice(0, 40), src / "a.parquet", row_group_size=16)  # groups span row groups
    pq.write_table(table.slice(40), src / "b.parquet", row_group_size=16)  # … and files
    common = [src, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "-q", "--keep-columns", "n"]
    local = run_cli(
        *common, "-o", tmp_path / "local.parquet", "--threads", "1"
    )  # an actor's one torch thread
    assert local.returncode == 0, local.stderr
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    out = tmp_path / "out"
    ray = ["--ray", "--num-workers", "1"]
    result = run_in_process("-c", SCHEMAS, schemas, *common, "-o", out, *ray, python_args=True)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [pa.ipc.read_schema(pa.py_buffer(p.read_bytes())) for p in schemas.iterdir()]
    assert len(seen) == 1  # 12 query groups: one batch
    listed = {name: pa.list_(dtype) for name, dtype in zip(table.schema.names, table.schema.types)}
    listed["query"] = pa.list_(pa.dictionary(pa.int32(), pa.string()))  # each distinct query held once
    expected = {"__row_index": pa.list_(pa.int64()), **listed, "__error": pa.list_(pa.string())}
    assert dict(zip(seen[0].names, seen[0].types)) == expected  # a row per query group, no binary column
    got = pq.read_table(out).sort_by("row_index").drop_columns(["row_index"])
    want = pq.read_table(tmp_path / "local.parquet")
    assert got.schema == want.schema
    for name in want.column_names:  # bit for bit: score, scores, error, ids, kept
        assert got.column(name).equals(want.column(name)), name
    assert "column 'query' is null" in got.column("error")[9].as_py()


def _hostile_inputs(tmp_path) -> list[tuple]:
    """(input, column overrides): text with nulls; JSONL with a bad line, token ids, a lone surrogate, a wrong
    type and a composite key; nested lists with item ids, an empty list and a list of the wrong length."""
    from score_batch.io_formats.schema import ColumnOverrides

    rows = [
        {"query_id": f"q{k % 3}", "query": f"query {k % 3}", "item_id": k, "item": f"i{k}", "n": k / 2}
        for k in range(13)
    ]
    rows[4]["item"], rows[6]["query"] = None, None
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet", row_group_size=4)
    lines = [
        '{"query": "a", "item": "x", "qid": 1, "sub": "s"}', '{"query": [1, 2], "item": [3], "qid": 2, "sub": "t"}',
        "not json", '{"query": "a", "item": 5, "qid": 1, "sub": "s"}', '{"query": "b", "item": "\\ud800", "qid": 3}',
        '{"query": "a", "item": "", "qid": 1.0, "sub": "s"}', '{"query": [1, -2], "item": [3], "qid": 4, "sub": "u"}',
    ]  # fmt: skip
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    nested = [
        {"query": "q1", "items": ["a", "b", ""], "item_ids": [1, 2, 3], "tag": "x"},
        {"query": "q2", "items": [], "item_ids": [], "tag": "y"},
        {"query": [7, 8], "items": [[1], [2, 3]], "item_ids": [1, 2]},
        {"query": "q1", "items": ["a"], "item_ids": [1, 2]},
        {"query": "q4", "items": None},
    ]
    write_jsonl(tmp_path / "c.jsonl", nested)
    return [
        (tmp_path / "a.parquet", ColumnOverrides(keep_columns=("n",))),
        (tmp_path / "b.jsonl", ColumnOverrides(query_id_col="qid,sub")),
        (tmp_path / "b.jsonl", ColumnOverrides(query_id_col="qid")),
        (tmp_path / "c.jsonl", ColumnOverrides(keep_columns=("tag",))),
    ]


def test_a_window_as_the_inputs_arrow_columns_reads_back_as_the_same_window(tmp_path):
    """window_table → rows in any order → table_window (what a Ray actor does) gives every row of a local run's
    window: its index, query, items, ids, kept values and error (a failed row's value Arrow cannot hold, a lone
    surrogate or a line that is not JSON, reads as null)."""
    from score_batch.io_formats.readers import (
        column_types,
        input_mapping,
        open_source,
        read_windows,
        table_window,
    )
    from score_batch.io_formats.window import python, window_table
    from score_batch.job.runners.ray_run import _text_type

    for path, overrides in _hostile_inputs(tmp_path):
        source = open_source(str(path))
        mapping = input_mapping(source, overrides)
        types = column_types(source, mapping)
        texts = (
            _text_type(source, mapping.query, False),
            _text_type(source, mapping.items, mapping.layout == "nested"),
        )
        for window in read_windows(source, overrides, 5)[1]:
            table = window_table(window, mapping, types, texts)
            back = table_window(
                table.take(np.random.default_rng(0).permutation(table.num_rows)), mapping, types
            )
            assert np.array_equal(back.index, window.index) and np.array_equal(back.offsets, window.offsets)
            assert back.errors == window.errors and python(back.item_ids) == python(window.item_ids)
            held = [e is None for e in window.errors]
            rows = range(window.num_rows)
            assert [back.query(r) for r in rows] == [
                window.query(r) if ok or back.query(r) is not None else None for r, ok in zip(rows, held)
            ]
            item_ok = [held[r] for r in window.item_rows().tolist()]
            assert back.items == [
                a if ok or b is not None else None for a, b, ok in zip(window.items, back.items, item_ok)
            ]
            assert window.query_id_values() == back.query_id_values()
            assert all(python(window.kept[name]) == python(back.kept[name]) for name in mapping.keep)


def test_ray_takes_token_ids_mixed_with_text_and_a_bad_line_as_a_local_run(qwen3_causal, tmp_path):
    """A JSONL query column mixing text and token ids travels as Arrow's text-or-ids union: same rows, scores
    and messages as a local run."""
    pytest.importorskip("ray")
    lines = [json.dumps({"query": "Tokyo is a city in", "item": f" item {k}"}) for k in range(4)]
    lines += [
        json.dumps({"query": [1, 2, 3, 4], "item": [5, 6]}),
        "{not json",
        json.dumps({"query": [1, 2, 3, 4], "item": [7]}),
    ]
    lines += [json.dumps({"query": "Tokyo is a city in", "item": ["not", "ids"]})]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    common = [src, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record", "-q"]
    local = run_cli(*common, "-o", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    result = run_cli(*common, "-o", tmp_path / "out", "--ray", "--num-workers", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    got = _compare(tmp_path / "out", tmp_path / "local.parquet", error_column=True)
    errors = got.column("error").to_pylist()
    assert [e is None for e in errors] == [True] * 5 + [False, True, False]  # token ids scored
    assert errors[5].startswith("row 5: line 6:")
