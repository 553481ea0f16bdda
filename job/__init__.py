"""The batch job around the engine: read windows, score, write through one output contract, report.

`run(config)` is the one entry point; a local run and a Ray run differ only in where windows come
from and who scores them. Imports engine and io_formats, never the CLI.
"""

from io_formats.readers import open_source
from job.config import RayOptions, RunConfig
from job.policy import check_destination, check_report_path, check_run_paths
from job.report import RunReport, settings_of, versions
from job.signals import Stopped


def run(config: RunConfig) -> RunReport:
    """Run one job (locally, or on Ray when config.ray is set); the report is written however it ends."""
    if config.ray is not None:
        from job.ray_run import check_ray_run
        from job.ray_run import run_ray as run_job

        check_ray_run(config)
    else:
        from job.local import run_local as run_job
    # Every path is checked before the report can be written, so a report never replaces a file it must not.
    check_report_path(config)
    source = open_source(config.input)
    try:
        destination = check_destination(config, directory=config.ray is not None)
        check_run_paths(config, source.files, destination)
        report = RunReport(dry_run=config.dry_run, settings=settings_of(config), versions=versions())
        try:
            run_job(config, source, destination, report)
        except BaseException as error:
            report.end(error)
            _write_report(config, report)
            raise
    finally:
        source.close()
    report.end(None)
    _write_report(config, report)
    return report


def _write_report(config: RunConfig, report: RunReport) -> None:
    """Write the report where --report says (nothing when it says nothing)."""
    if config.report:
        report.write(config.report)


__all__ = ["RayOptions", "RunConfig", "RunReport", "Stopped", "run"]
