"""The batch job around the engine: read windows, score, write through one output contract, report.

`run(config)` is the one entry point; a local run and a Ray run differ only in where windows come
from and who scores them. Imports engine and io_formats, never the CLI.
"""

from job.config import RayOptions, RunConfig
from job.report import RunReport
from job.signals import Stopped


def run(config: RunConfig) -> RunReport:
    """Run one job (locally, or on Ray when config.ray is set) and return its report."""
    if config.ray is not None:
        from job.ray_run import run_ray as run_job
    else:
        from job.local import run_local as run_job
    report = run_job(config)
    if config.report:
        report.write(config.report)
    return report


__all__ = ["RayOptions", "RunConfig", "RunReport", "Stopped", "run"]
