"""Rules shared by local and Ray runs: the destination guard, the errors sink, on-error, publishing."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pyarrow as pa

from io_formats.errors import InputError
from io_formats.parts import PartStore
from io_formats.writers import durable_replace, exclusive_temp, fsync_directory
from job.config import STDOUT, RunConfig
from job.contract import OutputContract
from job.lock import lock_path
from job.paths import check_collisions

log = logging.getLogger(__name__)
KEEP_GOING = "(use --on-error record or skip to keep going)"


def check_destination(config: RunConfig, directory: bool) -> Path | None:
    """Refuse an output we may not create or replace; None for stdout. directory: a Ray run's output."""
    if config.output == STDOUT:
        if directory:
            raise InputError("--ray writes a directory of Parquet files; give -o OUTPUT_DIR, not -")
        return None
    destination = Path(config.output)
    if not destination.parent.is_dir():
        raise InputError(f"output directory {str(destination.parent)!r} does not exist")
    if destination.is_dir() and not directory:
        raise InputError(f"output {config.output!r} is a directory; give a .parquet or .jsonl file path")
    if destination.exists() and not destination.is_dir() and directory:
        raise InputError(f"output {config.output!r} is a file; --ray writes a directory of Parquet files")
    if destination.exists() and not config.overwrite:
        raise InputError(f"output {config.output!r} already exists; pass --overwrite to replace it")
    return destination


def check_run_paths(config: RunConfig, input_files: tuple[Path, ...], destination: Path | None) -> None:
    """Before any work: no written path may touch a read path or another written path; report writable."""
    reads: dict[str, Path] = {f"input file {i}": path for i, path in enumerate(input_files)}
    if config.input != STDOUT and Path(config.input).is_dir():
        reads["input directory"] = Path(config.input)
    reads["model directory"] = Path(config.model_dir)
    writes: dict[str, Path] = {}
    if destination is not None:
        writes["output"] = destination
        writes["checkpoint directory"] = PartStore(destination).dir
        writes["lock file"] = lock_path(destination)
    errors = errors_path(config)
    if errors is not None:
        writes["errors file"] = errors
    report = report_path(config)
    if report is not None:
        writes["report"] = report
    check_collisions(writes, reads)
    if "errors file" in writes:
        _check_writable("errors file", writes["errors file"], config.overwrite)


def check_report_path(config: RunConfig) -> None:
    """The report must be writable; an existing one is replaced only by --overwrite, --resume or a retry."""
    report = report_path(config)
    if report is not None:
        replaceable = config.overwrite or config.resume or _failed_report(report)
        _check_writable("report", report, replaceable)


def _failed_report(path: Path) -> bool:
    """True when path holds the report of a run that did not succeed."""
    try:
        return json.loads(path.read_text()).get("status") != "succeeded"
    except (OSError, ValueError, AttributeError):
        return False


def _check_writable(name: str, path: Path, replaceable: bool) -> None:
    """A side file (errors file, report) must be creatable now, and replaced only when allowed."""
    if path.is_dir():
        raise InputError(f"{name} {str(path)!r} is a directory; give a file path")
    if not path.parent.is_dir():
        raise InputError(f"{name} directory {str(path.parent)!r} does not exist")
    if path.exists() and not replaceable:
        raise InputError(f"{name} {str(path)!r} already exists; pass --overwrite to replace it")
    probe = exclusive_temp(path)  # proves the directory takes new files before hours of scoring
    probe.unlink()


def report_path(config: RunConfig) -> Path | None:
    """Where the JSON report goes (None: no report, or stderr for -)."""
    return Path(config.report) if config.report and config.report != STDOUT else None


def errors_path(config: RunConfig) -> Path | None:
    """Where --on-error skip lists skipped rows: --errors-file, else OUTPUT.errors.jsonl (stdout: the log)."""
    if config.on_error != "skip" or config.dry_run:
        return None
    if config.errors_file:
        return Path(config.errors_file)
    return None if config.output == STDOUT else default_errors_path(Path(config.output))


def default_errors_path(destination: Path) -> Path:
    """OUTPUT.errors.jsonl: where skipped rows go unless --errors-file says otherwise."""
    return destination.with_name(f"{destination.name}.errors.jsonl")


def enforce_fail(contract: OutputContract, part: pa.Table, label: str) -> None:
    """Under on_error=fail, a failed row stops the run with its message."""
    if contract.on_error == "fail":
        error = contract.first_error(part)
        if error is not None:
            raise InputError(f"{label}: {error} {KEEP_GOING}")


class ErrorsSink:
    """Skipped rows: JSONL lines in a temporary file published beside the output, or warnings in the log."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.count = 0
        self._tmp: Path | None = None
        self._handle = None

    def write(self, failed: pa.Table) -> None:
        """Record failed rows (a part-schema table)."""
        if failed.num_rows == 0:
            return
        self.count += failed.num_rows
        lines = OutputContract.error_lines(failed)
        if self.path is None:
            for line in lines:
                log.warning("skipped %s", line.rstrip())
            return
        if self._handle is None:
            self._tmp = exclusive_temp(self.path)
            self._handle = open(self._tmp, "w", encoding="utf-8")
        self._handle.writelines(lines)

    def commit(self) -> None:
        """Publish the list (or remove an earlier run's list when nothing was skipped this time)."""
        if self.path is None:
            return
        if self._handle is None:
            self.path.unlink(missing_ok=True)
            return
        self._handle.close()
        self._handle = None
        durable_replace(self._tmp, self.path)
        log.warning("skipped rows are listed in %s", self.path)

    def abort(self) -> None:
        """Drop the unpublished list."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def remove_leftovers(*paths: Path | None) -> None:
    """Delete temporary files an interrupted run left beside these paths (the caller holds the output's lock)."""
    for path in paths:
        if path is None:
            continue
        for leftover in path.parent.glob(f".{path.name}.tmp-*"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
            log.info("removed %s, left by an interrupted run", leftover)


def publish_directory(staging: Path, destination: Path) -> None:
    """Move a finished staging directory to the destination, replacing an old one (already allowed)."""
    if destination.exists():
        old = exclusive_temp(destination, directory=True)
        os.rmdir(old)
        destination.rename(old)
        staging.rename(destination)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(destination)
    fsync_directory(destination.parent)
