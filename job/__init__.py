"""The batch job around the engine: `run(config)`, the one entry point and run loop (never imports the CLI).

--report checked and replaced by a "running" report → the runner resolved (local, Ray, batch file) → preflight (no weights: paths, inputs,
columns) → the run's identity and OUTPUT.lock (a --resume on an output completed with the same identity and
input ends here) → leftovers removed → score and publish → the report, written however the run ends.
"""

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Literal, NamedTuple

from score_batch.io_formats.listing import FileFormat
from score_batch.io_formats.readers import input_format, open_source
from score_batch.job.checkpoint.identity import RunIdentity
from score_batch.job.policy import enforce_failed_rate, remove_leftovers, warn_failed_items
from score_batch.job.preflight.contract import check_kept_columns
from score_batch.job.preflight.paths import OutputLock, check_report_path
from score_batch.job.report import RunReport, report_failure, settings_of, versions
from score_batch.job.run_config import RayOptions, RunConfig
from score_batch.machine import available_cpus
from score_batch.signals import Stopped, StopSignals

log = logging.getLogger(__name__)


class Runner(NamedTuple):
    """Where windows come from and where scoring happens: its preflight and its score-and-publish phase."""

    kind: Literal["local", "ray", "batch-file"]
    preflight: Callable  # (config, source) -> Checked
    score: Callable  # (config, checked, report) -> None: load, score windows, publish


def run(config: RunConfig) -> RunReport:
    """Run one job (locally, on Ray, or an OpenAI-style batch file); the report is written however it ends."""
    check_report_path(config)  # before the report can be written, so it never replaces a file it must not
    report = RunReport(dry_run=config.dry_run, settings=settings_of(config), versions=versions())
    if config.report and config.report != "-":  # replaced whole: a kill -9 leaves "running", never a verdict
        report.write(config.report)
    started = time.perf_counter()
    errors, ended = None, None
    try:
        # Imports, preflight and the model load stop at once; scoring defers to its safe points.
        with StopSignals(immediate=True) as stop:
            # (importing score_batch.job itself, its config, signals and report, costs no torch)
            import torch  # a stop landing inside it is raised once it is imported (score_batch/signals.py)

            report.seconds_import = round(time.perf_counter() - started, 3)
            torch.set_num_threads(config.threads or available_cpus())
            errors = _run_phases(config, report)
            stop.check()  # a stop Python could not raise (in a weakref callback) still ends the run
    except BaseException as error:
        ended = error
        raise
    finally:
        report.seconds_total = round(time.perf_counter() - started, 3)
        report.add_usage(config.price_per_hour)
        if config.dry_run and config.price_per_hour is not None:
            log.info(
                "dry run: no cost is given (nothing ran); usage.planned_tokens is what a run would compute"
            )
        report.end(ended)
        if config.report:
            report.write(config.report)
            if isinstance(ended, Stopped):
                ended.reported = True  # the command line writes no second one
    warn_failed_items(report, config, errors)
    return report


def _run_phases(config: RunConfig, report: RunReport):
    """resolve → preflight → lock → score → publish; the errors file (RunPaths.errors), for the warning."""
    ranked, pooled = config.rank or config.top_k is not None, bool(config.engine.scoring.pooled_hidden_states)
    check_kept_columns(config.columns.keep_columns, ranked=ranked, pooled=pooled, chunked=config.chunked)
    source = open_source(config.inputs, config.storage_options, config.hive_types)
    try:
        kind, preflight, score = _resolve(config, source)
        checked = preflight(config, source)
        # The run's identity (job/checkpoint/identity): the model's content is read here, where a stop ends it
        # at once.
        if kind != "batch-file":
            checked = dataclasses.replace(checked, identity=RunIdentity.of(config))
        with OutputLock(checked.paths.lock) if checked.paths.lock is not None else contextlib.nullcontext():
            if not _already_complete(config, checked, report):
                if checked.paths.lock is not None:  # only the lock's holder may delete temporary files
                    remove_leftovers(*checked.paths.leftovers)
                score(config, checked, report)
        return checked.paths.errors
    finally:
        source.close()


def _resolve(config: RunConfig, source) -> Runner:
    """The runner the config and the input name: an OpenAI-style batch file, Ray, or a local table run."""
    if input_format(source, config.input_format) == FileFormat.OPENAI_BATCH:  # stdin: sniffed on its spool
        # that command's only
        from score_batch.job.runners.batch_file_run import batch_preflight, run_batch_file

        return Runner("batch-file", batch_preflight, run_batch_file)
    if config.ray is not None:
        from score_batch.job.runners.ray_run import check_ray_preflight, run_ray

        return Runner("ray", check_ray_preflight, run_ray)
    from score_batch.job.preflight.checks import preflight
    from score_batch.job.runners.local import run_local

    return Runner("local", preflight, run_local)


def _already_complete(config: RunConfig, checked, report: RunReport) -> bool:
    """True for --resume on an output completed with the same model, settings and input (else InputError)."""
    completion = checked.paths.completion
    if not config.resume or completion is None or not completion.exists():
        return False
    record = completion.check_rerun(config, checked.source, checked.identity)
    report.already_complete = True
    report.items_failed, report.items = record.get("failed", (0, 0))  # its shape: job/checkpoint/record_check
    enforce_failed_rate(report, config)  # a retry of a run over --max-failed-rate fails again
    log.info("%s is already complete (same model, settings and input); nothing to do", config.output)
    return True


__all__ = ["RayOptions", "RunConfig", "RunReport", "Stopped", "report_failure", "run"]
