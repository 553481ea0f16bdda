"""The rules every runner shares: on-error fail, the failure threshold and its warning, leftovers (preflight,
with the destination guard, is job/preflight/checks)."""

from __future__ import annotations

import logging

import pyarrow as pa

from score_batch.errors import TooManyFailed
from score_batch.io_formats.columns import ERROR
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location
from score_batch.io_formats.writers import STDOUT
from score_batch.job.preflight.contract import OutputContract
from score_batch.job.report import RunReport
from score_batch.job.run_config import RunConfig

log = logging.getLogger(__name__)
KEEP_GOING = "(use --on-error record or skip to keep going)"


def enforce_fail(contract: OutputContract, part: pa.Table, label: str) -> None:
    """Under on_error=fail, a failed row stops the run with its message."""
    errors = part[ERROR].drop_null() if contract.on_error == "fail" else ()
    if len(errors):
        raise InputError(f"{label}: {errors[0].as_py()} {KEEP_GOING}")


def enforce_failed_rate(report: RunReport, config: RunConfig) -> None:
    """TooManyFailed (exit 4) when more items (a batch file's: requests) failed than --max-failed-rate allows
    (without it: all of them)."""
    done, failed, unit = report.items, report.items_failed, "items"
    if report.requests:
        done, failed, unit = report.requests, report.requests_failed, "requests"
    rate = config.max_failed_rate
    if not done or not failed or (failed / done <= rate if rate is not None else failed < done):
        return
    if rate is None:
        said = f"all {done} {unit} failed (--max-failed-rate sets the share a run may fail)"
    else:
        said = f"{failed} of {done} {unit} failed ({failed / done:.1%}), more than --max-failed-rate {rate:g} allows"
    if config.dry_run:
        where = "a dry run: nothing was written"
    elif config.on_error == "skip" and not report.requests:
        where = "the output holds the rest, the errors file lists the failed ones"
    else:
        where = f"{'the output' if config.output == STDOUT else repr(config.output)} is written, with their errors"
    raise TooManyFailed(f"{said}; {where}")


def remove_leftovers(*paths: Location | None) -> None:
    """Delete temporary files an interrupted run left beside these paths (the caller holds the output's lock)."""
    for path in paths:
        for leftover in path.remove_leftovers() if path is not None else ():
            log.info("removed %s, left by an interrupted run", leftover)


def warn_failed_items(report: RunReport, config: RunConfig, errors: Location | None) -> None:
    """Warn how many items failed and where they went (errors: RunPaths.errors), --quiet or not; batch files'
    runner warns of its own."""
    if not report.items_failed or report.requests:
        return
    count = f"{report.items_failed} of {report.items} items"
    if config.dry_run:
        message = f"dry run: {count} would fail (--on-error {config.on_error})"
    elif config.on_error == "skip":  # no errors file (-o - without --errors-file): the log lists them
        logged = "the log above, one line each (pass --errors-file to keep them in a file)"
        where = logged if errors is None else errors.uri
        message = f"{count} failed and were left out of the output; they are listed in {where}"
    else:
        output = "the output" if config.output == STDOUT else config.output
        message = f"{count} failed; their rows in {output} carry the error"
    logging.getLogger("score_batch.job.progress").warning("%s", message)  # fixed name: test_log_names
