"""Completion records edited or damaged by hand (types, nulls, truncation, duplicate and extra keys) in a
--partition-by output's OUTPUT.done and a Parquet output's metadata: a --resume rerun exits 2 with one line
naming the record and the field, or (a record of the right shape) goes on as before; never a traceback."""

from __future__ import annotations

import copy
import json

import pyarrow.parquet as pq
import pytest

from score_batch.job.checkpoint.completion import METADATA_KEY, RECORD_KEY
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import many_rows

pytestmark = pytest.mark.slow
WRONG = (None, 7, 1.5, True, "x", [], {})
FIELDS = ("settings", "model", "software", "input", "layout", "layout.window_rows", "failed")
SHAPES = {  # values of the right JSON type but the wrong shape
    "failed": ([1], [5, 2], [-1, 3], [True, 3], [1.0, 2]),
    "input": ([1, 2], ["a", "b", "c"]),
    "model": ([["a"]], [[1, "x"]], ["a"]),
    "software": ([["torch", 2]],),
    "layout.window_rows": (0, -4),
}


def mutations(record: dict) -> list[tuple[str, dict, bool]]:
    """(field, the edited identity record, whether it must be refused) for every wrong value of every field,
    and extra keys."""
    edited = []
    for field in FIELDS:
        path = field.split(".")
        original = _get(record, path)
        for value in (*WRONG, *SHAPES.get(field, ())):
            refused = type(value) is not type(original) or value in SHAPES.get(field, ())
            if value == original or not refused and field in ("settings", "layout"):
                continue  # a settings object of another content has the right shape
            edited.append((field, _set(record, path, value), refused))
    edited += [
        ("extra", {**record, "extra": 1}, True),
        ("layout.extra", _set(record, ["layout", "extra"], 1), True),
    ]
    return edited


def _get(record: dict, path: list[str]):
    for key in path:
        record = record[key]
    return record


def _set(record: dict, path: list[str], value) -> dict:
    edited = copy.deepcopy(record)
    _get(edited, path[:-1])[path[-1]] = value
    return edited


def broken_texts(text: str) -> list[tuple[str, str]]:
    """(what, text) for truncated JSON, a key given twice, and other JSON values as the whole record."""
    first_key = next(iter(json.loads(text)))
    cut = [(f"cut at {n}", text[:n]) for n in (0, 1, len(text) // 2, len(text) - 1)]
    twice = text.replace(f'{{"{first_key}"', f'{{"{first_key}": 1, "{first_key}"', 1)
    return [*cut, ("given twice", twice), *((f"the record {v}", v) for v in ("null", "[]", "7", '"x"'))]


def check(ran, field: str | None, refused: bool) -> None:
    """Exit 2 with one error line naming the field (refused), or exit 0 or 2 without a traceback."""
    assert "Traceback" not in ran.stderr and ran.returncode in (0, 2), (field, ran.returncode, ran.stderr)
    errors = [line for line in ran.stderr.splitlines() if line.startswith("score-batch: error:")]
    assert len(errors) == (ran.returncode == 2), ran.stderr
    if refused:
        assert ran.returncode == 2 and "the completion record" in errors[0], (field, ran.stderr)
        assert field is None or f"field {field!r}" in errors[0], (field, errors[0])


@pytest.fixture
def completed(qwen3_causal, tmp_path):
    rows = [dict(row, split=f"s{k % 2}") for k, row in enumerate(many_rows(4, 3))]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "split", "--resume"]
    return base, tmp_path


def test_an_edited_partitioned_outputs_done_file_is_refused_naming_the_field(completed):
    base, tmp_path = completed
    out = tmp_path / "out"
    args = [*base, "-o", out, "--partition-by", "split"]
    assert run_cli(*args).returncode == 0
    done = tmp_path / "out.done"
    original = done.read_text()
    sidecar = json.loads(original)
    cases = [
        (f"record.{f}", json.dumps({**sidecar, "record": e}), r) for f, e, r in mutations(sidecar["record"])
    ]
    cases += [
        (f, json.dumps(_set(sidecar, [f], v)), type(v) is not type(sidecar[f]))
        for f in ("fingerprint", "record", "files")
        for v in WRONG
    ]
    cases += [("fingerprint", json.dumps(_set(sidecar, ["fingerprint"], "abc")), True)]
    first = next(iter(sidecar["files"]))
    for value in (None, 7, [1], [1, "x"], [-1, 2], {}):
        cases.append((f"files.{first}", json.dumps(_set(sidecar, ["files", first], value)), True))
    cases += [(f"{k}", json.dumps({**sidecar, k: None}), True) for k in ("fingerprint",)]
    cases += [("extra", json.dumps({**sidecar, "extra": 1}), True)]
    cases += [("fingerprint", json.dumps({k: v for k, v in sidecar.items() if k != "fingerprint"}), True)]
    cases += [(None, text, True) for _, text in broken_texts(original)]
    for field, text, refused in cases:
        done.write_text(text)
        check(run_cli(*args), field, refused)
    done.write_text(original)
    assert run_cli(*args).returncode == 0  # the record as written: already complete


def test_an_edited_parquet_outputs_metadata_record_is_refused_naming_the_field(completed):
    base, tmp_path = completed
    out = tmp_path / "out.parquet"
    args = [*base, "-o", out]
    assert run_cli(*args).returncode == 0
    written = pq.read_table(out)
    metadata = dict(written.schema.metadata)
    record = json.loads(metadata[RECORD_KEY])

    def rewritten(key: bytes, value: bytes) -> None:
        table = written.replace_schema_metadata({**metadata, key: value})
        with pq.ParquetWriter(out, table.schema) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata({b"score_batch.rows": str(table.num_rows).encode()})

    cases = [(f, json.dumps(edited).encode(), r) for f, edited, r in mutations(record)]
    cases += [(None, text.encode(), True) for _, text in broken_texts(metadata[RECORD_KEY].decode())]
    for field, text, refused in cases:
        rewritten(RECORD_KEY, text)
        check(run_cli(*args), field, refused)
    for fingerprint in (b"abc", b"\xff\xfe", b""):
        rewritten(METADATA_KEY, fingerprint)
        check(run_cli(*args), "fingerprint", True)
    rewritten(RECORD_KEY, metadata[RECORD_KEY])
    assert run_cli(*args).returncode == 0  # the record as written: already complete
