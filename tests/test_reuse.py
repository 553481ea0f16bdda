"""--reuse: earlier outputs' scores copied bit for bit for pairs whose score key matches; only the rest scored."""

from __future__ import annotations

import json
import os
import random
import signal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.rows import InputRow
from score_batch.io_formats.window import from_rows
from score_batch.job.windows import pair_keys
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import many_rows, start_cli, wait_for_parts
from tests.test_object_stores import get_table, keys, s3, s3_server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow
VALUES = ("score", "scores")


def by_item(table: pa.Table) -> dict:
    """item_id → (score, scores) of a scored output."""
    rows = table.select(["item_id", *VALUES]).to_pylist()
    return {row["item_id"]: (row["score"], row["scores"]) for row in rows}


def nightly(tmp_path, model, *flags):
    """Yesterday's input and output (30 queries × 5 items), and today's input: 80% of yesterday's pairs, in
    another order, and 20% new ones; returns (base flags, yesterday's output, today's input, the new ids)."""
    yesterday_rows = many_rows(30, 5)
    new_rows = [
        {**row, "item_id": f"new-{row['item_id']}", "item": row["item"] + " new"} for row in many_rows(6, 5)
    ]
    today_rows = yesterday_rows[: 24 * 5] + new_rows
    random.Random(7).shuffle(today_rows)
    base = ["--model", model, *LABEL_FLAGS, "--window-rows", "16", *flags]
    yesterday = tmp_path / "yesterday.parquet"
    ran = run_cli(write_jsonl(tmp_path / "yesterday.jsonl", yesterday_rows), *base, "-o", yesterday)
    assert ran.returncode == 0, ran.stderr
    today = write_jsonl(tmp_path / "today.jsonl", today_rows)
    return base, yesterday, today, {row["item_id"] for row in new_rows}


def test_a_rerun_copies_unchanged_pairs_bit_for_bit_and_scores_only_the_new(qwen3_causal, tmp_path):
    base, yesterday, today, new_ids = nightly(tmp_path, qwen3_causal)
    fresh, reused = tmp_path / "fresh.parquet", tmp_path / "reused.parquet"
    assert run_cli(today, *base, "-o", fresh).returncode == 0
    report = tmp_path / "report.json"
    ran = run_cli(today, *base, "-o", reused, "--reuse", yesterday, "--report", report)
    assert ran.returncode == 0, ran.stderr
    stats = json.loads(report.read_text())
    assert stats["reused"] == 120 and stats["items"] == 150 and stats["items_scored"] == 30
    assert stats["rows_written"] == 150
    assert "120 of 150 pairs reused" in ran.stderr

    earlier, out, reference = (by_item(pq.read_table(p)) for p in (yesterday, reused, fresh))
    table = pq.read_table(reused)
    assert table.column_names == pq.read_table(fresh).column_names  # same columns, score_key included
    assert table["score_key"].to_pylist() == pq.read_table(fresh)["score_key"].to_pylist()
    for item_id, values in out.items():
        if item_id in new_ids:  # scored now: as a fresh run gives it
            np.testing.assert_allclose(values[0], reference[item_id][0], atol=1e-5)
            np.testing.assert_allclose(values[1], reference[item_id][1], atol=1e-5)
        else:  # copied: yesterday's bits
            assert np.float32(values[0]).tobytes() == np.float32(earlier[item_id][0]).tobytes()
            assert (
                np.asarray(values[1], np.float32).tobytes()
                == np.asarray(earlier[item_id][1], np.float32).tobytes()
            )
    # The packed tokens are those of the 30 new pairs only.
    fresh_report = tmp_path / "fresh-report.json"
    assert run_cli(today, *base, "-o", tmp_path / "again.parquet", "--report", fresh_report).returncode == 0
    assert (
        stats["usage"]["computed_tokens"]
        < json.loads(fresh_report.read_text())["usage"]["computed_tokens"] / 3
    )


def test_a_dry_run_counts_the_pairs_the_real_run_would_copy(qwen3_causal, tmp_path):
    # The dry run's stand-in scores are one NaN per item; the earlier output's hold one number per label (2).
    base, yesterday, today, _ = nightly(tmp_path, qwen3_causal)
    report, out = tmp_path / "dry.json", tmp_path / "dry.parquet"
    ran = run_cli(today, *base, "-o", out, "--reuse", yesterday, "--dry-run", "--report", report)
    assert ran.returncode == 0, ran.stderr
    stats = json.loads(report.read_text())
    assert (stats["items"], stats["reused"], stats["items_scored"], stats["rows_written"]) == (150, 120, 0, 0)
    assert "planned 150 items" in ran.stderr and "items/s" not in ran.stderr.splitlines()[-1]
    assert not out.exists()


@pytest.mark.parametrize(
    "change",
    [
        ["--query-template", "Q: {query}"],  # a template changes every key
        ["--label-score", "logit"],
        ["--truncate", "item-tail", "--max-item-tokens", "4"],
    ],
)
def test_a_changed_setting_reuses_nothing(qwen3_causal, tmp_path, change):
    base, yesterday, today, _ = nightly(tmp_path, qwen3_causal)
    report = tmp_path / "report.json"
    ran = run_cli(
        today, *base, *change, "-o", tmp_path / "o.parquet", "--reuse", yesterday, "--report", report
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(report.read_text())["reused"] == 0


def test_a_model_touched_or_copied_keeps_its_keys(qwen3_causal, copy_model, tmp_path):
    """The model's identity is its files' content: a new modification time or another directory (a
    re-download of the same files) changes no score key."""
    model = copy_model(qwen3_causal)
    base, yesterday, today, _ = nightly(tmp_path, model)
    weights = next(model.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    report = tmp_path / "report.json"
    ran = run_cli(today, *base, "-o", tmp_path / "o.parquet", "--reuse", yesterday, "--report", report)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(report.read_text())["reused"] == 120
    base[1] = qwen3_causal
    ran = run_cli(
        today, *base, "-o", tmp_path / "p.parquet", "--reuse", yesterday, "--report", report, "--overwrite"
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(report.read_text())["reused"] == 120


def test_a_model_rescaled_in_place_with_size_and_mtime_restored_reuses_nothing(qwen3_causal, tmp_path):
    import subprocess

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save

    model = tmp_path / "model"
    subprocess.run(["cp", "-rp", str(qwen3_causal), str(model)], check=True)  # cp -p: times kept
    base, yesterday, today, _ = nightly(tmp_path, model)
    again = run_cli(tmp_path / "yesterday.jsonl", *base, "-o", yesterday, "--resume")
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr

    weights = model / "model.safetensors"
    before = weights.stat()
    with safe_open(str(weights), "pt") as handle:
        metadata = handle.metadata()
    rescaled = save({name: tensor * 1.5 for name, tensor in load_file(weights).items()}, metadata)
    assert len(rescaled) == before.st_size
    with open(weights, "r+b") as handle:  # the same file, the same size
        handle.write(rescaled)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # and its time restored
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert not torch.equal(
        load_file(weights)["lm_head.weight"], load_file(qwen3_causal / "model.safetensors")["lm_head.weight"]
    )

    report = tmp_path / "report.json"
    ran = run_cli(today, *base, "-o", tmp_path / "o.parquet", "--reuse", yesterday, "--report", report)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(report.read_text())["reused"] == 0
    stale = run_cli(tmp_path / "yesterday.jsonl", *base, "-o", yesterday, "--resume")
    assert stale.returncode == 2 and "the model's files changed" in stale.stderr, stale.stderr


def test_settings_that_cannot_change_scores_keep_the_keys(qwen3_causal, tmp_path):
    base, yesterday, today, _ = nightly(tmp_path, qwen3_causal)
    report = tmp_path / "report.json"
    flags = ["--window-rows", "7", "--max-batch-tokens", "96", "--no-pipeline"]
    ran = run_cli(today, *base, *flags, "-o", tmp_path / "o.jsonl", "--reuse", yesterday, "--report", report)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(report.read_text())["reused"] == 120


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_every_output_layout_is_a_cache(qwen3_causal, tmp_path, suffix):
    """Compressed JSONL, a partitioned directory and several --reuse outputs at once."""
    base, _, today, new_ids = nightly(tmp_path, qwen3_causal)
    gz, parted = tmp_path / f"y{suffix}", tmp_path / "parted"
    first = write_jsonl(tmp_path / "first.jsonl", many_rows(30, 5)[:60])
    second = write_jsonl(tmp_path / "second.jsonl", many_rows(30, 5)[60:])
    assert run_cli(first, *base, "-o", gz).returncode == 0
    assert run_cli(second, *base, "-o", parted, "--partition-by", "query_id").returncode == 0
    report, out = tmp_path / "report.json", tmp_path / "out.parquet"
    ran = run_cli(today, *base, "-o", out, "--reuse", gz, "--reuse", parted, "--report", report)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(report.read_text())["reused"] == 120
    earlier = {}
    with pa.input_stream(str(gz), compression="detect") as stream:
        for line in stream.read().decode().splitlines():
            row = json.loads(line)
            earlier[row["item_id"]] = (row["score"], row["scores"])
    for item_id, values in by_item(pq.read_table(out)).items():
        if item_id in earlier:
            assert np.float32(values[0]) == np.float32(earlier[item_id][0])
            assert (
                np.asarray(values[1], np.float32).tolist()
                == np.asarray(earlier[item_id][1], np.float32).tolist()
            )


def test_reuse_takes_what_input_takes_globs_commas_and_partitions(qwen3_causal, tmp_path):
    base, _, today, _ = nightly(tmp_path, qwen3_causal)
    rows = many_rows(30, 5)
    days = tmp_path / "scores"
    days.mkdir()
    for day, part in (("01", rows[:40]), ("02", rows[40:80])):
        data = write_jsonl(tmp_path / f"{day}.jsonl", part)
        assert run_cli(data, *base, "-o", days / f"dt=2026-11-{day}.parquet").returncode == 0
    parted = tmp_path / "parted"
    parted.mkdir()
    data = write_jsonl(tmp_path / "03.jsonl", rows[80:])
    assert run_cli(data, *base, "-o", parted / "dt=2026-11-03", "--partition-by", "query_id").returncode == 0
    report = tmp_path / "report.json"
    for given in (
        [f"{days}/dt=*.parquet", parted],
        [f"{days}/dt=2026-11-01.parquet,{days}/dt=2026-11-02.parquet", f"{parted}/**/*.parquet"],
        [days, parted],
    ):
        flags = [word for path in given for word in ("--reuse", path)]
        ran = run_cli(today, *base, "-o", tmp_path / "o.parquet", *flags, "--report", report, "--overwrite")
        assert ran.returncode == 0, ran.stderr
        assert json.loads(report.read_text())["reused"] == 120, given


def test_a_missing_earlier_output_is_refused_unless_opted_in(qwen3_causal, tmp_path):
    base, yesterday, today, _ = nightly(tmp_path, qwen3_causal)
    report = tmp_path / "report.json"
    for number, missing in enumerate((tmp_path / "failed-day.parquet", f"{tmp_path}/nothing-*.parquet")):
        out = tmp_path / f"o{number}.parquet"
        refused = run_cli(today, *base, "-o", out, "--reuse", missing)
        assert refused.returncode == 2 and "--reuse-missing-ok" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and not out.exists()
        ran = run_cli(
            today,
            *base,
            "-o",
            out,
            "--reuse",
            missing,
            "--reuse-missing-ok",
            "--report",
            report,
            "--overwrite",
        )
        assert ran.returncode == 0, ran.stderr
        assert "is not there" in ran.stderr and json.loads(report.read_text())["reused"] == 0
        assert pq.read_table(out).num_rows == 150
    ran = run_cli(
        today, *base, "-o", out, "--reuse", f"{yesterday},{tmp_path}/gone.jsonl", "--reuse-missing-ok",
        "--report", report, "--overwrite",
    )  # fmt: skip
    assert ran.returncode == 0 and json.loads(report.read_text())["reused"] == 120, ran.stderr


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_truncated_earlier_jsonl_output_is_one_line(qwen3_causal, tmp_path, suffix):
    base, _, today, _ = nightly(tmp_path, qwen3_causal)
    whole = tmp_path / f"whole{suffix}"
    assert run_cli(tmp_path / "yesterday.jsonl", *base, "-o", whole).returncode == 0
    cut = tmp_path / f"cut{suffix}"
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])  # a copy that stopped midway
    ran = run_cli(today, *base, "-o", tmp_path / "o.parquet", "--reuse", cut)
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and "Traceback" not in ran.stderr and "Python exception" not in ran.stderr
    assert lines[-1].startswith(f"score-batch: error: --reuse '{cut}': not a readable score-batch output")
    assert not (tmp_path / "o.parquet").exists()


def test_an_output_of_another_version_is_named(qwen3_causal, tmp_path):
    base, yesterday, today, _ = nightly(tmp_path, qwen3_causal)
    table = pq.read_table(yesterday)
    metadata = dict(table.schema.metadata)
    record = json.loads(metadata[b"score_batch.completion_record"])
    record["software"] = [[name, "0.2.1" if name == "score-batch" else v] for name, v in record["software"]]
    metadata[b"score_batch.completion_record"] = json.dumps(record).encode()
    older = tmp_path / "older.parquet"
    pq.write_table(table.replace_schema_metadata(metadata), older)
    ran = run_cli(today, *base, "-o", tmp_path / "o.parquet", "--reuse", older)
    assert ran.returncode == 0 and "written by score-batch 0.2.1" in ran.stderr, ran.stderr


def test_pooled_vectors_and_ranks_over_reused_and_new_rows(qwen3_causal, tmp_path):
    base, _, today, _ = nightly(tmp_path, qwen3_causal)
    yesterday = tmp_path / "pooled.parquet"
    flags = ["--pooled-hidden-states"]
    assert run_cli(tmp_path / "yesterday.jsonl", *base, *flags, "-o", yesterday).returncode == 0
    fresh, reused = tmp_path / "fresh.parquet", tmp_path / "reused.parquet"
    assert run_cli(today, *base, *flags, "--top-k", "2", "-o", fresh).returncode == 0
    ran = run_cli(today, *base, *flags, "--top-k", "2", "-o", reused, "--reuse", yesterday)
    assert ran.returncode == 0, ran.stderr
    got, want = pq.read_table(reused), pq.read_table(fresh)
    assert got.column_names == want.column_names and "rank" in got.column_names
    assert got["item_id"].to_pylist() == want["item_id"].to_pylist()  # the same top 2 of every query
    assert got["rank"].to_pylist() == want["rank"].to_pylist()
    earlier = {r["item_id"]: r["pooled_hidden_state"] for r in pq.read_table(yesterday).to_pylist()}
    for row in got.to_pylist():
        if row["item_id"] in earlier:
            assert (
                np.asarray(row["pooled_hidden_state"], np.float32).tobytes()
                == np.asarray(earlier[row["item_id"]], np.float32).tobytes()
            )


def test_a_killed_reuse_run_resumes_to_the_same_output(qwen3_causal, tmp_path):
    base, yesterday, today, _ = nightly(tmp_path, qwen3_causal)
    base = [*base, "--window-rows", "4", "--reuse", yesterday]
    reference, out = tmp_path / "reference.parquet", tmp_path / "out.parquet"
    assert run_cli(today, *base, "-o", reference).returncode == 0
    process = start_cli(today, *base, "-o", out)
    wait_for_parts(tmp_path / "out.parquet.parts", 3, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    ran = run_cli(today, *base, "-o", out, "--resume")
    assert ran.returncode == 0, ran.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))


def test_an_earlier_output_on_an_object_store(qwen3_causal, tmp_path, s3):  # noqa: F811
    client, bucket, storage = s3
    base, _, today, _ = nightly(tmp_path, qwen3_causal)
    uri = f"s3://{bucket}/scores/yesterday.parquet"
    ran = run_cli(tmp_path / "yesterday.jsonl", *base, *storage, "-o", uri)
    assert ran.returncode == 0, ran.stderr
    report, out = tmp_path / "report.json", tmp_path / "out.jsonl"
    ran = run_cli(today, *base, *storage, "-o", out, "--reuse", uri, "--report", report)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(report.read_text())["reused"] == 120
    earlier = by_item(get_table(client, bucket, "scores/yesterday.parquet"))
    for line in out.read_text().splitlines():
        row = json.loads(line)
        if row["item_id"] in earlier:
            assert np.float32(row["score"]) == np.float32(earlier[row["item_id"]][0])


def test_python_api_and_stdout(qwen3_causal, tmp_path):
    from score_batch.engine import EngineConfig, ScoringConfig
    from score_batch.io_formats.schema import ColumnOverrides
    from score_batch.job import RunConfig, run

    base, yesterday, today, _ = nightly(tmp_path, qwen3_causal)
    config = RunConfig(
        input=str(today),
        output=str(tmp_path / "api.parquet"),
        model_dir=qwen3_causal,
        columns=ColumnOverrides(),
        engine=EngineConfig(scoring=ScoringConfig(label_tokens=(" to", " the"))),
        window_rows=16,
        reuse=(str(yesterday),),
        quiet=True,
    )
    assert run(config).reused == 120
    ran = run_cli(today, *base, "-o", "-", "--reuse", yesterday)
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stdout.splitlines()]
    assert len(lines) == 150 and all(len(line["score_key"]) == 32 for line in lines)


def test_reuse_refusals_are_one_line(qwen3_causal, tmp_path, monkeypatch):
    import score_batch.job.runners.local as local

    base, yesterday, today, _ = nightly(tmp_path, qwen3_causal)
    monkeypatch.setattr(local, "load_engine", lambda *a, **k: pytest.fail("preflight loads no model"))
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"item_id": ["x"], "score": [0.5]}), foreign)
    for earlier, said in [
        (tmp_path / "missing.parquet", "no such file"),
        (foreign, "has no score_key column"),
        (today, "has no score_key column"),  # an input, not an output
        (tmp_path / "notes.txt", "not a score-batch output"),
    ]:
        (tmp_path / "notes.txt").write_text("hello")
        ran = run_cli(today, *base, "-o", tmp_path / "o.parquet", "--reuse", earlier)
        assert ran.returncode == 2 and said in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
        assert not (tmp_path / "o.parquet").exists()


def test_pair_keys_depend_on_text_and_identity_only():
    def keys(rows, identity=b"i" * 32):
        return pair_keys(from_rows(rows, True, ()), identity)

    row = InputRow(index=0, query="q", items=["a", "b", "a"], query_id="x", item_ids=[1, 2, 3])
    other_ids = InputRow(index=9, query="q", items=["a"], query_id="y", item_ids=[7])
    broken = InputRow(index=1, query=None, items=[None], query_id=None, item_ids=[None], error="bad line")
    found = keys([row, other_ids, broken])
    assert found[0] == found[2] == found[3] != found[1]
    assert found[4] is None
    assert keys([row], b"j" * 32)[0] != found[0]
    assert keys([InputRow(0, "q ", ["a"], None, [1])])[0] != found[0]
    assert (
        keys([InputRow(0, [1, 2], [[3]], None, [1])])[0]
        != keys([InputRow(0, "[1, 2]", ["[3]"], None, [1])])[0]
    )
    assert keys([InputRow(0, "qa", [""], None, [1])])[0] != keys([InputRow(0, "q", ["a"], None, [1])])[0]


def test_a_pair_whose_key_changed_since_the_join_is_scored_not_copied(tmp_path):
    from score_batch.job.reuse import EarlierScores

    joined = tmp_path / "reused.parquet"
    pq.write_table(
        pa.table(
            {
                "row_index": pa.array([0, 1, 1, 3], pa.int64()),
                "item_pos": pa.array([0, 0, 1, 0], pa.int32()),
                "score_key": ["k0", "old", "k1b", "k3"],
                "score": pa.array([0.1, 0.2, 0.3, 0.4], pa.float32()),
                "scores": [[0.1], [0.2], [0.3], [0.4]],
            }
        ),
        joined,
    )
    earlier = EarlierScores(tmp_path, joined, 4)
    rows = [InputRow(i, "q", ["a", "b"], None, [1, 2]) for i in range(3)]
    keys = ["k0", "x", "new", "k1b", "y", "z"]  # row 1 item 0 was rewritten after the key pass
    found, incomplete = earlier.take(from_rows(rows, False, ()), keys)
    assert sorted(found) == [0, 3] and incomplete == 0 and found[3]["scores"] == [pytest.approx(0.3)]
    later, _ = earlier.take(from_rows([InputRow(3, "q", ["c"], None, [1])], False, ()), ["k3"])
    assert list(later) == [0]
    earlier.close()
    assert not tmp_path.exists()


def test_a_ray_batch_takes_its_joined_rows_as_the_local_run_does():
    """JoinedScores (a Ray batch's joined table, its rows in any order) matches by row index, item position and
    key, as EarlierScores does: a rewritten pair, a position past its row and a row not in the window get none."""
    from score_batch.job.reuse import JoinedScores

    joined = pa.table(
        {
            "row_index": pa.array([7, 2, 7, 5, 9], pa.int64()),
            "item_pos": pa.array([1, 0, 0, 2, 0], pa.int32()),
            "score_key": ["k7b", "k2a", "old", "k5c", "k9a"],
            "score": pa.array([0.7, 0.2, 0.1, 0.5, 0.9], pa.float32()),
            "scores": pa.array([[0.7], [0.2], [0.1], [0.5], [0.9]], pa.list_(pa.float32())),
        }
    )
    rows = [
        InputRow(7, "q", ["a", "b"], None, [1, 2]),
        InputRow(2, "q", ["a"], None, [1]),
        InputRow(5, "r", ["a", "b"], None, [1, 2]),
    ]
    keys = ["k7a", "k7b", "k2a", "k5a", "k5b"]  # row 7 item 0 rewritten; row 5 has no item 2
    found, incomplete = JoinedScores(joined).take(from_rows(rows, False, ()), keys)
    assert found == {
        1: {"score": pytest.approx(0.7), "scores": [pytest.approx(0.7)]},
        2: {"score": pytest.approx(0.2), "scores": [pytest.approx(0.2)]},
    }
    assert incomplete == 0 and JoinedScores(None).take(from_rows(rows, False, ()), keys) == ({}, 0)


def test_another_models_pooled_width_reads_as_null_not_an_error():
    from score_batch.io_formats.earlier import _conformed

    batch = pa.record_batch(
        {"score_key": ["k"], "pooled_hidden_state": pa.array([[1.0, 2.0]], pa.list_(pa.float32(), 2))}
    )
    schema = pa.schema([("score_key", pa.string()), ("pooled_hidden_state", pa.list_(pa.float32(), 3))])
    conformed = _conformed(batch, schema, 0)
    assert (
        conformed.column("pooled_hidden_state").null_count == 1 and conformed.column("source")[0].as_py() == 0
    )


def test_the_temporary_files_of_a_killed_run_are_removed_by_the_next(tmp_path, monkeypatch):
    import tempfile

    from score_batch.job import reuse

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead, mine = (
        tmp_path / f"{reuse.TEMP_PREFIX}999999999-x",
        tmp_path / f"{reuse.TEMP_PREFIX}{os.getpid()}-y",
    )
    for directory in (dead, mine):
        directory.mkdir()
        (directory / "keys.parquet").write_bytes(b"x")
    reuse._remove_stale_directories()
    assert not dead.exists() and mine.exists()


@pytest.mark.parametrize(
    "ranked, store", [(False, False), (True, False), (False, True)], ids=["plain", "top-k", "s3"]
)
def test_a_ray_run_reuses_like_a_local_run(qwen3_causal, tmp_path, ranked, store, request):
    """--ray --reuse: the read tasks carry the joined values to the actors (from beside OUTPUT: a local
    directory or an object store); reused rows are yesterday's bits, the others a local run's scores;
    rankings are made over both (and equal the local run's)."""
    pytest.importorskip("ray")
    ranking = ["--top-k", "3"] if ranked else []
    storage, output = [], tmp_path / "ray"
    if store:
        client, bucket, storage = request.getfixturevalue("s3")
        output = f"s3://{bucket}/ray"
    base, yesterday, today, _ = nightly(tmp_path, qwen3_causal, *ranking, *storage)
    local, local_report, report = (
        tmp_path / "local.parquet",
        tmp_path / "local.json",
        tmp_path / "report.json",
    )
    ran = run_cli(today, *base, "-o", local, "--reuse", yesterday, "--report", local_report)
    assert ran.returncode == 0, ran.stderr
    ran = run_cli(
        today, *base, "-o", output, "--ray", "--num-workers", "1", "--reuse", yesterday,
        "--report", report, "-q", fresh_process=True,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    reused = json.loads(report.read_text())["reused"]
    assert reused == json.loads(local_report.read_text())["reused"] == (24 * 3 if ranked else 120)
    if store:  # everything under the output's prefix is the published output: no joined file left
        assert all(key.startswith("ray/") for key in keys(client, bucket))
        for key in keys(client, bucket, "ray/part-"):
            (tmp_path / "ray").mkdir(exist_ok=True)
            (tmp_path / "ray" / key[4:]).write_bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    got = pq.read_table(tmp_path / "ray").sort_by("row_index").drop_columns(["row_index"])
    expected = pq.read_table(local)
    assert sorted(got.column_names) == sorted(expected.column_names)  # score_key included
    if ranked:  # the same items ranked the same (a ranked output is in rank order, Ray's in row order)
        ranks = [dict(zip(t["item_id"].to_pylist(), t["rank"].to_pylist())) for t in (got, expected)]
        assert ranks[0] == ranks[1]
    else:
        assert got.column("item_id").to_pylist() == expected.column("item_id").to_pylist()
    earlier, reference = by_item(pq.read_table(yesterday)), by_item(expected)
    copied = 0
    for item_id, values in by_item(got).items():
        if item_id in earlier:  # reused: yesterday's bits
            assert np.float32(values[0]).tobytes() == np.float32(earlier[item_id][0]).tobytes()
            copied += 1
        else:
            np.testing.assert_allclose(values[0], reference[item_id][0], atol=1e-5)
    assert copied == reused or (ranked and 0 < copied < reused)  # --top-k keeps some reused pairs out
    assert not [
        p for p in tmp_path.iterdir() if p.name.startswith(".")
    ]  # the joined file's directory is gone


def test_chunk_settings_without_truncate_chunk_change_no_identity(tmp_path):
    """They do nothing then (a profile may carry them): no score identity and no resume fingerprint moves."""
    from types import SimpleNamespace

    import torch

    from score_batch.engine.config import EngineConfig, ScoringConfig
    from score_batch.io_formats.schema import ColumnOverrides
    from score_batch.job.checkpoint.identity import RunIdentity
    from score_batch.job.run_config import RunConfig

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    setup = SimpleNamespace(
        device=torch.device("cpu"), dtype=torch.float32, backend="sdpa", packing="mis", layers="native",
        ops="torch", label_ids=(1, 2), limits=SimpleNamespace(unscored_tail_id=None),
        text=SimpleNamespace(query_template=None, item_template=None),
    )  # fmt: skip

    def config(**scoring) -> RunConfig:
        engine = EngineConfig(scoring=ScoringConfig(**scoring))
        return RunConfig("in.jsonl", "out.parquet", model, ColumnOverrides(), engine)

    def identities(**scoring) -> tuple[bytes, str]:
        identity = RunIdentity.of(config(**scoring))
        return identity.score_key(setup), identity.digest

    assert identities() == identities(chunk_overlap=4, chunk_aggregate="mean")
    assert identities(truncate="item-tail") == identities(truncate="item-tail", chunk_overlap=4)
    chunked = identities(truncate="chunk")
    assert chunked != identities(truncate="chunk", chunk_overlap=4)
    assert chunked != identities(truncate="chunk", chunk_aggregate="mean")


def test_reusing_a_top_k_output_warns_that_only_its_best_pairs_can_be_copied(qwen3_causal, tmp_path):
    base, _, today, _ = nightly(tmp_path, qwen3_causal)
    top = tmp_path / "top.parquet"
    ran = run_cli(today, *base, "-o", top, "--top-k", "1")
    assert ran.returncode == 0, ran.stderr
    report = tmp_path / "report.json"
    again = run_cli(today, *base, "-o", tmp_path / "again.parquet", "--reuse", top, "--report", report)
    assert again.returncode == 0, again.stderr
    reused = json.loads(report.read_text())["reused"]
    assert 0 < reused <= pq.read_table(top).num_rows < 150  # at most one pair of each query
    assert f"--reuse {top} is a --top-k 1 output: it holds only the best pairs of each query" in again.stderr
    assert (
        f"--reuse: {reused} pairs of this run found in 1 earlier output file(s) (a --top-k output"
        in again.stderr
    )
    full = run_cli(today, *base, "-o", tmp_path / "full.parquet", "--reuse", tmp_path / "again.parquet")
    assert full.returncode == 0 and "--top-k" not in full.stderr, full.stderr  # a full output: no warning
