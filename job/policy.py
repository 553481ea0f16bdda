"""Rules shared by local and Ray runs: the destination guard, the errors sink, on-error, publishing."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
from pyarrow.fs import FileType
from score_batch.io_formats import remote
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location, is_uri, parse_location
from score_batch.io_formats.parts import MANIFEST, PartStore
from score_batch.io_formats.writers import (
    OUTPUT_FORMATS,
    SUCCESS,
    durable_replace,
    exclusive_temp,
    fsync_directory,
    output_format,
)
from score_batch.job.config import STDOUT, RunConfig
from score_batch.job.contract import OutputContract, check_partition_by
from score_batch.job.lock import lock_path
from score_batch.job.paths import check_collisions

log = logging.getLogger(__name__)
KEEP_GOING = "(use --on-error record or skip to keep going)"


def check_destination(config: RunConfig, directory: bool) -> Path | Location | None:
    """Refuse an output we may not create or replace; None for stdout. directory: a Ray run's output.

    A local output is a Path; an object-store output (s3://, gs://) a Location. With --partition-by the
    output is a directory too, and the partition columns must be ids or kept columns.
    """
    partitioned = bool(config.partition_by)
    if partitioned:
        check_partition_by(config.partition_by, config.columns.keep_columns)
    writer = "--partition-by" if partitioned else "--ray"
    if config.output == STDOUT:
        if directory:
            raise InputError(f"{writer} writes a directory of Parquet files; give -o OUTPUT_DIR, not -")
        return None
    if partitioned and Path(config.output.rstrip("/")).suffix.lower() in OUTPUT_FORMATS:
        raise InputError(
            f"output {config.output!r}: --partition-by writes a directory of Parquet files; "
            "give a directory path (without .parquet or .jsonl)"
        )
    location = parse_location(config.output, config.storage_options, write=True)
    if not location.local:
        return _check_remote_destination(config, location, directory)
    directory = directory or partitioned
    destination = Path(location.path) if is_uri(config.output) else Path(config.output)
    if not destination.parent.is_dir():
        raise InputError(f"output directory {str(destination.parent)!r} does not exist")
    if destination.is_dir() and not directory:
        raise InputError(f"output {config.output!r} is a directory; give a .parquet or .jsonl file path")
    if not directory:
        output_format(config.output)  # a .csv output fails here, in a dry run too
    if destination.exists() and not destination.is_dir() and directory:
        raise InputError(f"output {config.output!r} is a file; {writer} writes a directory of Parquet files")
    if destination.exists() and not config.overwrite:
        raise InputError(f"output {config.output!r} already exists; pass --overwrite to replace it")
    if directory and destination.is_dir():  # a Ray or partitioned output replaces only a dataset
        _check_replaceable_dataset(config.output, [p.name for p in destination.iterdir()])
    return destination


def _check_replaceable_dataset(output: str, names: list[str]) -> None:
    """--overwrite replaces a directory only when it is empty or a finished dataset (it holds _SUCCESS)."""
    if names and SUCCESS not in names:
        raise InputError(
            f"output {output!r} is a directory without a {SUCCESS} marker, so not a dataset this tool "
            "wrote; --overwrite will not delete it: remove it yourself or choose another path"
        )


def _check_remote_destination(config: RunConfig, location: Location, directory: bool) -> Location:
    """The object-store version of the destination checks (the bucket must exist; a directory only for a
    Ray run or --partition-by)."""
    partitioned = bool(config.partition_by)
    dataset = directory or partitioned
    writer = "--partition-by" if partitioned else "--ray"
    bucket = location.path.split("/", 1)[0]
    if "/" not in location.path.strip("/"):
        raise InputError(
            f"output {location.uri!r}: give a path inside the bucket ({location.scheme}://BUCKET/KEY)"
        )
    if location.fs.get_file_info(bucket).type == FileType.NotFound:
        raise InputError(f"output bucket {bucket!r} of {location.uri!r} does not exist")
    info = location.info()
    if info.type == FileType.Directory and not dataset:
        raise InputError(f"output {location.uri!r} is a directory; give a .parquet or .jsonl object path")
    if info.type == FileType.File and dataset:
        raise InputError(
            f"output {location.uri!r} is an object; {writer} writes a directory of Parquet files"
        )
    if (
        info.type == FileType.Directory
        and (config.resume or config.overwrite)
        and _unfinished_publish(location)
    ):
        log.info("%s holds a publish of this output cut off midway; this run replaces it", location.uri)
        return location
    if info.type != FileType.NotFound and not config.overwrite:
        raise InputError(f"output {location.uri!r} already exists; pass --overwrite to replace it")
    if info.type == FileType.Directory and dataset:
        _check_replaceable_dataset(location.uri, remote.list_names(location) + _subdirectories(location))
    return location


def _unfinished_publish(location: Location) -> bool:
    """A dataset prefix without _SUCCESS while this output's checkpoints remain: a publish cut off midway
    (object stores publish file by file), which --resume or --overwrite replaces."""
    return not location.child(SUCCESS).exists() and parts_dir(location).child(MANIFEST).exists()


def _subdirectories(location: Location) -> list[str]:
    """Names of the prefixes directly in a directory prefix."""
    selector = pafs.FileSelector(location.path, allow_not_found=True)
    return [info.base_name for info in location.fs.get_file_info(selector) if info.type == FileType.Directory]


def check_run_paths(
    config: RunConfig,
    input_files: tuple,
    destination: Path | Location | None,
    input_directories: tuple = (),
) -> None:
    """Before any work: no written path may touch a read path or another written path; report writable."""
    reads: dict[str, object] = {f"input file {i}": path for i, path in enumerate(input_files)}
    for i, directory in enumerate(input_directories):
        reads[f"input directory {i}" if len(input_directories) > 1 else "input directory"] = directory
    reads["model directory"] = Path(config.model_dir)
    writes: dict[str, object] = {}
    if destination is not None:
        writes["output"] = destination
        writes["checkpoint directory"] = parts_dir(destination)
        writes["lock file"] = lock_path(destination)
    errors = errors_path(config)
    if errors is not None:
        writes["errors file"] = errors
    report = report_path(config)
    if report is not None:
        writes["report"] = report
    check_collisions(writes, reads)
    # --resume may replace the errors file too: a run cut off after publishing it, before its output.
    replaceable = config.overwrite or config.resume
    if isinstance(errors, Location):
        if errors.exists() and not replaceable:
            raise InputError(f"errors file {errors.uri!r} already exists; pass --overwrite to replace it")
    elif errors is not None:
        _check_writable("errors file", errors, replaceable)


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


def errors_path(config: RunConfig) -> Path | Location | None:
    """Where --on-error skip lists skipped rows: --errors-file, else OUTPUT.errors.jsonl (stdout: the log)."""
    if config.on_error != "skip" or config.dry_run:
        return None
    if config.errors_file:
        return _local_or_remote(config.errors_file, config)
    return None if config.output == STDOUT else default_errors_path(_local_or_remote(config.output, config))


def _local_or_remote(text: str, config: RunConfig) -> Path | Location:
    """A written path: a local Path, or a Location on an object store."""
    if not is_uri(text):
        return Path(text)
    location = parse_location(text, config.storage_options, write=True)
    return Path(location.path) if location.local else location


def default_errors_path(destination: Path | Location) -> Path | Location:
    """OUTPUT.errors.jsonl: where skipped rows go unless --errors-file says otherwise."""
    if isinstance(destination, Location):
        return destination.sibling(".errors.jsonl")
    return destination.with_name(f"{destination.name}.errors.jsonl")


def parts_dir(destination: Path | Location) -> Path | Location:
    """OUTPUT.parts: the checkpoint directory of an output."""
    if isinstance(destination, Location):
        return destination.sibling(".parts")
    return PartStore(destination).dir


def enforce_fail(contract: OutputContract, part: pa.Table, label: str) -> None:
    """Under on_error=fail, a failed row stops the run with its message."""
    if contract.on_error == "fail":
        error = contract.first_error(part)
        if error is not None:
            raise InputError(f"{label}: {error} {KEEP_GOING}")


class ErrorsSink:
    """Skipped rows: JSONL lines in a temporary file published beside the output, or warnings in the log."""

    def __init__(self, path: Path | Location | None) -> None:
        self.path = path
        self.remote = isinstance(path, Location)
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
            self._tmp = _local_temp() if self.remote else exclusive_temp(self.path)
            self._handle = open(self._tmp, "w", encoding="utf-8")
        self._handle.writelines(lines)

    def commit(self) -> None:
        """Publish the list (or remove an earlier run's list when nothing was skipped this time)."""
        if self.path is None:
            return
        if self._handle is None:
            if self.remote:
                remote.delete(self.path)
            else:
                self.path.unlink(missing_ok=True)
            return
        self._handle.close()
        self._handle = None
        if self.remote:
            try:
                remote.upload(self._tmp, self.path)
            finally:
                self._tmp.unlink(missing_ok=True)
        else:
            durable_replace(self._tmp, self.path)
        log.info("skipped rows are listed in %s", self.path)  # the run's one warning names it too

    def abort(self) -> None:
        """Drop the unpublished list."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def _local_temp() -> Path:
    """A local temporary file for something uploaded to an object store when finished."""
    handle, name = tempfile.mkstemp(prefix="score-batch-")
    os.close(handle)
    return Path(name)


def remove_leftovers(*paths: Path | Location | None) -> None:
    """Delete temporary files an interrupted run left beside these paths (the caller holds the output's lock)."""
    for path in paths:
        if path is None:
            continue
        if isinstance(path, Location):
            remote.remove_leftovers(path)
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
