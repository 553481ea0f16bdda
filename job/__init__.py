"""The batch job around the engine: read windows, score, write through one output contract, report.

`run(config)` is the one entry point; a local run and a Ray run differ only in where windows come
from and who scores them. Imports engine and io_formats, never the CLI.
"""

import torch
from score_batch.io_formats.readers import open_source
from score_batch.job.config import RayOptions, RunConfig
from score_batch.job.contract import check_kept_columns
from score_batch.job.policy import check_destination, check_report_path, check_run_paths
from score_batch.job.progress import warn_failed_items
from score_batch.job.report import RunReport, settings_of, versions
from score_batch.job.resources import available_cpus
from score_batch.job.signals import Stopped


def run(config: RunConfig) -> RunReport:
    """Run one job (locally, on Ray, or an OpenAI-style batch file); the report is written however it ends."""
    torch.set_num_threads(config.threads or available_cpus())
    # Every path is checked before the report can be written, so a report never replaces a file it must not.
    check_report_path(config)
    ranked, pooled = config.rank or config.top_k is not None, bool(config.engine.scoring.pooled_hidden_states)
    check_kept_columns(config.columns.keep_columns, ranked=ranked, pooled=pooled)  # before any model load
    source = open_source(config.inputs, config.storage_options, config.hive_types)
    try:
        from score_batch.job.openai_batch import is_openai_batch, run_openai_batch

        batch_file = is_openai_batch(config.input_format, source)  # stdin: sniffed on its spool
        if not batch_file and config.ray is not None:
            from score_batch.job.ray_run import check_ray_run
            from score_batch.job.ray_run import run_ray as run_job

            check_ray_run(config)
        elif not batch_file:
            from score_batch.job.local import run_local as run_job
        destination = check_destination(config, directory=config.ray is not None and not batch_file)
        check_run_paths(config, source.files, destination, source.directories)
        if batch_file:
            return _run_reported(
                config, lambda report: run_openai_batch(config, report, source), batch_file=True
            )
        return _run_reported(config, lambda report: run_job(config, source, destination, report))
    finally:
        source.close()


def _run_reported(config: RunConfig, work, batch_file: bool = False) -> RunReport:
    """Run work(report) with the report written however it ends; warn when items failed."""
    report = RunReport(dry_run=config.dry_run, settings=settings_of(config), versions=versions())
    try:
        work(report)
    except BaseException as error:
        report.end(error)
        _write_report(config, report)
        raise
    report.end(None)
    _write_report(config, report)
    warn_failed_items(report, config, batch_file)
    return report


def _write_report(config: RunConfig, report: RunReport) -> None:
    """Write the report where --report says (nothing when it says nothing)."""
    if config.report:
        report.write(config.report)


__all__ = ["RayOptions", "RunConfig", "RunReport", "Stopped", "run"]
