"""The `score` and `run-batch` commands: their options resolved into one RunConfig, by name (no business logic).

Only typer and torch-free project modules are imported here at the top; the job, the engine and the
readers are imported when a command runs, so `--help` and `--version` start in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os

from score_batch.cli.command import ENV_PREFIX, write_failure_report
from score_batch.cli.flags import NESTED, as_flags, comma_ints, comma_list, option_of
from score_batch.cli.logs import quiet_libraries, say, setup_logging
from score_batch.cli.options import ScoreOptions
from score_batch.errors import ConfigError
from score_batch.signals import Stopped, StopSignals

log = logging.getLogger(__name__)

HELP = (
    "Score every (query, item) pair of INPUT with a local Hugging Face model and write one score per pair.\n\n"
    "Each query is packed with all of its items into one sequence (multi-item scoring), so the query is "
    "computed once; every score equals a separate query+item forward pass. Every option can also be set "
    "as SCORE_BATCH_<OPTION> (SCORE_BATCH_ON_ERROR=record); flags win.\n\n"
    "[bold]Examples[/bold]\n\n"
    "  score-batch sample_data/products.parquet -o scores.parquet  [dim]# demo model[/dim]\n\n"
    "  cat pairs.jsonl | score-batch - -o - --model ./my-reranker \\\n"
    "      --label-tokens ' no' --label-tokens ' yes'\n\n"
    "  score-batch big/ -o out.parquet --model ./rm --resume --on-error record \\\n"
    "      --max-failed-rate 0.01 --report run.json\n\n"
    "  score-batch data.parquet -o out.parquet --model Qwen/Qwen3-Reranker-0.6B\n"
    "      [dim]# a hub id from the HF cache, with its built-in profile[/dim]\n\n"
    "  score-batch models  [dim]# supported models, packing, built-in profiles[/dim]"
)
RUN_BATCH_HELP = (
    "Score a batch file of /v1/score and /v1/rerank requests (the `vllm run-batch` spelling): one response "
    "line per request, as `score-batch IN -o OUT --input-format openai-batch`.\n\n"
    "It takes score's options (but --input-format); each can also be set as SCORE_BATCH_<OPTION>.\n\n"
    "[bold]Example[/bold]\n\n"
    "  score-batch run-batch -i requests.jsonl -o results.jsonl \\\n"
    "      --model BAAI/bge-reranker-base"
)
BUILT = ("RunConfig.model_dir", "RunConfig.ray")  # resolved by run_config, not copied from their option
RUN_BATCH_FIXED = {"input_format": "openai-batch"}  # what run-batch means, so it takes no --input-format


# SCORE_BATCH_* names that are no option but are read by the GPU check's tests and bench (bench/gpu_check.sh),
# and the model file digests' cache (engine/model/digest.CACHE_VARIABLE).
TOOLING_VARIABLES = ("SCORE_BATCH_NO_FA3", "SCORE_BATCH_REQUIRE_GPU", "SCORE_BATCH_CACHE_DIR")


def warn_unknown_variables(environ, options: type = ScoreOptions) -> list[str]:
    """Log one warning per SCORE_BATCH_* environment variable no option reads (a typo is otherwise silent)."""
    known = {f"{ENV_PREFIX}_{f.name.upper()}" for f in dataclasses.fields(options)} | set(TOOLING_VARIABLES)
    unknown = sorted(name for name in environ if name.startswith(ENV_PREFIX + "_") and name not in known)
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        log.warning("environment variable %s is not an option of score-batch and is ignored%s", name, hint)
    return unknown


def score(options: ScoreOptions) -> None:
    """Run one job from the command's options; under --quiet, no summary."""
    setup_logging(options.quiet, options.log_format)
    warn_unknown_variables(os.environ, type(options))
    profile = None
    try:
        config, profile = run_config(options)
        quiet_libraries()
        # Here: --help and --version import no torch. A stop waits for the import: one raised inside it left the
        # job package half-imported, and the report it writes could not be imported again (no --report).
        with StopSignals() as deferred:
            from score_batch import job
        deferred.check()
        from score_batch.arrays import pyarrow_without_pandas
        from score_batch.machine import tune_gc, tune_malloc

        tune_malloc(os.environ)
        tune_gc()
        pyarrow_without_pandas()
    except (Exception, Stopped) as error:
        # A bad flag value, model or profile, or a signal while importing: the report still says why.
        if options.report:
            write_failure_report(options.report, error, overwrite=options.overwrite)
        raise
    try:
        report = job.run(config)
    except ConfigError as error:
        raise profile_noted(error, options, profile) from None
    if not options.quiet:
        say(report.summary().removeprefix("score-batch: "), None)


def run_config(options: ScoreOptions):
    """Resolve one invocation's options into a RunConfig (model, profile, engine, columns, job), and the
    scoring profile applied (or None)."""
    from score_batch.demo import demo_model_path
    from score_batch.engine.config import EngineConfig, ScoringConfig
    from score_batch.engine.model.profiles import choose_profile, scoring_config
    from score_batch.engine.model.source import hub_id_of, resolve_model_dir
    from score_batch.io_formats.schema import ColumnOverrides
    from score_batch.job.run_config import RayOptions, RunConfig

    model_dir = resolve_model_dir(options.model or demo_model_path())  # resolved once: the run loads this
    name = hub_id_of(model_dir) or options.model or ""  # an HF-cache snapshot directory: its hub id
    profile = choose_profile(options.profile, name, model_dir)
    if profile is not None:
        log.info("scoring profile: %s (%s)", profile.name, profile.source)
    try:  # an option left None: the profile's value
        scoring = scoring_config(profile, from_options(options, ScoringConfig))
    except ConfigError as error:
        raise profile_noted(error, options, profile) from None
    for name in ("chunk_overlap", "chunk_aggregate"):  # a flag that would do nothing is refused, not ignored
        if getattr(options, name) is not None and scoring.truncate != "chunk":
            raise ConfigError(
                f"ScoringConfig.{name}",
                getattr(options, name),
                f"applies only with --truncate chunk (the truncation is {scoring.truncate}): add --truncate "
                "chunk or leave it out",
            )
    config = RunConfig(
        **from_options(options, RunConfig, built=BUILT),
        model_dir=model_dir,
        columns=ColumnOverrides(**from_options(options, ColumnOverrides)),
        engine=EngineConfig(**from_options(options, EngineConfig), scoring=scoring),
        ray=RayOptions(**from_options(options, RayOptions)) if options.ray else None,
    )
    return config, profile


def profile_noted(error: ConfigError, options: ScoreOptions, profile) -> ConfigError:
    """error, saying which of its scoring settings (the refused one and those it conflicts with) the profile
    set and no flag did: the flag to give is then the one that overrides the profile's."""
    if profile is None:
        return error
    from_profile = [
        setting
        for setting in (error.setting, *error.conflicts)
        if setting.startswith("ScoringConfig.")
        and (name := setting.partition(".")[2]) in profile.settings
        and getattr(options, option_of(setting) or name, None) is None
    ]
    if not from_profile:
        return error
    spelled = " and ".join(as_flags(s, profile.settings[s.partition(".")[2]]) for s in from_profile)
    problem = f"{error.problem} (the profile {profile.name} sets {spelled})"
    return type(error)(error.setting, error.value, problem, error.conflicts)


def from_options(options: ScoreOptions, config: type, built: tuple[str, ...] = ()) -> dict:
    """The fields of a config class that an option sets, by name (cli/flags.py), converted where the flag's
    spelling differs from the field's type; nested configs and `built` fields are left to the caller, and a
    field no flag sets keeps its default (tests/test_cli_options.py lists every such field)."""
    values = {}
    for field in dataclasses.fields(config):
        setting = f"{config.__name__}.{field.name}"
        option = option_of(setting)
        if option is None or setting in NESTED or setting in built:
            continue
        value = getattr(options, option)
        values[field.name] = CONVERT[option](value) if option in CONVERT else value
    return values


def _inputs(arguments: list[str] | str) -> str | tuple[str, ...]:
    """INPUT arguments (each may list several, comma-separated) → RunConfig.input."""
    from score_batch.io_formats.locations import split_inputs

    inputs = split_inputs(arguments)
    return inputs[0] if len(inputs) == 1 else inputs


def _storage_options(pairs: list[str] | None) -> tuple[tuple[str, str], ...]:
    """--storage-option key=value … → RunConfig.storage_options."""
    from score_batch.io_formats.locations import parse_storage_options

    return parse_storage_options(pairs)


CONVERT = {  # options whose command-line spelling differs from the config field's type
    "input": _inputs,
    "storage_option": _storage_options,
    "keep_columns": comma_list,
    "partition_by": comma_list,
    "reuse": lambda paths: tuple(paths) if paths else (),
    "label_tokens": lambda tokens: tuple(tokens) if tokens else None,
    "label_token_ids": lambda ids: comma_ints(ids, "ScoringConfig.label_token_ids"),
}
