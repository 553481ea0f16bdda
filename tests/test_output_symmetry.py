"""Outputs mirror inputs: compressed JSONL outputs (.jsonl.gz, .jsonl.zst) written atomically, and hive partition
values typed as DuckDB (hive_types_autocast) and polars type them, or kept as strings."""

from __future__ import annotations

import datetime
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch import job
from score_batch.engine import EngineConfig, ScoringConfig
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.listing import HIVE_NULL
from score_batch.io_formats.readers import column_types, input_mapping, open_source, read_windows
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.io_formats.writers import output_compression, output_format
from score_batch.job.run_config import RunConfig
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_columnar_reader import as_rows
from tests.test_job import many_rows


def _decompress(path: Path) -> bytes:
    with pa.input_stream(str(path), compression="detect") as stream:
        return stream.read()


def test_output_names():
    assert [output_format(n) for n in ("a.jsonl.gz", "a.JSONL.ZST", "a.ndjson.gz", "a.parquet", "-")] == [
        "jsonl", "jsonl", "jsonl", "parquet", "jsonl"
    ]  # fmt: skip
    assert [output_compression(n) for n in ("a.jsonl.gz", "a.jsonl.zst", "a.jsonl", "-")] == [
        "gzip", "zstd", None, None
    ]  # fmt: skip
    for bad in ("a.parquet.gz", "a.csv", "a.gz"):
        with pytest.raises(InputError, match="jsonl.gz"):
            output_format(bad)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_compressed_jsonl_output_equals_the_plain_one(qwen3_causal, tmp_path, suffix):
    if suffix.endswith(".zst") and not pa.Codec.is_available("zstd"):
        pytest.skip("pyarrow without zstd")
    data = write_jsonl(tmp_path / "in.jsonl", many_rows(4, 3))
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "5"]
    plain = run_cli(*base, "-o", tmp_path / "plain.jsonl")
    assert plain.returncode == 0, plain.stderr
    out = tmp_path / f"scores{suffix}"
    packed = run_cli(*base, "-o", out)
    assert packed.returncode == 0, packed.stderr
    raw = out.read_bytes()
    assert raw[:2] == b"\x1f\x8b" if suffix.endswith(".gz") else raw[:4] == b"\x28\xb5\x2f\xfd"
    if suffix.endswith(".gz"):
        assert gzip.decompress(raw) == (tmp_path / "plain.jsonl").read_bytes()
    assert _decompress(out) == (tmp_path / "plain.jsonl").read_bytes()
    # published atomically: no temporary or parts left, and an existing output needs --overwrite
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "plain.jsonl", f"scores{suffix}"]
    again = run_cli(*base, "-o", out)
    assert again.returncode == 2 and "--overwrite" in again.stderr and out.read_bytes() == raw
    back = open_source(str(out))  # and it reads back as an input (symmetry)
    assert back.format == "jsonl" and back.total_rows() == 12


def _hive(tmp_path: Path, fmt: str) -> tuple[Path, list[dict]]:
    """hive/dt=…/n=…/shard=…/part-0.{fmt}: dt dates, n integers (one null), shard mixed (stays text)."""
    rows = many_rows(6, 2)
    layout = [
        (("2026-11-22", "7", "a1"), rows[:4]),
        (("2026-11-23", "12", "007"), rows[4:8]),
        (("2026-11-23", HIVE_NULL, "3"), rows[8:]),
    ]
    ordered = []
    for (dt, n, shard), part in layout:
        directory = tmp_path / "hive" / f"dt={dt}" / f"n={n}" / f"shard={shard}"
        directory.mkdir(parents=True)
        if fmt == "parquet":
            pq.write_table(pa.Table.from_pylist(part), directory / "part-0.parquet")
        else:
            write_jsonl(directory / "part-0.jsonl", part)
        number = None if n == HIVE_NULL else int(n)
        ordered += [
            {**row, "dt": datetime.date.fromisoformat(dt), "n": number, "shard": shard} for row in part
        ]
    return tmp_path / "hive", ordered


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_hive_values_are_typed_over_all_files(tmp_path, fmt):
    hive, ordered = _hive(tmp_path, fmt)
    overrides = ColumnOverrides(keep_columns=("dt", "n", "shard"))
    source = open_source(str(hive))
    mapping = input_mapping(source, overrides)
    types = column_types(source, mapping)
    assert (types["dt"], types["n"], types["shard"]) == (pa.date32(), pa.int64(), pa.string())
    _, windows = read_windows(source, overrides, 4)
    kept = [row.kept for window in windows for row in as_rows(window)]
    assert kept == [{k: r[k] for k in ("dt", "n", "shard")} for r in ordered]

    as_text = open_source(str(hive), hive_types="string")
    types = column_types(as_text, input_mapping(as_text, overrides))
    assert (types["dt"], types["n"], types["shard"]) == (pa.string(), pa.string(), pa.string())
    with pytest.raises(InputError, match="--hive-types"):
        open_source(str(hive), hive_types="typed")


def test_timestamps_and_out_of_range_integers(tmp_path):
    for value in ("2026-11-22 10:30:00", "2026-11-22T11:00"):
        directory = tmp_path / "ts" / f"at={value}"
        directory.mkdir(parents=True)
        write_jsonl(directory / "p.jsonl", [{"query": "q", "item": "i"}])
    for value in ("1", str(2**63)):
        directory = tmp_path / "big" / f"id={value}"
        directory.mkdir(parents=True)
        write_jsonl(directory / "p.jsonl", [{"query": "q", "item": "i"}])
    overrides = ColumnOverrides(keep_columns=("at",))
    source = open_source(str(tmp_path / "ts"))
    assert column_types(source, input_mapping(source, overrides))["at"] == pa.timestamp("us")
    overrides = ColumnOverrides(keep_columns=("id",))
    source = open_source(str(tmp_path / "big"))
    assert column_types(source, input_mapping(source, overrides))["id"] == pa.string()  # 2^63: not a BIGINT


@pytest.mark.parametrize("hive_types", ["infer", "string"])
def test_typed_hive_values_reach_the_output(qwen3_causal, tmp_path, hive_types):
    hive, ordered = _hive(tmp_path, "parquet")
    outputs = {}
    for name in ("out.parquet", "out.jsonl.gz"):
        config = RunConfig(
            input=str(hive),
            output=str(tmp_path / name),
            model_dir=qwen3_causal,
            columns=ColumnOverrides(keep_columns=("dt", "n", "shard")),
            engine=EngineConfig(device="cpu", scoring=ScoringConfig(label_tokens=(" to", " the"))),
            hive_types=hive_types,
            quiet=True,
        )
        job.run(config)
        outputs[name] = tmp_path / name
    table = pq.read_table(outputs["out.parquet"])
    lines = [json.loads(line) for line in _decompress(outputs["out.jsonl.gz"]).decode().splitlines()]
    if hive_types == "infer":
        assert (table.schema.field("dt").type, table.schema.field("n").type) == (pa.date32(), pa.int64())
        assert table.column("dt").to_pylist() == [r["dt"] for r in ordered]
        assert table.column("n").to_pylist() == [r["n"] for r in ordered]
        assert [line["dt"] for line in lines] == [r["dt"].isoformat() for r in ordered]
        assert [line["n"] for line in lines] == [r["n"] for r in ordered]
    else:
        assert table.schema.field("n").type == pa.string()
        assert table.column("dt").to_pylist() == [r["dt"].isoformat() for r in ordered]
        assert [line["n"] for line in lines] == [None if r["n"] is None else str(r["n"]) for r in ordered]
    assert table.column("shard").to_pylist() == [r["shard"] for r in ordered]  # "007" stays text next to "a1"
