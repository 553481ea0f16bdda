"""Checkpoint parts store fixed-size lists of numbers (pooled vectors) as fixed-size binary and read them back
as they were: values, nulls, types and metadata; a killed pooled run resumes to the uninterrupted output."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.locations import Location
from score_batch.job.checkpoint.parts import PartStore


def pooled_table(rows: int, dim: int, dtype, nulls: bool) -> pa.Table:
    rng = np.random.default_rng(rows + dim)
    values = rng.standard_normal((rows, dim)).astype(dtype)
    mask = pa.array(rng.random(rows) < 0.3) if nulls else None
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), dim, mask=mask)
    field = pa.field("pooled", vectors.type, metadata={b"unit": b"hidden"})
    schema = pa.schema([pa.field("row", pa.int64()), field, pa.field("error", pa.string())], {b"k": b"v"})
    return pa.table([pa.array(range(rows)), vectors, pa.array([None] * rows, pa.string())], schema=schema)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 9])
def test_parts_give_back_the_vectors_they_were_given(tmp_path, dtype, nulls, rows):
    store = PartStore(Location.on_disk(tmp_path / "parts"))
    store.start("fingerprint", keep=False)
    table = pooled_table(rows, 5, dtype, nulls)
    store.write(0, table, "input")
    stored = pq.read_table(tmp_path / "parts" / "part-00000000.parquet")
    assert pa.types.is_fixed_size_binary(stored.schema.field("pooled").type)  # no per-element levels
    back = store.read(0)
    assert back.schema == table.schema and back.schema.metadata == table.schema.metadata
    assert back.schema.field("pooled").metadata == table.schema.field("pooled").metadata
    assert back.equals(table)
    assert back.column("pooled").to_pylist() == table.column("pooled").to_pylist()


def test_a_sliced_or_chunked_vector_column_is_stored_as_it_is_or_whole(tmp_path):
    store = PartStore(Location.on_disk(tmp_path / "parts"))
    store.start("fingerprint", keep=False)
    whole = pooled_table(12, 3, np.float32, True)
    sliced = whole.slice(2, 7)  # an offset into the vectors: written as a list column, still read back equal
    store.write(0, sliced, "input")
    assert store.read(0).equals(sliced)
    chunked = pa.concat_tables([whole.slice(0, 4), whole.slice(4)])  # combined into one array first
    store.write(1, chunked, "input")
    assert store.read(1).equals(whole)


def test_killed_pooled_run_resumes_to_identical_output(job):
    from tests.test_cli import run_cli
    from tests.test_job import killed_after_two_parts

    base, _, tmp_path = job
    base = [*base, "--pooled-hidden-states"]
    reference = tmp_path / "pooled.parquet"
    assert run_cli(*base, "-o", reference).returncode == 0
    out = tmp_path / "out.parquet"
    killed_after_two_parts(base, out)
    resumed = run_cli(*base, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    expected = pq.read_table(reference)
    assert pa.types.is_fixed_size_list(expected.schema.field("pooled_hidden_state").type)
    assert pq.read_table(out).equals(expected)
