"""The command's options: declared once, each mapped by name to its config field, errors spelled as flags,
-q, --report on early failures, and `run-batch -i IN -o OUT` (vLLM's spelling)."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import logging
import re
import typing
from pathlib import Path

import pytest
import typer

from score_batch import job
from score_batch.cli import error_messages
from score_batch.cli.main import app
from score_batch.cli.options import BY_SETTING, FLAGLESS, OPTION, OPTIONS
from score_batch.engine.config import EngineConfig, ScoringConfig
from score_batch.errors import ConfigError, UserError
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.run_config import RayOptions, RunConfig
from tests.reference import max_abs_diff, reference_scores, reference_sequence, tokenizer
from tests.test_cli import LABEL_FLAGS, ROWS, run_cli, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = (RunConfig, EngineConfig, ScoringConfig, RayOptions, ColumnOverrides)
# options that set no config field: the profile lookup, the log lines, a removed flag's refusal
CLI_ONLY = ("profile", "log_format", "ranked_output")
PENDING = {
    "activation": ScoringConfig,
    "hive_types": RunConfig,
}  # fields that land with the engine / io branches
SETTINGS = [f"{c.__name__}.{f.name}" for c in CONFIGS for f in dataclasses.fields(c)]


def has_field(config: type, name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(config)}


def pending(option: str) -> list:
    """An xfail mark for an option whose config field is not on this branch yet."""
    if option in PENDING and not has_field(PENDING[option], option):
        return [pytest.mark.xfail(reason="field lands with the engine/io branch", strict=False)]
    return []


def command_flags(name: str) -> set[str]:
    """Every flag (and the argument's name, upper-case) the Typer command accepts."""
    command = typer.main.get_command(app).commands[name]
    accepted = set()
    for param in command.params:
        if param.param_type_name == "argument":
            accepted.add(param.name.upper())
        else:
            accepted.update(param.opts + param.secondary_opts)
    return accepted


# ----------------------------------------------------------------------------- declared once, mapped by name


@pytest.mark.parametrize("setting", SETTINGS)
def test_every_config_field_has_a_flag_or_is_listed_flagless(setting):
    if setting in FLAGLESS:
        assert setting not in BY_SETTING
        return
    assert setting in BY_SETTING, (
        f"{setting} has no flag: add an Option to cli/options.py or list it in FLAGLESS"
    )
    assert BY_SETTING[setting].flag in command_flags("score")  # the error table names a flag that exists


@pytest.mark.parametrize(
    "option", [pytest.param(o.name, marks=pending(o.name)) for o in OPTIONS if o.name not in CLI_ONLY]
)
def test_every_option_sets_a_config_field(option):
    assert OPTION[option].setting in SETTINGS


def literal_values(hint) -> set:
    """The values of every Literal inside a type hint (Annotated, Optional and unions looked through)."""
    if typing.get_origin(hint) is typing.Literal:
        return set(typing.get_args(hint))
    return set().union(*(literal_values(arg) for arg in typing.get_args(hint)))


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s in BY_SETTING])
def test_an_options_choices_are_its_config_fields(setting):
    owner, name = setting.split(".")
    config = next(c for c in CONFIGS if c.__name__ == owner)
    field = typing.get_type_hints(config)[name]
    assert literal_values(BY_SETTING[setting].type) == literal_values(field)


def test_the_log_formats_early_variable_is_the_options():
    from score_batch.cli.logs import FORMAT_VARIABLE  # read before the options are (cli/main.py)

    assert FORMAT_VARIABLE == OPTION["log_format"].env


def test_the_choices_are_declared_once():
    """Literal choices live in score_batch/choices.py: the options and configs declare none of their own."""
    for module in ("cli/options.py", "engine/config.py", "job/run_config.py", "io_formats/listing.py"):
        text = (ROOT / module).read_text(encoding="utf-8")
        assert "Literal[" not in text, module


BUILT = ("RunConfig.model_dir", "RunConfig.ray")  # resolved by cli/score.run_config, not copied


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s in BY_SETTING and s not in BUILT])
def test_option_defaults_equal_config_defaults(setting):
    owner, name = setting.split(".")
    field = next(
        f for f in dataclasses.fields(next(c for c in CONFIGS if c.__name__ == owner)) if f.name == name
    )
    option = BY_SETTING[setting]
    if field.default is dataclasses.MISSING or option.default is inspect.Parameter.empty:
        return  # INPUT and -o have no config default
    value = option.convert(option.default) if option.convert else option.default
    if owner == "ScoringConfig":
        assert value is None  # not given: the profile's value (or the field's default) stays
    else:
        assert value == field.default


# flag → (arguments, where the value lands in the RunConfig, the value); every option but CLI_ONLY has one
CASES = {
    "input": (["{tmp}/a.jsonl,{tmp}/b.jsonl"], "input", ("{tmp}/a.jsonl", "{tmp}/b.jsonl")),
    "output": (["-o", "{tmp}/x.jsonl"], "output", "{tmp}/x.jsonl"),
    "storage_option": (["--storage-option", "region=eu", "--storage-option", "scheme=http"], "storage_options",
                       (("region", "eu"), ("scheme", "http"))),
    "model": ([], "model_dir", "{model}"),
    "query_col": (["--query-col", "q"], "columns.query_col", "q"),
    "item_col": (["--item-col", "i"], "columns.item_col", "i"),
    "items_col": (["--items-col", "ii"], "columns.items_col", "ii"),
    "query_id_col": (["--query-id-col", "qid"], "columns.query_id_col", "qid"),
    "item_id_col": (["--item-id-col", "iid"], "columns.item_id_col", "iid"),
    "keep_columns": (["--keep-columns", "a, b"], "columns.keep_columns", ("a", "b")),
    "input_format": (["--input-format", "table"], "input_format", "table"),
    "hive_types": (["--hive-types", "string"], "hive_types", "string"),
    "partition_by": (["--partition-by", "x,y"], "partition_by", ("x", "y")),
    "label_tokens": (["--label-tokens", " a", "--label-tokens", " b"], "engine.scoring.label_tokens", (" a", " b")),
    "label_token_ids": (["--label-token-ids", "5,7"], "engine.scoring.label_token_ids", (5, 7)),
    "apply_softmax": (["--apply-softmax"], "engine.scoring.apply_softmax", True),
    "activation": (["--activation", "sigmoid"], "engine.scoring.activation", "sigmoid"),
    "label_score": (["--label-score", "logit"], "engine.scoring.label_score", "logit"),
    "score_index": (["--score-index", "0"], "engine.scoring.score_index", 0),
    "pooled_hidden_states": (["--pooled-hidden-states"], "engine.scoring.pooled_hidden_states", True),
    "normalize": (["--normalize"], "engine.scoring.normalize", True),
    "query_template": (["--query-template", "Q: {query}"], "engine.scoring.query_template", "Q: {query}"),
    "item_template": (["--item-template", "I: {item}"], "engine.scoring.item_template", "I: {item}"),
    "item_first": (["--item-first"], "engine.scoring.item_first", True),
    "packing": (["--packing", "single"], "engine.scoring.packing", "single"),
    "delimiter_token_id": (["--delimiter-token-id", "3"], "engine.scoring.delimiter_token_id", 3),
    "max_query_tokens": (["--max-query-tokens", "5"], "engine.scoring.max_query_tokens", 5),
    "max_item_tokens": (["--max-item-tokens", "6"], "engine.scoring.max_item_tokens", 6),
    "truncate": (["--truncate", "item-tail"], "engine.scoring.truncate", "item-tail"),
    "chunk_overlap": (["--truncate", "chunk", "--chunk-overlap", "4"], "engine.scoring.chunk_overlap", 4),
    "chunk_aggregate": (["--truncate", "chunk", "--chunk-aggregate", "mean"], "engine.scoring.chunk_aggregate", "mean"),
    "top_k": (["--top-k", "3"], "top_k", 3),
    "rank": (["--rank"], "rank", True),
    "device": (["--device", "cpu"], "engine.device", "cpu"),
    "dtype": (["--dtype", "float32"], "engine.dtype", "float32"),
    "backend": (["--backend", "sdpa"], "engine.backend", "sdpa"),
    "max_batch_tokens": (["--max-batch-tokens", "100"], "engine.max_batch_tokens", 100),
    "max_pack_tokens": (["--max-pack-tokens", "64"], "engine.max_pack_tokens", 64),
    "trust_remote_code": (["--trust-remote-code"], "engine.trust_remote_code", True),
    "allow_pickle": (["--allow-pickle"], "engine.allow_pickle", True),
    "compile": (["--compile"], "engine.compile", True),
    "layers": (["--layers", "transformers"], "engine.layers", "transformers"),
    "ops": (["--ops", "torch"], "engine.ops", "torch"),
    "verify": (["--verify", "4"], "engine.verify", 4),
    "threads": (["--threads", "2"], "threads", 2),
    "window_rows": (["--window-rows", "7"], "window_rows", 7),
    "on_error": (["--on-error", "record"], "on_error", "record"),
    "errors_file": (["--errors-file", "e.jsonl"], "errors_file", "e.jsonl"),
    "resume": (["--resume"], "resume", True),
    "overwrite": (["--overwrite"], "overwrite", True),
    "report": (["--report", "r.json"], "report", "r.json"),
    "dry_run": (["--dry-run"], "dry_run", True),
    "quiet": (["-q"], "quiet", True),
    "pipeline": (["--no-pipeline"], "pipeline", False),
    "progress_seconds": (["--progress-seconds", "5"], "progress_seconds", 5.0),
    "price_per_hour": (["--price-per-hour", "2.5"], "price_per_hour", 2.5),
    "reuse": (["--reuse", "a.parquet", "--reuse", "s3://b/c"], "reuse", ("a.parquet", "s3://b/c")),
    "reuse_missing_ok": (["--reuse-missing-ok"], "reuse_missing_ok", True),
    "max_failed_rate": (["--max-failed-rate", "0.05"], "max_failed_rate", 0.05),
    "ray": (["--ray"], "ray", RayOptions()),
    "ray_address": (["--ray", "--ray-address", "auto"], "ray.address", "auto"),
    "num_workers": (["--ray", "--num-workers", "2"], "ray.num_workers", 2),
    "gpus_per_worker": (["--ray", "--gpus-per-worker", "0.5"], "ray.gpus_per_worker", 0.5),
    "cpus_per_worker": (["--ray", "--cpus-per-worker", "2"], "ray.cpus_per_worker", 2.0),
}  # fmt: skip


class Captured:
    """A stand-in for job.run: records the RunConfig the command built (no model is loaded)."""

    def __init__(self) -> None:
        self.config: RunConfig | None = None

    def __call__(self, config: RunConfig):
        self.config = config
        return type("Report", (), {"summary": lambda self: "SUMMARY"})()


@pytest.fixture
def captured(monkeypatch) -> Captured:
    capture = Captured()
    monkeypatch.setattr(job, "run", capture)
    return capture


def test_every_option_has_a_mapping_case():
    assert set(CASES) == set(OPTION) - set(CLI_ONLY)


@pytest.mark.parametrize("option", [pytest.param(name, marks=pending(name)) for name in CASES])
def test_each_flag_lands_in_its_config_field(option, captured, qwen3_causal, tmp_path):
    args, where, expected = CASES[option]

    def fill(value):  # {tmp} and {model} in a case's strings
        if isinstance(value, tuple):
            return tuple(fill(v) for v in value)
        return (
            value.replace("{tmp}", str(tmp_path)).replace("{model}", str(qwen3_causal))
            if isinstance(value, str)
            else value
        )

    given_input = [] if option == "input" else [str(write_jsonl(tmp_path / "in.jsonl", ROWS))]
    given_output = [] if option == "output" else ["-o", str(tmp_path / "out.parquet")]
    result = run_cli(*given_input, *given_output, "--model", qwen3_causal, *map(fill, args))
    assert result.returncode == 0, result.stderr
    value = captured.config
    for name in where.split("."):
        value = getattr(value, name)
    expected = fill(expected)
    assert (str(value) if option == "model" else value) == expected


def test_profile_flag_picks_the_profile_and_flags_override_it(captured, qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    result = run_cli(data, "--model", qwen3_causal, "--profile", "yes-no-judge", "--score-index", "0")
    assert result.returncode == 0, result.stderr
    scoring = captured.config.engine.scoring
    assert scoring.label_tokens  # from the profile
    assert scoring.score_index == 0  # the flag wins


# ----------------------------------------------------------------------------- messages in flag words


@pytest.mark.parametrize(
    "setting, value, spelled",
    [
        ("ScoringConfig.truncate", "item-tail", "--truncate item-tail"),
        ("ScoringConfig.label_tokens", (" no", " yes"), "--label-tokens ' no' --label-tokens ' yes'"),
        ("ScoringConfig.label_token_ids", (1, 2), "--label-token-ids 1,2"),
        ("RunConfig.partition_by", ("query_id",), "--partition-by query_id"),
        ("RunConfig.resume", True, "--resume"),
        ("RunConfig.pipeline", False, "--no-pipeline"),
        ("RunConfig.storage_options", (("region", "eu"),), "--storage-option region=eu"),
        ("RunConfig.model_dir", "/models/my model", "--model '/models/my model'"),
        ("RayOptions.address", "auto", "--ray-address auto"),
        ("RunConfig.input", (), "INPUT"),
        ("ColumnOverrides.keep_columns", ("a", "b"), "--keep-columns a,b"),
    ],
)
def test_settings_are_spelled_as_the_flags_that_give_them(setting, value, spelled):
    assert error_messages.as_flags(setting, value) == spelled


@pytest.mark.parametrize(
    "args, message",
    [
        (["--window-rows", "0"], "error: --window-rows 0 must be at least 1"),
        (["--window-rows", "9" * 23], f"error: --window-rows {'9' * 23} must be at most 2147483647"),
        (["--threads", "100000"], "error: --threads 100000 must be at most 1024"),
        (["--price-per-hour", "inf"], "error: --price-per-hour inf must be a finite price >= 0"),
        (["--price-per-hour", "nan"], "error: --price-per-hour nan must be a finite price >= 0"),
        (
            ["-o", "-", "--partition-by", "query_id"],
            "error: --partition-by query_id needs an output directory",
        ),
        (["-o", "-", "--resume"], "error: --resume needs an output file"),
        (
            ["--label-token-ids", "1,x"],
            "error: --label-token-ids 1,x is not a comma-separated list of integers",
        ),
        (["--ray", "--num-workers", "0"], "error: --num-workers 0 must be at least 1"),
    ],
)
def test_config_errors_name_the_flag_and_its_value_without_reprs(
    args, message, captured, qwen3_causal, tmp_path
):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    result = run_cli(data, "--model", qwen3_causal, *args)
    assert result.returncode == 2 and captured.config is None
    assert message in result.stderr
    for python_word in ("Config.", "RayOptions", "=(", "('", "Traceback"):
        assert python_word not in result.stderr


def test_an_engine_setting_error_is_spelled_as_flags(monkeypatch, qwen3_causal, tmp_path):
    def refuse(config):
        raise ConfigError("ScoringConfig.truncate", "item-tail", "does not apply to pairs")

    monkeypatch.setattr(job, "run", refuse)
    result = run_cli(
        write_jsonl(tmp_path / "in.jsonl", ROWS), "--model", qwen3_causal, "-o", tmp_path / "o.jsonl"
    )
    assert result.returncode == 2
    assert "score-batch: error: --truncate item-tail does not apply to pairs" in result.stderr
    assert "ScoringConfig" not in result.stderr


def test_settings_named_in_a_message_are_spelled_as_their_flags():
    text = (
        "turn it off with ScoringConfig.apply_softmax=False, or keep it with ScoringConfig.label_score='probability'"
        "; ScoringConfig.label_tokens=(' no', ' yes'); EngineConfig.dtype; RayOptions.groups_per_batch=3"
    )
    assert error_messages.spell_settings(text) == (
        "turn it off with --no-apply-softmax, or keep it with --label-score probability"
        "; --label-tokens ' no' --label-tokens ' yes'; --dtype; RayOptions.groups_per_batch=3"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (  # the demo profile sets --apply-softmax: the message names the flag that turns it off, and says so
            ["--label-score", "logit"],
            "error: --label-score logit cannot be combined with --apply-softmax (a softmax over the labels' "
            "probabilities): turn that off with --no-apply-softmax, or keep it with --label-score probability "
            "(the profile score_batch.json sets --apply-softmax)",
        ),
        (
            ["--label-tokens", " yes"],
            "give two labels (--label-tokens ' no' --label-tokens ' yes') (the profile",
        ),
        (["--label-tokens", " yes"], "use --no-apply-softmax for the label token's probability"),
        (["--label-score", "logit", "--apply-softmax"], "keep it with --label-score probability\n"),
        (
            ["--label-token-ids", "5,7", "--label-tokens", " yes"],
            "error: --label-token-ids 5,7 is given together with --label-tokens; give labels as strings",
        ),
        (
            ["--truncate", "chunk", "--max-item-tokens", "4", "--chunk-overlap", "4"],
            "error: --chunk-overlap 4 must be smaller than --max-item-tokens (4)",
        ),
    ],
)
def test_messages_name_the_flags_that_fix_them_and_what_the_profile_set(args, message, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    result = run_cli(data, "-o", tmp_path / "o.parquet", "--dry-run", *args)  # the demo model and its profile
    assert result.returncode == 2
    assert message in result.stderr
    error = [line for line in result.stderr.splitlines() if "error:" in line][0]
    for python_word in ("Config.", "apply_softmax", "label_score", "=False", "=True"):
        assert python_word not in error


# ----------------------------------------------------------------------------- -q silences progress only


def test_quiet_keeps_warnings_and_errors_but_drops_progress_and_summary(monkeypatch, qwen3_causal, tmp_path):
    def noisy(config):
        logging.getLogger("score_batch.job.fake").info("progress: 10 rows")
        logging.getLogger("score_batch.job.fake").warning("2 rows skipped (see the errors file)")
        return type("Report", (), {"summary": lambda self: "SUMMARY"})()

    monkeypatch.setattr(job, "run", noisy)
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    loud = run_cli(data, "--model", qwen3_causal, "-o", tmp_path / "o.jsonl")
    quiet = run_cli(data, "--model", qwen3_causal, "-o", tmp_path / "o.jsonl", "-q")
    assert loud.returncode == quiet.returncode == 0
    assert "progress: 10 rows" in loud.stderr and "SUMMARY" in loud.stderr
    assert "2 rows skipped" in quiet.stderr
    assert "progress" not in quiet.stderr and "SUMMARY" not in quiet.stderr


# ----------------------------------------------------------------------------- --report on early failures


class FailureReports:
    """A stand-in for job.report_failure: records (report, error, overwrite)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, BaseException, bool]] = []

    def __call__(self, report: str, error: BaseException, *, overwrite: bool) -> None:
        self.calls.append((report, error, overwrite))


@pytest.fixture
def failure_reports(monkeypatch) -> FailureReports:
    reports = FailureReports()
    monkeypatch.setattr(job, "report_failure", reports, raising=False)
    return reports


def test_a_bad_flag_value_found_while_resolving_still_reports(
    failure_reports, captured, qwen3_causal, tmp_path
):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    result = run_cli(data, "--model", qwen3_causal, "--window-rows", "0", "--report", tmp_path / "r.json")
    assert result.returncode == 2 and captured.config is None
    [(report, error, overwrite)] = failure_reports.calls
    assert report == str(tmp_path / "r.json") and overwrite is False
    assert isinstance(error, ConfigError) and error.setting == "RunConfig.window_rows"


def test_a_missing_model_still_reports(failure_reports, captured, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    result = run_cli(data, "--model", tmp_path / "nope", "--report", tmp_path / "r.json", "--overwrite")
    assert result.returncode == 2 and "does not exist" in result.stderr
    [(_, error, overwrite)] = failure_reports.calls
    assert isinstance(error, UserError) and overwrite is True


@pytest.mark.parametrize("report_from", ["flag", "environment"])
def test_a_bad_choice_refused_while_parsing_still_reports(failure_reports, captured, tmp_path, report_from):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    report = str(tmp_path / "r.json")
    given = ["--report", report] if report_from == "flag" else []
    env = {"SCORE_BATCH_REPORT": report} if report_from == "environment" else None
    result = run_cli(data, "--packing", "pairs", *given, env=env)
    assert result.returncode == 2 and "pairs" in result.stderr and captured.config is None
    [(written, error, overwrite)] = failure_reports.calls
    assert written == report and overwrite is False
    assert isinstance(error, UserError) and "--packing" in str(error) and "pairs" in str(error)


def test_a_malformed_command_line_reports_nothing(failure_reports, tmp_path):
    result = run_cli(tmp_path / "in.jsonl", "--no-such-flag", "--report", tmp_path / "r.json")
    assert result.returncode == 2 and failure_reports.calls == []


def test_a_refused_report_path_is_the_error_shown(monkeypatch, captured, tmp_path):
    def refuse(report, error, *, overwrite):
        raise UserError(f"--report {report}: its directory does not exist")

    monkeypatch.setattr(job, "report_failure", refuse, raising=False)
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    result = run_cli(data, "--window-rows", "0", "--report", tmp_path / "no" / "r.json")
    assert result.returncode == 2
    assert "its directory does not exist" in result.stderr and "Traceback" not in result.stderr


needs_report_failure = pytest.mark.xfail(
    not hasattr(job, "report_failure"), reason="job.report_failure lands with the job branch", strict=False
)


@needs_report_failure
@pytest.mark.parametrize("bad", [["--window-rows", "0"], ["--packing", "pairs"]])
def test_the_report_file_exists_after_an_early_failure(qwen3_causal, tmp_path, bad):
    report = tmp_path / "r.json"
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    result = run_cli(data, "--model", qwen3_causal, "-o", tmp_path / "o.parquet", "--report", report, *bad)
    assert result.returncode == 2
    assert json.loads(report.read_text())  # a JSON report saying how the run ended


# ----------------------------------------------------------------------------- run-batch -i IN -o OUT


BATCH = [
    {"custom_id": "s", "method": "POST", "url": "/v1/score",
     "body": {"model": "m", "text_1": ROWS[0]["query"], "text_2": [ROWS[0]["item"], ROWS[2]["item"]]}},
    {"custom_id": "r", "method": "POST", "url": "/v1/rerank",
     "body": {"model": "m", "query": ROWS[1]["query"], "documents": [ROWS[1]["item"], ROWS[3]["item"]]}},
]  # fmt: skip


def responses(text: str) -> dict:
    """Batch output lines by custom_id, without what differs between runs (the line's id, the time)."""
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        line.pop("id")
        line["response"]["body"].pop("created", None)
    return {line["custom_id"]: line for line in lines}


def test_run_batch_spelling_equals_the_batch_file_mode_and_the_reference(qwen3_causal, tmp_path):
    src = write_jsonl(tmp_path / "requests.jsonl", BATCH)
    model = ["--model", qwen3_causal, *LABEL_FLAGS]
    vllm = run_cli("run-batch", "-i", src, "-o", tmp_path / "a.jsonl", *model)
    ours = run_cli(src, "-o", tmp_path / "b.jsonl", "--input-format", "openai-batch", *model)
    piped = run_cli(
        "run-batch", "--input-file", "-", "--output-file", "-", *model, "-q", stdin=src.read_text()
    )
    assert vllm.returncode == ours.returncode == piped.returncode == 0, (
        vllm.stderr + ours.stderr + piped.stderr
    )
    by_id = responses((tmp_path / "a.jsonl").read_text())
    assert by_id == responses((tmp_path / "b.jsonl").read_text()) == responses(piped.stdout)

    tok = tokenizer(str(qwen3_causal))
    labels = [tok.encode(t, add_special_tokens=False)[0] for t in (" to", " the")]

    def reference(query: str, item: str) -> float:  # score = the last label's probability (score_index -1)
        return reference_scores(
            qwen3_causal, "causal", reference_sequence(qwen3_causal, query, item), labels
        )[0][-1]

    scored = [d["score"] for d in by_id["s"]["response"]["body"]["data"]]
    assert max_abs_diff(scored, [reference(ROWS[0]["query"], ROWS[i]["item"]) for i in (0, 2)]) <= 1e-4
    ranked = {r["index"]: r["relevance_score"] for r in by_id["r"]["response"]["body"]["results"]}
    expected = [reference(ROWS[1]["query"], ROWS[i]["item"]) for i in (1, 3)]
    assert max_abs_diff([ranked[0], ranked[1]], expected) <= 1e-4


@pytest.mark.parametrize(
    "args, message",
    [
        (["-o", "out.jsonl"], "--input-file"),  # -i is required
        (["-i", "requests.jsonl"], "--output"),  # -o is required
        (["-i", "requests.jsonl", "-o", "out.jsonl", "--input-format", "table"], "--input-format"),
    ],
)
def test_run_batch_usage_errors(args, message, tmp_path):
    result = run_cli("run-batch", *args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr


def test_run_batch_takes_the_same_options_as_score():
    score_flags, batch_flags = command_flags("score"), command_flags("run-batch")
    assert score_flags - batch_flags == {"INPUT", "--input-format"}
    assert batch_flags - score_flags == {"-i", "--input-file", "--output-file"}


def test_a_file_named_like_the_command_is_still_an_input(tmp_path):
    # `score-batch run-batch` is the command; a file of that name is given as ./run-batch
    result = run_cli("./run-batch", "-o", tmp_path / "o.jsonl", cwd=tmp_path)
    assert result.returncode == 2 and "does not exist" in result.stderr


@pytest.mark.parametrize("columns", [80, 119, 120, 200])
@pytest.mark.parametrize("name", ["score", "run-batch"])
def test_help_shows_every_flag_whole_at_any_width(name, columns):
    """Rich's own option table cuts flags short at 80 columns (--delimiter-token-id, --trust-remote-code, …);
    cli/help.py's panels keep every flag whole at any width, with rich's markup rendered (the environment
    variables are one SCORE_BATCH_<OPTION> sentence above the panels, not one per flag)."""
    import os
    import subprocess
    import sys

    command = typer.main.get_command(app).commands[name]
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    shown = subprocess.run(
        [sys.executable, "-m", "score_batch.cli.main", name, "--help"],
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    words = set(shown.replace(",", " ").replace("[", " ").replace("]", " ").replace(";", " ").split())
    for param in command.params:
        for flag in (*param.opts, *param.secondary_opts):
            assert flag in words or not flag.startswith("-"), (flag, columns)
    assert "[bold]" not in shown and "\\[" not in shown


@pytest.mark.parametrize("flag", [["--chunk-overlap", "4"], ["--chunk-aggregate", "mean"]])
def test_chunk_flags_without_truncate_chunk_are_refused(qwen3_causal, tmp_path, flag):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    base = [data, "-o", tmp_path / "o.parquet", "--model", qwen3_causal, *LABEL_FLAGS, "--dry-run"]
    for truncate in ([], ["--truncate", "item-tail"]):
        refused = run_cli(*base, *truncate, *flag)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1, refused.stderr
        assert lines[0].startswith(f"score-batch: error: {' '.join(flag)} applies only with --truncate chunk")
    chunked = run_cli(*base, "--truncate", "chunk", "--max-item-tokens", "8", *flag)
    assert chunked.returncode == 0, chunked.stderr


# ----------------------------------------------------------------------------- the docs' flag table


def test_the_docs_flag_table_is_made_from_the_options():
    spec = importlib.util.spec_from_file_location("flag_table", ROOT / "scripts" / "flag_table.py")
    made = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(made)
    doc = (ROOT / "docs" / "flags.md").read_text(encoding="utf-8")
    assert made.table() in doc, (
        "docs/flags.md's flag table is stale: run python scripts/flag_table.py --write"
    )
    rows = made.table().splitlines()
    for option in OPTIONS:  # every option has a row, with its variable (the argument has none)
        row = next(row for row in rows if option.flag in re.split(r"[`, .]+", row.split(" | ")[0]))
        assert option.argument or f"`{option.env}`" in row, option.name


def test_every_flag_the_docs_name_exists():
    text = (ROOT / "docs" / "flags.md").read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w/-])--[a-z][a-z-]*[a-z]", text))
    known = command_flags("score") | command_flags("run-batch")
    assert named - known - {"--help", "--install-completion", "--version", "--write"} == set()
