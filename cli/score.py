"""The `score` and `run-batch` commands: their options resolved into one RunConfig, by name (no business logic).

Only typer and torch-free project modules are imported here at the top; the job, the engine and the
readers are imported when a command runs, so `--help` and `--version` start in a fraction of a second.
"""

from __future__ import annotations

import difflib
import logging
import os

from score_batch.cli.command import write_failure_report
from score_batch.cli.error_messages import profile_noted, spell_settings
from score_batch.cli.logs import ROOT_LOGGER, quiet_libraries, say, setup_logging
from score_batch.cli.options import ENV_PREFIX, OPTIONS, RANKED_OUTPUT_REMOVED, ScoreOptions
from score_batch.errors import ConfigError, UserError
from score_batch.signals import Stopped

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
# SCORE_BATCH_* names that are no option but are read by the GPU check's tests and bench (bench/gpu_check.sh),
# and the model file digests' cache (job/checkpoint/model_digest.CACHE_VARIABLE).
TOOLING_VARIABLES = ("SCORE_BATCH_NO_FA3", "SCORE_BATCH_REQUIRE_GPU", "SCORE_BATCH_CACHE_DIR")


def warn_unknown_variables(environ) -> list[str]:
    """Log one warning per SCORE_BATCH_* environment variable no option reads (a typo is otherwise silent)."""
    known = {option.env for option in OPTIONS} | set(TOOLING_VARIABLES)
    unknown = sorted(name for name in environ if name.startswith(ENV_PREFIX + "_") and name not in known)
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        log.warning("environment variable %s is not an option of score-batch and is ignored%s", name, hint)
    return unknown


# Loggers whose lines name settings the command line spells as its flags (the scored text's line)
SPELLED_LOGGERS = ("score_batch.engine.model.scored_text",)


def spelled_as_flags(record: logging.LogRecord) -> bool:
    """A logging filter: the settings a SPELLED_LOGGERS line names, as the flags that give them
    (ScoringConfig.query_template → --query-template)."""
    if record.name in SPELLED_LOGGERS:
        record.msg, record.args = spell_settings(record.getMessage()), ()
    return True


def score(options: ScoreOptions) -> None:
    """Run one job from the command's options; under --quiet, no summary."""
    setup_logging(options.quiet, options.log_format)
    for handler in logging.getLogger(ROOT_LOGGER).handlers:
        handler.addFilter(spelled_as_flags)
    warn_unknown_variables(os.environ)
    profile = None
    try:
        from score_batch import job  # here: --help and --version import no torch

        config, profile = run_config(options)
        quiet_libraries()
        from score_batch.machine import tune_gc, tune_malloc

        tune_malloc(os.environ)
        tune_gc()
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
    from score_batch import demo_model_path
    from score_batch.engine.config import EngineConfig
    from score_batch.engine.model.profiles import choose_profile, scoring_config
    from score_batch.engine.model.source import hub_id_of, resolve_model_dir
    from score_batch.io_formats.schema import ColumnOverrides
    from score_batch.job.run_config import RayOptions, RunConfig

    if options.ranked_output is not None:
        raise UserError(RANKED_OUTPUT_REMOVED)
    model_dir = resolve_model_dir(options.model or demo_model_path())  # resolved once: the run loads this
    name = hub_id_of(model_dir) or options.model or ""  # an HF-cache snapshot directory: its hub id
    profile = choose_profile(options.profile, name, model_dir)
    if profile is not None:
        log.info("scoring profile: %s (%s)", profile.name, profile.source)
    try:  # an option left None: the profile's value
        scoring = scoring_config(profile, from_options(options, "ScoringConfig"))
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
    built = dict(  # what the options' values do not give as they are
        model_dir=model_dir,
        columns=ColumnOverrides(**from_options(options, "ColumnOverrides")),
        engine=EngineConfig(**from_options(options, "EngineConfig"), scoring=scoring),
        ray=RayOptions(**from_options(options, "RayOptions")) if options.ray else None,
    )
    config = RunConfig(**{**from_options(options, "RunConfig"), **built})
    return config, profile


def from_options(options: ScoreOptions, owner: str) -> dict:
    """The fields of config class owner (RunConfig, …) that options set (cli/options.py), each value converted
    to the field's type; a field no option sets keeps its default (FLAGLESS lists them)."""
    return {
        option.setting.partition(".")[2]: option.convert(value) if option.convert else value
        for option in OPTIONS
        if option.sets and option.sets.partition(".")[0] == owner
        for value in (getattr(options, option.name),)
    }
