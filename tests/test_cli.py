"""The score-batch command end to end: layouts, stdin/stdout, schema, order, exit codes, demo AUC."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from score_batch.cli.main import app
from tests import process_state
from tests.reference import max_abs_diff, reference_scores, reference_sequence, tokenizer

REPO = Path(__file__).resolve().parent.parent
LABEL_FLAGS = ["--label-tokens", " to", "--label-tokens", " the"]
ROWS = [
    {"query_id": "a", "query": "I pledge allegiance", "item_id": "a1", "item": " to", "tag": 1},
    {"query_id": "b", "query": "Tokyo is a city in", "item_id": "b1", "item": " Japan", "tag": 2},
    {"query_id": "a", "query": "I pledge allegiance", "item_id": "a2", "item": " the flag of", "tag": 3},
    {"query_id": "b", "query": "Tokyo is a city in", "item_id": "b2", "item": " the country", "tag": 4},
    {"query_id": "a", "query": "I pledge allegiance", "item_id": "a3", "item": "", "tag": 5},
]


@dataclass
class Ran:
    """What a command run left behind: exit code and the two streams."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(
    *args, stdin: str | None = None, cwd=None, env=None, python_args=False, fresh_process=False
) -> Ran:
    """Run the command in-process (Typer's runner) or, for process-level behaviour, as a fresh process.

    python_args: the args go to python itself (always a fresh process).
    """
    if python_args or fresh_process:
        command = (
            [sys.executable, *map(str, args)]
            if python_args
            else [sys.executable, "-m", "score_batch.cli.main", *map(str, args)]
        )
        done = subprocess.run(
            command,
            input=stdin,
            capture_output=True,
            text=True,
            cwd=cwd or REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            timeout=300,
        )
        return Ran(done.returncode, done.stdout, done.stderr)
    with process_state.kept():  # the command's process-wide settings (gc, logging, environment, cwd) put back
        os.chdir(cwd or REPO)
        result = CliRunner().invoke(app, [str(a) for a in args], input=stdin, env=env)
    return Ran(result.exit_code, result.stdout, result.stderr)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def expected_scores(model_dir, rows) -> list[np.ndarray]:
    tok = tokenizer(str(model_dir))
    labels = [tok.encode(t, add_special_tokens=False)[0] for t in (" to", " the")]
    return [
        reference_scores(model_dir, "causal", reference_sequence(model_dir, r["query"], r["item"]), labels)[0]
        for r in rows
    ]


def test_long_parquet_matches_reference_in_input_order(qwen3_causal, tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), src)
    out = tmp_path / "out.parquet"
    result = run_cli(
        src,
        "-o",
        out,
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "--keep-columns",
        "tag",
        "--pooled-hidden-states",
    )
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out)
    assert table.column_names == [
        "query_id",
        "item_id",
        "score",
        "scores",
        "pooled_hidden_state",
        "tag",
        "score_key",
    ]
    assert table.schema.field("score").type == pa.float32()
    assert table.schema.field("pooled_hidden_state").type == pa.list_(pa.float32(), 64)
    assert table.column("item_id").to_pylist() == [r["item_id"] for r in ROWS]
    assert table.column("tag").to_pylist() == [1, 2, 3, 4, 5]
    got = table.column("scores").to_pylist()
    for expected, row_scores, score in zip(
        expected_scores(qwen3_causal, ROWS), got, table.column("score").to_pylist()
    ):
        assert max_abs_diff(expected, row_scores) <= 1e-4
        assert score == row_scores[-1]
    assert "scored 5 items" in result.stderr


def test_nested_jsonl_stdin_to_stdout(qwen3_causal):
    nested = [{"query": "I pledge allegiance", "items": [" to", " the flag of", ""], "item_ids": [1, 3, 5]}]
    result = run_cli(
        "-", "-o", "-", "--model", qwen3_causal, *LABEL_FLAGS, "--quiet", stdin=json.dumps(nested[0]) + "\n"
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["item_id"] for line in lines] == [1, 3, 5]
    assert len({line["query_id"] for line in lines}) == 1  # no query_id column: the query's digest
    rows = [r for r in ROWS if r["query_id"] == "a"]
    for expected, line in zip(expected_scores(qwen3_causal, rows), lines):
        assert max_abs_diff(expected, line["scores"]) <= 1e-4
    # --quiet: stdout holds only JSON; stderr only the warning about the empty item (scored as given)
    assert result.stderr.splitlines() == [
        "score-batch: WARNING: 1 of 3 items are empty; scored as given, around their templates "
        "(docs/semantics.md: empty queries and items)"
    ]


def test_stdout_with_skip_writes_skipped_rows_to_the_errors_file(qwen3_causal, tmp_path):
    rows = [ROWS[0], {**ROWS[1], "item": None}, ROWS[2]]
    errors = tmp_path / "skipped.jsonl"
    result = run_cli(
        write_jsonl(tmp_path / "in.jsonl", rows),
        "-o",
        "-",
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "--on-error",
        "skip",
        "--errors-file",
        errors,
        "--quiet",
    )
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["item_id"] for line in result.stdout.splitlines()] == ["a1", "a2"]
    [skipped] = [json.loads(line) for line in errors.read_text().splitlines()]
    assert skipped["row_index"] == 1 and "column 'item' is null" in skipped["error"]


def test_token_id_layout_equals_text(qwen3_causal, tmp_path):
    tok = tokenizer(str(qwen3_causal))
    rows = [
        {
            "query_tokens": tok(r["query"])["input_ids"],
            "item_tokens": tok(r["item"], add_special_tokens=False)["input_ids"],
        }
        for r in ROWS
    ]
    text_out, ids_out = tmp_path / "text.jsonl", tmp_path / "ids.jsonl"
    assert (
        run_cli(
            write_jsonl(tmp_path / "t.jsonl", ROWS), "-o", text_out, "--model", qwen3_causal, *LABEL_FLAGS
        ).returncode
        == 0
    )
    result = run_cli(
        write_jsonl(tmp_path / "i.jsonl", rows), "-o", ids_out, "--model", qwen3_causal, *LABEL_FLAGS
    )
    assert result.returncode == 0, result.stderr
    text = [json.loads(line)["scores"] for line in text_out.read_text().splitlines()]
    ids = [json.loads(line)["scores"] for line in ids_out.read_text().splitlines()]
    assert text == ids


def test_directory_of_parquet_files(qwen3_classifier, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), data / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[2:]), data / "part-1.parquet")
    out = tmp_path / "out.parquet"
    result = run_cli(data, "-o", out, "--model", qwen3_classifier, "--apply-softmax")
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out)
    assert table.column("item_id").to_pylist() == [r["item_id"] for r in ROWS]
    assert np.allclose([sum(s) for s in table.column("scores").to_pylist()], 1.0, atol=1e-5)


def test_a_directory_mixing_parquet_and_jsonl_exits_2_as_naming_both_files_does(qwen3_causal, tmp_path):
    mix = tmp_path / "mix"
    mix.mkdir()
    rows = [{"query": f"q{n % 3}", "item": f" item {n}"} for n in range(30)]
    pq.write_table(pa.Table.from_pylist(rows[:10]), mix / "a.parquet")
    write_jsonl(mix / "b.jsonl", rows[10:])  # 20 rows a directory used to drop silently
    base = ["-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS]
    for given in ([mix], [mix / "a.parquet", mix / "b.jsonl"], [f"{mix}/*"]):
        result = run_cli(*given, *base)
        assert result.returncode == 2, result.stderr
        assert "mixes Parquet" in result.stderr and "b.jsonl" in result.stderr
        assert "Traceback" not in result.stderr and not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.parquet"], "does not exist"),
        (["{data}", "--model", "{tmp}/nope"], "does not exist"),
        (["{data}", "--query-col", "question"], "'question'"),
        (["{data}", "--label-tokens", " to the"], "exactly one token"),
        (["{data}", "--label-token-ids", "99999999"], "outside the vocabulary"),
        (["{data}", "--label-token-ids", "1,x"], "comma-separated"),
        (["{data}", "--packing", "pairs"], "pairs"),
        (["{data}", "-o", "{tmp}/out.csv"], ".csv"),
        (["{data}", "--query-template", "no placeholder"], "{query}"),
    ],
)
def test_bad_invocations_exit_2_without_traceback(qwen3_causal, tmp_path, args, message):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    filled = [a.format(data=data, tmp=tmp_path) for a in args]
    if "--model" not in filled:
        filled += ["--model", str(qwen3_causal)]
    if "--label-tokens" not in filled and "--label-token-ids" not in filled:
        filled += LABEL_FLAGS
    if "-o" not in filled:
        filled += ["-o", str(tmp_path / "out.parquet")]
    result = run_cli(*filled)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_item_column_names_columns(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "x", "text": "y"}])
    result = run_cli(data, "-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS)
    assert result.returncode == 2
    assert "no item column" in result.stderr and "'text'" in result.stderr
    assert "--item-col" in result.stderr and "--items-col" in result.stderr  # the flags that name it


def test_demo_runs_without_flags_and_ranks_well(tmp_path):
    out = tmp_path / "scores.parquet"
    result = run_cli(REPO / "sample_data" / "products.parquet", "-o", out, "--keep-columns", "label,split")
    assert result.returncode == 0, result.stderr
    rows = [r for r in pq.read_table(out).to_pylist() if r["split"] == "test"]
    positives = np.array([r["score"] for r in rows if r["label"] == 1])
    negatives = np.array([r["score"] for r in rows if r["label"] == 0])
    auc = (positives[:, None] > negatives[None, :]).mean()
    assert auc >= 0.9, auc


def test_models_command_is_not_shadowed_by_a_models_folder(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "x.parquet").write_bytes(b"")
    result = run_cli("models", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Supported models" in result.stdout and "qwen3-reranker" in result.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["in.jsonl", "--on-error", "bogus"],
            "Invalid value for '--on-error': 'bogus' is not one of 'fail', 'record', 'skip'",
        ),
        (["in.jsonl", "--max-pack-tokens", "abc"], "Invalid value for '--max-pack-tokens'"),
        (["in.jsonl", "--bogus"], "No such option: --bogus"),
        ([], "Missing argument 'INPUT'"),  # as --help names it (INPUT...)
    ],
)
def test_a_refused_flag_is_one_error_line(args, said):
    result = run_cli(*args, fresh_process=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("score-batch: error: " + said), result.stderr
    assert "Usage:" not in result.stderr and "Value error" not in result.stderr


def test_list_options_take_a_json_list_from_the_environment(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"query": "Tokyo is a city in", "item": " Japan"}])
    env = {"SCORE_BATCH_LABEL_TOKENS": '[" no", " yes"]'}  # leading spaces: whitespace splitting loses them
    report = tmp_path / "r.json"
    result = run_cli(src, "--dry-run", "--report", report, fresh_process=True, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(report.read_text())["settings"]["engine"]["scoring"]["label_tokens"] == [" no", " yes"]
    bad = run_cli(src, "--dry-run", fresh_process=True, env={"SCORE_BATCH_LABEL_TOKENS": '[" no",'})
    assert bad.returncode == 2 and "is not a JSON list" in bad.stderr


@pytest.mark.parametrize("value", [" red blue", "no yes", " yes"])
def test_whitespace_separated_list_options_from_the_environment_are_refused(tmp_path, value):
    src = write_jsonl(tmp_path / "in.jsonl", [{"query": "Tokyo is a city in", "item": " Japan"}])
    report = tmp_path / "r.json"
    env = {"SCORE_BATCH_LABEL_TOKENS": value}  # split on whitespace, ' red' would silently become 'red'
    bad = run_cli(src, "--dry-run", "--report", report, fresh_process=True, env=env)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr
    assert "must be a JSON list" in lines[0] and """SCORE_BATCH_LABEL_TOKENS='[" no", " yes"]'""" in lines[0]
    assert json.loads(report.read_text())["status"] == "failed"
    one_word = {"SCORE_BATCH_LABEL_TOKENS": "yes", "SCORE_BATCH_APPLY_SOFTMAX": "false"}
    one = run_cli(src, "--dry-run", "--report", report, "--overwrite", fresh_process=True, env=one_word)
    assert one.returncode == 0, one.stderr  # one word, no whitespace: nothing to lose
    assert json.loads(report.read_text())["settings"]["engine"]["scoring"]["label_tokens"] == ["yes"]


def test_an_unknown_score_batch_variable_is_named_with_a_suggestion(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"query": "Tokyo is a city in", "item": " Japan"}])
    result = run_cli(src, "--dry-run", fresh_process=True, env={"SCORE_BATCH_ON_EROR": "skip"})
    assert result.returncode == 0, result.stderr
    assert (
        "SCORE_BATCH_ON_EROR is not an option" in result.stderr and "SCORE_BATCH_ON_ERROR?" in result.stderr
    )
