"""Rules shared by local and Ray runs: the destination guard, the run's paths, the errors sink, on-error,
leftovers. Every written path is a Target (io_formats.target): the same code for local files and object
stores."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyarrow.fs import FileType
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.parts import MANIFEST
from score_batch.io_formats.target import LocalTarget, Target, target
from score_batch.io_formats.writers import OUTPUT_FORMATS, STDOUT, SUCCESS, output_format
from score_batch.job.config import RunConfig
from score_batch.job.contract import OutputContract, check_partition_by
from score_batch.job.lock import lock_path
from score_batch.job.paths import check_collisions

log = logging.getLogger(__name__)
KEEP_GOING = "(use --on-error record or skip to keep going)"


def check_destination(config: RunConfig, directory: bool) -> Target | None:
    """Refuse an output we may not create or replace; None for stdout. directory: a Ray run's output.

    With --partition-by the output is a directory too, and the partition columns must be ids or kept
    columns.
    """
    partitioned = bool(config.partition_by)
    if partitioned:
        check_partition_by(config.partition_by, config.columns.keep_columns)
    dataset = directory or partitioned
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
    destination = target(config.output, config.storage_options)
    missing = destination.missing_container()
    if missing is not None:
        raise InputError(missing)
    kind = destination.info().type
    if kind == FileType.Directory and not dataset:
        raise InputError(f"output {config.output!r} is a directory; give a .parquet or .jsonl file path")
    if not dataset:
        output_format(config.output)  # a .csv output fails here, in a dry run too
    if kind == FileType.File and dataset:
        raise InputError(f"output {config.output!r} is a file; {writer} writes a directory of Parquet files")
    if (
        kind == FileType.Directory
        and (config.resume or config.overwrite)
        and _unfinished_publish(destination)
    ):
        log.info("%s holds a publish of this output cut off midway; this run replaces it", destination)
        return destination
    if kind != FileType.NotFound and not config.overwrite and not completed(config):
        raise InputError(f"output {config.output!r} already exists; pass --overwrite to replace it")
    if kind == FileType.Directory and dataset and config.overwrite:  # only a dataset is replaced
        _check_replaceable_dataset(config.output, destination.list_names() + destination.list_directories())
    return destination


def completed(config: RunConfig) -> bool:
    """True when --resume finds the existing output recorded as complete (checked against the input later)."""
    from score_batch.job.completion import Completion

    return config.resume and Completion(config).exists()


def _check_replaceable_dataset(output: str, names: list[str]) -> None:
    """--overwrite replaces a directory only when it is empty or a finished dataset (it holds _SUCCESS)."""
    if names and SUCCESS not in names:
        raise InputError(
            f"output {output!r} is a directory without a {SUCCESS} marker, so not a dataset this tool "
            "wrote; --overwrite will not delete it: remove it yourself or choose another path"
        )


def _unfinished_publish(destination: Target) -> bool:
    """A dataset prefix without _SUCCESS while this output's checkpoints remain: a publish cut off midway
    (object stores publish file by file), which --resume or --overwrite replaces."""
    return (
        destination.publishes_in_steps
        and not destination.child(SUCCESS).exists()
        and parts_dir(destination).child(MANIFEST).exists()
    )


def default_errors_path(destination: Target) -> Target:
    """OUTPUT.errors.jsonl: where skipped rows go unless --errors-file says otherwise."""
    return destination.sibling(".errors.jsonl")


def parts_dir(destination: Target) -> Target:
    """OUTPUT.parts: the checkpoint directory of an output."""
    return destination.sibling(".parts")


@dataclass(frozen=True)
class RunPaths:
    """Every path one run writes, resolved once in preflight; later phases take them from here."""

    output: Target | None  # None: stdout
    parts: Target | None  # OUTPUT.parts/: the checkpoints (None: stdout or a dry run)
    lock: Target | None  # OUTPUT.lock (None: stdout or a dry run)
    errors: Target | None  # where --on-error skip lists skipped rows (None: the log, or not skipping)
    default_errors: Target | None  # OUTPUT.errors.jsonl: an earlier run's list, removed when stale
    report: Target | None  # --report FILE (None: none, or stderr)

    @classmethod
    def resolve(cls, config: RunConfig, destination: Target | None) -> RunPaths:
        """The paths of a run whose output was checked by check_destination (destination None: stdout)."""
        writes = destination is not None and not config.dry_run
        errors = None
        if config.on_error == "skip" and not config.dry_run:
            if config.errors_file:
                errors = target(config.errors_file, config.storage_options)
            elif destination is not None:
                errors = default_errors_path(destination)
        report = LocalTarget(config.report) if config.report and config.report != STDOUT else None
        return cls(
            destination,
            parts_dir(destination) if writes else None,
            lock_path(destination) if writes else None,
            errors,
            default_errors_path(destination) if writes else None,
            report,
        )

    @property
    def leftovers(self) -> tuple[Target, ...]:
        """Targets beside which an interrupted run may have left temporary files (the output's lock held)."""
        return tuple(p for p in (self.output, self.default_errors, self.errors) if p is not None)

    def writes(self) -> dict[str, Target]:
        """Every written path by what it is, for the collision checks."""
        named = {
            "output": self.output,
            "checkpoint directory": self.parts,
            "lock file": self.lock,
            "errors file": self.errors,
            "report": self.report,
        }
        return {name: path for name, path in named.items() if path is not None}


def check_run_paths(
    config: RunConfig, input_files: tuple, destination: Target | None, input_directories: tuple = ()
) -> RunPaths:
    """Before any work: no written path may touch a read path or another written path; the errors file
    writable. Returns the run's paths, resolved once."""
    destination = _compat_target(destination)
    paths = RunPaths.resolve(config, destination)
    reads: dict[str, object] = {f"input file {i}": path for i, path in enumerate(input_files)}
    for i, directory in enumerate(input_directories):
        reads[f"input directory {i}" if len(input_directories) > 1 else "input directory"] = directory
    reads["model directory"] = Path(config.model_dir)
    writes = paths.writes()
    if destination is not None and config.dry_run:  # a dry run writes nothing, but checks as the run would
        writes["checkpoint directory"], writes["lock file"] = parts_dir(destination), lock_path(destination)
    check_collisions(writes, reads)
    # --resume may replace the errors file too: a run cut off after publishing it, before its output.
    if paths.errors is not None:
        check_side_file("errors file", paths.errors, config.overwrite or config.resume)
    return paths


def _compat_target(destination) -> Target | None:
    """A local Path as a Target: job/openai_batch.py still passes check_destination's old Path."""
    return LocalTarget(destination) if isinstance(destination, Path) else destination


def check_report_path(config: RunConfig) -> None:
    """The report must be writable; an existing one is replaced only by --overwrite, --resume or a retry."""
    if config.report:
        check_report_file(config.report, config.overwrite or config.resume)


def check_report_file(report: str, replaceable: bool) -> None:
    """A --report path (- is stderr) must be writable; an existing report is replaced only when replaceable
    or when it is a failed run's report."""
    if report != STDOUT:
        path = LocalTarget(report)
        check_side_file("report", path, replaceable or _failed_report(path))


def _failed_report(path: Target) -> bool:
    """True when path holds the report of a run that did not succeed."""
    try:
        return json.loads(path.read_bytes() or b"").get("status") != "succeeded"
    except (OSError, ValueError, AttributeError):
        return False


def check_side_file(name: str, path: Target, replaceable: bool) -> None:
    """A side file (errors file, report) must be creatable now, and replaced only when allowed."""
    if path.is_dir():
        raise InputError(f"{name} {path.uri!r} is a directory; give a file path")
    if path.local_path is not None and not path.local_path.parent.is_dir():
        raise InputError(f"{name} directory {str(Path(path.uri).parent)!r} does not exist")
    if path.exists() and not replaceable:
        raise InputError(f"{name} {path.uri!r} already exists; pass --overwrite to replace it")
    if path.local_path is not None:
        path.temp_sibling().delete()  # proves the directory takes new files before hours of scoring


def enforce_fail(contract: OutputContract, part: pa.Table, label: str) -> None:
    """Under on_error=fail, a failed row stops the run with its message."""
    if contract.on_error == "fail":
        error = contract.first_error(part)
        if error is not None:
            raise InputError(f"{label}: {error} {KEEP_GOING}")


class ErrorsSink:
    """Skipped rows: JSONL lines in a staging file published at the errors target, or warnings in the log."""

    def __init__(self, path: Target | None) -> None:
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
            self._tmp = self.path.staging_file()
            self._handle = open(self._tmp, "w", encoding="utf-8")
        self._handle.writelines(lines)

    def commit(self) -> None:
        """Publish the list (or remove an earlier run's list when nothing was skipped this time)."""
        if self.path is None:
            return
        if self._handle is None:
            self.path.delete()
            return
        self._handle.close()
        self._handle = None
        try:
            self.path.publish_file(self._tmp)
        finally:
            self._tmp.unlink(missing_ok=True)
        log.warning("skipped rows are listed in %s", self.path)

    def abort(self) -> None:
        """Drop the unpublished list."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def remove_leftovers(*paths: Target | None) -> None:
    """Delete temporary files an interrupted run left beside these paths (the caller holds the output's lock)."""
    for path in paths:
        for leftover in _compat_target(path).remove_leftovers() if path is not None else ():
            log.info("removed %s, left by an interrupted run", leftover)
