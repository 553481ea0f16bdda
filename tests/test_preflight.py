"""Preflight and the run's ends: checks before any model load, the dry run's row errors, the report on
every failure (signals during model load included), idempotent --resume reruns, engine item errors."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.errors import ConfigError
from tests.test_cli import LABEL_FLAGS, ROWS, run_cli, write_jsonl
from tests.test_job import many_rows

pytestmark = pytest.mark.slow


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model or tokenizer load fails the test: preflight must refuse before one."""
    import score_batch.engine.scorer as scorer
    import score_batch.job.runners.phase as phase

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before preflight refused the run")

    monkeypatch.setattr(scorer.Scorer, "load", classmethod(refuse))
    monkeypatch.setattr(scorer, "load_planner", refuse)
    monkeypatch.setattr(phase, "load_planner", refuse)
    monkeypatch.setattr(phase, "Scorer", type("NoScorer", (), {"load": staticmethod(refuse)}))


def table_input(tmp_path):
    data = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), data)
    return data


def test_wrong_column_name_exits_2_without_loading_the_model(qwen3_causal, tmp_path, no_model_load):
    data = table_input(tmp_path)
    report = tmp_path / "report.json"
    result = run_cli(
        data, "-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS,
        "--query-col", "question", "--report", report,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "'question'" in result.stderr and "Traceback" not in result.stderr
    assert json.loads(report.read_text())["status"] == "failed"
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(
    "name",
    [
        "rank",
        "query_id",
        "item_id",
        "score",
        "scores",
        "pooled_hidden_state",
        "error",
        "row_index",
        "__reused",
        "__duplicates",
    ],
)
def test_every_reserved_output_name_exits_2_before_any_model_load(
    qwen3_causal, tmp_path, no_model_load, name
):
    rows = [{"query": "q", "item_id": "i1", "item": " to", name: 1} for _ in range(2)]
    if name == "query_id":
        rows = [{**row, "qid": "a"} for row in rows]
    data = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    extra = ["--query-id-col", "qid"] if name == "query_id" else []
    if name == "item_id":
        extra = ["--item-id-col", "query"]
    if name == "pooled_hidden_state":  # written (so reserved) only when asked for
        extra = ["--pooled-hidden-states"]
    result = run_cli(
        data, "-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS,
        "--keep-columns", name, "--rank", *extra,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert repr(name) in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o.parquet").exists()


def test_keeping_a_rank_column_without_ranking_is_fine(qwen3_causal, tmp_path):
    rows = [{**row, "rank": i} for i, row in enumerate(ROWS)]
    data = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    out = tmp_path / "o.parquet"
    result = run_cli(data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "rank")
    assert result.returncode == 0, result.stderr
    assert pq.read_table(out)["rank"].to_pylist() == [0, 1, 2, 3, 4]


def test_dry_run_finds_the_over_long_row_the_real_run_fails_on(qwen3_causal, tmp_path):
    rows = many_rows(3, 2)
    rows[5] = {**rows[5], "item": " to the city" * 20}  # row 5 is over the item limit
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--max-item-tokens", "24"]
    real = run_cli(*base, "-o", tmp_path / "o.parquet")
    dry = run_cli(*base, "-o", tmp_path / "o.parquet", "--dry-run")
    assert real.returncode == dry.returncode == 2
    assert "row 5" in real.stderr and "over the limit" in real.stderr
    assert real.stderr.strip().splitlines()[-1] == dry.stderr.strip().splitlines()[-1]
    recorded = run_cli(
        *base,
        "-o",
        tmp_path / "o.parquet",
        "--dry-run",
        "--on-error",
        "record",
        "--report",
        tmp_path / "r.json",
    )
    assert recorded.returncode == 0 and "(1 failed" in recorded.stderr
    assert json.loads((tmp_path / "r.json").read_text())["items_failed"] == 1
    assert not (tmp_path / "o.parquet").exists()


def early_failures(tmp_path, model):
    """(name, args) of runs that fail in preflight, each with its own report path."""
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    existing = tmp_path / "exists.parquet"
    existing.write_bytes(b"x")
    empty = tmp_path / "empty"
    empty.mkdir()
    return {
        "missing input": [tmp_path / "missing.jsonl", "-o", tmp_path / "a.parquet"],
        "empty glob": [str(empty / "nothing-*.jsonl"), "-o", tmp_path / "b.parquet"],
        "output exists": [data, "-o", existing],
        "bad flag value": [data, "-o", tmp_path / "c.parquet", "--partition-by", "query_id"],
        "output is the input": [data, "-o", data.with_name("./in.jsonl")],
    }


def test_report_is_written_after_each_early_failure(qwen3_causal, tmp_path, no_model_load):
    for name, args in early_failures(tmp_path, qwen3_causal).items():
        report = tmp_path / f"{name.replace(' ', '-')}.json"
        result = run_cli(*args, "--model", qwen3_causal, *LABEL_FLAGS, "--report", report)
        assert result.returncode == 2, (name, result.stderr)
        assert "Traceback" not in result.stderr, name
        written = json.loads(report.read_text())
        assert written["status"] == "failed" and written["exit_code"] == 2, name
        assert written["error"], name


def test_a_bad_report_path_exits_2_first(qwen3_causal, tmp_path, no_model_load):
    result = run_cli(
        tmp_path / "missing.jsonl", "-o", tmp_path / "o.parquet", "--model", qwen3_causal,
        "--report", tmp_path / "no-such-dir" / "r.json",
    )  # fmt: skip
    assert result.returncode == 2
    assert "report directory" in result.stderr and "missing.jsonl" not in result.stderr


def test_report_failure_writes_the_report_of_a_run_that_never_started(tmp_path):
    from score_batch.job import report_failure

    report = tmp_path / "r.json"
    report_failure(
        str(report), ConfigError("RunConfig.window_rows", 0, "must be at least 1"), overwrite=False
    )
    written = json.loads(report.read_text())
    assert written["status"] == "failed" and written["exit_code"] == 2 and "window_rows" in written["error"]
    report_failure(None, ValueError("no report asked for"), overwrite=False)  # nothing to write
    report_failure(str(tmp_path / "missing" / "r.json"), ValueError("x"), overwrite=False)  # left alone
    assert not (tmp_path / "missing").exists()


def test_sigterm_during_model_load_exits_143_with_the_report(qwen3_causal, tmp_path, monkeypatch):
    import score_batch.job.runners.phase as phase

    loaded = phase.Scorer.load

    def load_then_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises Stopped here, mid-load
        return loaded(*args, **kwargs)

    monkeypatch.setattr(phase.Scorer, "load", staticmethod(load_then_signal))
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    report = tmp_path / "r.json"
    result = run_cli(
        data, "-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS, "--report", report
    )
    assert result.returncode == 143
    written = json.loads(report.read_text())
    assert written["status"] == "stopped" and written["exit_code"] == 143
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "o.parquet.lock").exists()


@pytest.mark.parametrize("name", ["o.parquet", "o.jsonl", "dataset"])
def test_resume_on_a_completed_output_exits_0_and_changes_nothing(qwen3_causal, tmp_path, monkeypatch, name):
    data = write_jsonl(tmp_path / "in.jsonl", many_rows(4, 3))
    out = tmp_path / name
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "-o", out, "--resume", "--window-rows", "5"]
    if name == "dataset":
        base += ["--partition-by", "query_id"]
    first = run_cli(*base)
    assert first.returncode == 0, first.stderr
    files = sorted(out.rglob("*")) if out.is_dir() else [out]
    before = {
        path: (path.read_bytes() if path.is_file() else None, path.stat().st_mtime_ns) for path in files
    }
    listing = sorted(p.name for p in tmp_path.iterdir())

    import score_batch.job.runners.local as local

    monkeypatch.setattr(local, "load_engine", lambda *a: pytest.fail("a complete output loads no model"))
    # Window rows, the batch budget and prefetch leave scores within the invariance bound: still complete.
    invariant = ["--window-rows", "3", "--max-batch-tokens", "77", "--no-pipeline"]
    again = run_cli(*base, *invariant, "--report", tmp_path / "r.json")
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stderr
    after = sorted(out.rglob("*")) if out.is_dir() else [out]
    assert after == files
    assert {
        path: (path.read_bytes() if path.is_file() else None, path.stat().st_mtime_ns) for path in after
    } == before
    assert json.loads((tmp_path / "r.json").read_text())["already_complete"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*listing, "r.json"])
    quiet = run_cli(*base, "-q")  # a scheduled no-op rerun prints nothing (cron mails every line)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    records = {"o.jsonl": ["o.jsonl.done"], "dataset": ["dataset.done"]}.get(name, [])
    assert listing == sorted(["in.jsonl", name, *records])


@pytest.mark.parametrize("name", ["o.parquet", "o.jsonl", "dataset", "rewritten/dataset"])
def test_resume_on_an_output_changed_since_it_was_completed_exits_2(qwen3_causal, tmp_path, name):
    import shutil

    data = write_jsonl(tmp_path / "in.jsonl", many_rows(6, 5))
    out = tmp_path / name
    out.parent.mkdir(exist_ok=True)
    plain = [data, "--model", qwen3_causal, *LABEL_FLAGS, "-o", out]
    if name.endswith("dataset"):
        plain += ["--partition-by", "query_id"]
    base = [*plain, "--resume"]
    assert run_cli(*base).returncode == 0
    if name == "o.parquet":  # filtered in place with pyarrow, the schema metadata (the fingerprint) kept
        table = pq.read_table(out)
        pq.write_table(table.filter(pa.compute.greater(table["score"], table["score"][0])), out)
        assert pq.read_schema(out).metadata == table.schema.metadata
    elif name == "o.jsonl":
        lines = out.read_text().splitlines(keepends=True)
        out.write_text("".join(lines[: len(lines) // 2]))
    elif name == "dataset":
        shutil.rmtree(out / "query_id=3")
    else:  # a partition file rewritten in place at the same size (here: its own bytes, a second later)
        (file,) = (out / "query_id=3").iterdir()
        stat, content = file.stat(), file.read_bytes()
        file.write_bytes(content)
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        assert file.stat().st_size == stat.st_size
    changed = run_cli(*base, "--report", tmp_path / "r.json")
    lines = changed.stderr.strip().splitlines()
    assert changed.returncode == 2 and "changed since it was completed" in lines[-1], changed.stderr
    said = {
        "o.parquet": "no score-batch row count",
        "o.jsonl": "o.jsonl.done",
        "dataset": "query_id=3/part-00000000.parquet is gone",
        "rewritten/dataset": "query_id=3/part-00000000.parquet is rewritten since",
    }
    assert said[name] in lines[-1] and "--overwrite" in lines[-1]
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == 2
    assert run_cli(*plain, "--overwrite").returncode == 0  # replaced deliberately
    rerun = run_cli(
        *base
    )  # a Parquet file carries its record; JSONL and datasets: OUTPUT.done, --resume only
    assert rerun.returncode == (0 if name == "o.parquet" else 2), rerun.stderr
    assert run_cli(*base, "--overwrite").returncode == 0
    assert "already complete" in run_cli(*base).stderr


@pytest.mark.parametrize("name", ["o.parquet", "o.jsonl"])
def test_resume_on_a_completed_output_refuses_a_changed_input_or_setting(qwen3_causal, tmp_path, name):
    data = write_jsonl(tmp_path / "in.jsonl", many_rows(4, 3))
    out = tmp_path / name
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "-o", out, "--resume"]
    assert run_cli(*base).returncode == 0
    before = out.read_bytes()
    stat = data.stat()
    text = data.read_text()
    data.write_text(text.replace("item 0 to", "item 9 to", 1))  # same size and time, other content
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = run_cli(*base)
    assert changed.returncode == 2 and "completed differently: the input changed" in changed.stderr
    # --resume keeps a completed output, so the message names what replaces it (not the --overwrite given)
    both = run_cli(*base, "--overwrite")
    assert both.returncode == 2, both.stderr
    assert "the input changed; drop --resume to replace it" in both.stderr
    assert "pass --overwrite" not in both.stderr and out.read_bytes() == before
    data.write_text(text)
    other_setting = run_cli(*base, "--max-pack-tokens", "64")
    assert other_setting.returncode == 2, other_setting.stderr
    assert "completed differently: setting engine.max_pack_tokens 8192 → 64" in other_setting.stderr
    budget = run_cli(*base, "--max-batch-tokens", "64")  # scores stay within the invariance bound
    assert budget.returncode == 0 and "already complete" in budget.stderr, budget.stderr
    assert out.read_bytes() == before
    plain = run_cli(*base[:-1])  # without --resume an existing output is refused as always
    assert plain.returncode == 2 and "--overwrite" in plain.stderr
    replaced = run_cli(*base[:-1], "--overwrite")  # a run without --resume leaves no JSONL record
    assert replaced.returncode == 0 and not out.with_name(name + ".done").exists()
    rerun = run_cli(
        *base
    )  # a Parquet output carries its record; a JSONL one written without --resume has none
    assert rerun.returncode == (0 if name == "o.parquet" else 2), rerun.stderr


def test_non_finite_item_scores_from_the_engine_are_row_errors():
    from score_batch.engine import Group, GroupResult
    from score_batch.io_formats.readers import InputRow
    from score_batch.io_formats.schema import ColumnMapping
    from score_batch.io_formats.window import from_rows
    from score_batch.job.preflight.contract import OutputContract
    from score_batch.job.windows import group_window, output_columns

    rows = from_rows([InputRow(0, "query", ["a", "b"], "q1", ["i1", "i2"])], True, ())
    grouped = group_window(rows)
    assert grouped.groups == [Group("query", ["a", "b"])]
    result = GroupResult(
        scores=np.array([[0.5], [np.nan]], np.float32),
        score=np.array([0.5, np.nan], np.float32),
        pooled=None,
        errors=[None, None],
    )
    result.item_errors = (None, "score is not finite (nan)")  # as the engine sets it per item
    mapping = ColumnMapping("nested", "query", "items", "query_id", "item_ids", ())
    types = {"query_id": pa.string(), "item_ids": pa.string()}
    contract = OutputContract.from_types(mapping, types, None, "record")
    part = contract.part_table(output_columns(rows, grouped, [result], contract, ["k1", "k2"]))
    assert part["score"].to_pylist() == [0.5, None]
    assert part["error"].to_pylist() == [
        None,
        "row 0: score is not finite (nan) (query_id='q1', item_id='i2')",
    ]
    assert OutputContract.from_types(mapping, types, None, "skip").split(part)[1].num_rows == 1


def test_a_dry_run_leaves_temporary_files_alone_the_real_run_removes_them(qwen3_causal, tmp_path):
    """A dry run takes no lock, so it must not delete what may be a running job's temporary file."""
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "o.parquet"
    leftover = tmp_path / ".o.parquet.tmp-abc123"
    leftover.write_bytes(b"a running job's half-written output")
    dry = run_cli(data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert leftover.exists() and not out.exists()
    real = run_cli(data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS)
    assert real.returncode == 0, real.stderr
    assert not leftover.exists() and out.exists()


def test_a_completed_output_of_an_older_input_digest_is_named_so_on_a_rerun(qwen3_causal, tmp_path):
    """An output completed when the input digest had no version in its record (score-batch input digest 2):
    a --resume on the same input is refused (the digests cannot be compared) naming the digest, not 'the input
    changed'."""
    import pyarrow.parquet as pq

    from score_batch.io_formats.writers import ROWS_KEY
    from score_batch.job.checkpoint.completion import METADATA_KEY, RECORD_KEY
    from score_batch.job.checkpoint.identity import RunIdentity

    data = write_jsonl(tmp_path / "in.jsonl", many_rows(4, 3))
    out = tmp_path / "o.parquet"
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "-o", out, "--resume"]
    assert run_cli(*base).returncode == 0
    assert "already complete" in run_cli(*base).stderr  # the same input, this digest: nothing to do
    table = pq.read_table(out)
    record = json.loads(table.schema.metadata[RECORD_KEY])
    assert record["input"][1] == "score-batch input digest 4"
    record["input"] = record["input"][:1]  # as an older record holds it
    older = RunIdentity._of(record)  # its fingerprint as the older run wrote it
    metadata = {
        **table.schema.metadata,
        RECORD_KEY: json.dumps(record, sort_keys=True).encode(),
        METADATA_KEY: older.digest.encode(),
        ROWS_KEY: str(table.num_rows).encode(),
    }
    pq.write_table(table.replace_schema_metadata(metadata), out)
    refused = run_cli(*base)
    assert refused.returncode == 2, refused.stderr
    assert "the input was digested another way then (now: score-batch input digest 4)" in refused.stderr
    assert "the input changed" not in refused.stderr
