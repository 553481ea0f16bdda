"""Batch-job behaviour: resume after kill -9, SIGTERM, atomic output, --overwrite, --on-error, report, dry run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, REPO, run_cli, write_jsonl

pytestmark = pytest.mark.slow


def many_rows(n_queries: int = 40, items: int = 6) -> list[dict]:
    return [
        {
            "query_id": q,
            "query": f"query {q} about the flag of the United States",
            "item_id": f"{q}-{i}",
            "item": f" item {i} to the city of Tokyo {q}",
        }
        for q in range(n_queries)
        for i in range(items)
    ]


def start_cli(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "score_batch.cli.main", *map(str, args)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_parts(parts_dir: Path, count: int, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if parts_dir.exists() and len(list(parts_dir.glob("part-*.parquet"))) >= count:
            return
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    raise AssertionError("no parts appeared")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_killed_run_resumes_to_identical_output(job, how):
    base, reference, tmp_path = job
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    process = start_cli(*base, "-o", out)
    wait_for_parts(parts, 3, process)
    process.send_signal(how)
    code = process.wait(timeout=60)
    assert code == (-signal.SIGKILL if how == signal.SIGKILL else 143)
    assert not out.exists()  # nothing partial at the destination
    done_before = len(list(parts.glob("part-*.parquet")))
    assert done_before >= 3
    refused = run_cli(*base, "-o", out)
    assert refused.returncode == 2 and "--resume" in refused.stderr
    resumed = run_cli(*base, "-o", out, "--resume", "--report", tmp_path / "report.json")
    assert resumed.returncode == 0, resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))
    assert not parts.exists()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["rows_skipped_by_resume"] >= done_before * 6
    assert report["rows_read"] == 240


def killed_after_two_parts(base, out: Path) -> None:
    """Start a run to OUT and kill -9 it once two checkpoint parts exist."""
    process = start_cli(*base, "-o", out)
    wait_for_parts(Path(f"{out}.parts"), 2, process)
    process.kill()
    process.wait()


def test_resume_with_other_settings_is_refused(job):
    base, reference, tmp_path = job
    out = tmp_path / "out.parquet"
    killed_after_two_parts(base, out)
    result = run_cli(*base, "-o", out, "--resume", "--apply-softmax")
    assert result.returncode == 2
    assert "written differently: setting engine.scoring.apply_softmax false → true" in result.stderr
    # The batch budget and window rows leave scores within the invariance bound: resuming with others goes
    # on, reading the windows its parts were written with, and records that size for the next resume.
    other = ("--max-batch-tokens", "333", "--window-rows", "5")
    again = start_cli(*base, "-o", out, "--resume", *other)
    wait_for_parts(Path(f"{out}.parts"), 4, again)
    again.kill()
    again.wait()
    resumed = run_cli(*base, "-o", out, "--resume", *other)
    assert resumed.returncode == 0, resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))


UPGRADED_TORCH = """
import importlib.metadata, sys
installed = importlib.metadata.version
importlib.metadata.version = lambda name: "9.9.9" if name == "torch" else installed(name)
from score_batch.cli.main import run
sys.argv = ["score-batch", *sys.argv[1:]]
run()
"""


def test_resume_after_a_torch_upgrade_is_refused(job):
    base, _, tmp_path = job
    out = tmp_path / "out.parquet"
    killed_after_two_parts(base, out)
    result = subprocess.run(
        [sys.executable, "-c", UPGRADED_TORCH, *map(str, base), "-o", str(out), "--resume"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "written differently: torch " in result.stderr, result.stderr
    assert "→ 9.9.9" in result.stderr
    assert run_cli(*base, "-o", out, "--resume").returncode == 0  # the same versions still resume


def test_resume_checks_the_input_by_content_and_refuses_older_parts_by_version(job):
    """The parts record the run's identity (model, settings, versions) and each window's input digest: an
    input touched but unchanged resumes; parts of 0.4.0 (its record held the input files' sizes and times)
    are refused naming the version, parts checked with an older input digest naming the digest."""
    import score_batch

    base, reference, tmp_path = job
    out = tmp_path / "out.parquet"
    killed_after_two_parts(base, out)
    manifest = tmp_path / "out.parquet.parts" / "manifest.json"
    written = manifest.read_text()
    older = json.loads(written)
    older["fingerprint"] = "0" * 64
    older["record"]["input"] = [[f"file://{base[0]}", base[0].stat().st_size, 1]]
    older["record"]["software"] = [
        [n, "0.4.0" if n == "score-batch" else v] for n, v in older["record"]["software"]
    ]
    manifest.write_text(json.dumps(older))
    refused = run_cli(*base, "-o", out, "--resume")
    assert refused.returncode == 2, refused.stderr
    assert f"written differently: score-batch 0.4.0 → {score_batch.__version__};" in refused.stderr
    digest_2 = json.loads(written)
    del digest_2["input_digest"]  # parts checked with input digest 2 (its manifest named none)
    manifest.write_text(json.dumps(digest_2))
    refused = run_cli(*base, "-o", out, "--resume")
    assert refused.returncode == 2 and "(this score-batch: score-batch input digest 4)" in refused.stderr
    manifest.write_text(written)
    stat = base[0].stat()
    os.utime(base[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched, its content kept
    resumed = run_cli(*base, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))


def test_existing_output_needs_overwrite(job):
    base, reference, _ = job
    before = reference.read_bytes()
    refused = run_cli(*base, "-o", reference)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert reference.read_bytes() == before
    assert run_cli(*base, "-o", reference, "--overwrite").returncode == 0


MIXED = [
    {"query": "I pledge allegiance", "item": " to", "item_id": "good-1"},
    {"query": None, "item": " to", "item_id": "null-query"},
    {"query": "Tokyo is", "item": " a city", "item_id": "good-2"},
    {"query_tokens": [1, 2], "item": " x", "item_id": "wrong-type"},
]


@pytest.mark.parametrize("mode", ["fail", "record", "skip"])
def test_on_error_modes(qwen3_causal, tmp_path, mode):
    data = tmp_path / "in.jsonl"
    write_jsonl(data, MIXED)
    with open(data, "a") as handle:
        handle.write("{broken json\n")
    out = tmp_path / "out.jsonl"
    result = run_cli(data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", mode)
    if mode == "fail":
        assert result.returncode == 2
        assert "row 1" in result.stderr and "'query' is null" in result.stderr
        assert not out.exists() and not (tmp_path / "out.jsonl.parts").exists()
        return
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    good = [line for line in lines if line["item_id"] in ("good-1", "good-2")]
    assert len(good) == 2 and all(line["score"] is not None for line in good)
    if mode == "record":
        assert [line["item_id"] for line in lines] == ["good-1", "null-query", "good-2", "wrong-type", None]
        errors = [line["error"] for line in lines]
        assert errors[0] is None and "null" in errors[1] and "line 5" in errors[4]
        assert lines[1]["score"] is None
    else:
        assert [line["item_id"] for line in lines] == ["good-1", "good-2"]
        skipped = [
            json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
        ]
        assert [s["row_index"] for s in skipped] == [1, 3, 4]


def test_truncation_policies_keep_rows(qwen3_causal, tmp_path):
    rows = [{"query": "the flag " * 30, "item": " to the city" * 20}]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    common = [
        data,
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "--max-query-tokens",
        "16",
        "--max-item-tokens",
        "12",
    ]
    failed = run_cli(*common, "-o", tmp_path / "a.jsonl", "--on-error", "record")
    assert "over the limit" in json.loads((tmp_path / "a.jsonl").read_text())["error"]
    assert failed.returncode == 4  # its one item failed: written with its error, then the failure threshold
    query_cut = run_cli(
        *common, "-o", tmp_path / "b.jsonl", "--truncate", "query-head", "--on-error", "record"
    )
    assert query_cut.returncode == 4
    assert (
        "item 0 has" in json.loads((tmp_path / "b.jsonl").read_text())["error"]
    )  # only the query may be cut


def test_report_and_dry_run_counts_agree(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", many_rows(5, 4))
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS]
    assert run_cli(*base, "-o", tmp_path / "o.parquet", "--report", tmp_path / "run.json").returncode == 0
    dry = run_cli(*base, "-o", tmp_path / "dry.parquet", "--dry-run", "--report", tmp_path / "dry.json")
    assert dry.returncode == 0 and "planned 20 items" in dry.stderr
    assert not (tmp_path / "dry.parquet").exists()
    run, plan = (json.loads((tmp_path / n).read_text()) for n in ("run.json", "dry.json"))
    assert run["rows_read"] == plan["rows_read"] == 20
    assert run["items_scored"] == 20 and plan["items_scored"] == 0 and plan["items"] == 20
    for key in ("groups", "packs", "batches", "packed_tokens", "pairwise_tokens"):
        assert run[key] == plan[key], key
    assert run["groups"] == 5
    assert run["packed_tokens"] < run["pairwise_tokens"]
    for report in (run, plan):  # --dtype auto and --packing auto as resolved on this CPU
        assert (report["device"], report["dtype"], report["packing"]) == ("cpu", "float32", "mis")
    assert run["versions"]["torch"] and run["settings"]["engine"]["scoring"]["label_tokens"] == [
        " to",
        " the",
    ]


def test_pickle_weights_refused_without_flag(qwen3_causal, copy_model, tmp_path):
    import torch
    from safetensors.torch import load_file

    model_dir = copy_model(qwen3_causal)
    weights = model_dir / "model.safetensors"
    torch.save(load_file(weights), model_dir / "pytorch_model.bin")
    os.remove(weights)
    data = write_jsonl(tmp_path / "in.jsonl", MIXED[:1])
    refused = run_cli(data, "-o", tmp_path / "o.jsonl", "--model", model_dir, *LABEL_FLAGS)
    assert refused.returncode == 2 and "--allow-pickle" in refused.stderr
    allowed = run_cli(data, "-o", tmp_path / "o.jsonl", "--model", model_dir, *LABEL_FLAGS, "--allow-pickle")
    assert allowed.returncode == 0, allowed.stderr


def test_window_digest_sees_every_field_and_the_input_digest_ignores_the_windows():
    import dataclasses
    import datetime
    import decimal

    from score_batch.io_formats.rows import InputRow
    from score_batch.io_formats.window import from_rows
    from score_batch.job.checkpoint.input_digest import InputDigest
    from tests.test_columnar_reader import as_rows

    long_query = "q" * 5000
    rows = [
        InputRow(
            0,
            long_query,
            ["a", "b"],
            7,
            ["x", None],
            {"k": [1, {"d": datetime.date(2020, 1, 2)}], "b": None},
            None,
        ),
        InputRow(1, [5, 6], [[1, 2]], None, [None], {"k": decimal.Decimal("1.5"), "b": b"\x00"}, "bad row"),
        InputRow(2, long_query, ["c"], 7, ["y"], {"k": None, "b": None}, None),
        InputRow(3, {"not": "text"}, [None], None, [None], {"k": None, "b": None}, "bad query"),
    ]

    def window(rows):
        return from_rows(rows, True, ("k", "b"))

    whole = InputDigest()
    whole.add(window(rows))
    for cut in (1, 2, 3):  # the input's digest is the same however it is cut into windows
        pieces = InputDigest()
        pieces.add(window(rows[:cut]))
        pieces.add(window(rows[cut:]))
        assert pieces.hexdigest() == whole.hexdigest()
    assert as_rows(window(rows).slice(1, 3)) == rows[1:3]  # a slice keeps every field
    assert InputDigest().add(window(rows[:1])) != InputDigest().add(window(rows))
    changes = [
        {"query": long_query[:-1] + "r"},  # the query's last character only
        {"items": ["a", "B"]},
        {"query_id": 8},
        {"item_ids": ["x", "z"]},
        {"kept": {"k": [1, {"d": datetime.date(2020, 1, 3)}], "b": None}},
        {"error": "now bad"},
        {"index": 9},
    ]
    seen = {InputDigest().add(window(rows))}
    for change in changes:
        changed = [dataclasses.replace(rows[0], **change), *rows[1:]]
        digest = InputDigest().add(window(changed))
        assert digest not in seen, change
        seen.add(digest)
    bad_query = [*rows[:3], dataclasses.replace(rows[3], query={"not": "text!"})]  # a failing row's query too
    assert InputDigest().add(window(bad_query)) not in seen
    assert InputDigest().add(window([dataclasses.replace(r) for r in rows])) == InputDigest().add(
        window(rows)
    )


def test_a_stopped_run_reports_its_timings_and_a_resume_reports_the_whole_output(job):
    base, reference, tmp_path = job
    out, stopped, resumed, full = (tmp_path / n for n in ("out.parquet", "s.json", "r.json", "f.json"))
    process = start_cli(*base, "-o", out, "--report", stopped)
    wait_for_parts(tmp_path / "out.parquet.parts", 2, process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 143
    written = json.loads(stopped.read_text())
    assert (
        written["seconds_total"] > written["seconds_scoring"] > 0
        and written["score_stats"]["scores"]["count"] > 0
    )
    # a fresh process imports torch at the run's start: timed apart from the job's work, inside its total
    assert 0 < written["seconds_import"] < written["seconds_total"] - written["seconds_scoring"]
    assert run_cli(*base, "-o", out, "--resume", "--report", resumed).returncode == 0
    assert run_cli(*base, "-o", tmp_path / "full.parquet", "--report", full).returncode == 0
    after_resume, uninterrupted = json.loads(resumed.read_text()), json.loads(full.read_text())
    assert after_resume["rows_skipped_by_resume"] > 0
    assert after_resume["score_stats"] == uninterrupted["score_stats"]  # every row, not only the rescored


def test_the_report_gives_usage_and_the_cost_at_a_price(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", many_rows(4, 3))
    report = tmp_path / "r.json"
    env = {"SCORE_BATCH_PRICE_PER_HOUR": "3.6"}  # the environment spelling of --price-per-hour
    result = run_cli(
        data, "--model", qwen3_causal, *LABEL_FLAGS, "-o", tmp_path / "o.parquet", "--report", report, env=env
    )
    assert result.returncode == 0, result.stderr
    written = json.loads(report.read_text())
    usage = written["usage"]
    assert (
        usage["input_tokens"]
        == written["pairwise_tokens"]
        > usage["computed_tokens"]
        == written["packed_tokens"]
    )
    assert usage["device"] and usage["device_seconds"] == written["seconds_scoring"]
    assert usage["cost"] == round(3.6 * written["seconds_total"] / 3600, 6)
    assert usage["cost_per_million_items"] == round(usage["cost"] * 1e6 / 12, 6)
    assert "cost " in result.stderr
    assert run_cli(data, "-o", tmp_path / "x.parquet", "--price-per-hour", "-1").returncode == 2
    dry = run_cli(
        data, "--model", qwen3_causal, *LABEL_FLAGS, "-o", tmp_path / "d.parquet", "--report", report,
        "--overwrite", "--dry-run", env=env,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(report.read_text())
    # nothing ran: the tokens a run would compute, no computed tokens, device seconds or cost
    assert planned["usage"] == {
        "input_tokens": written["pairwise_tokens"],
        "planned_tokens": written["packed_tokens"],
        "device": usage["device"],
    }
    assert "no cost is given" in dry.stderr and "cost " not in dry.stderr.splitlines()[-1]
