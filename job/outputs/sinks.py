"""Where scored rows go: a local run's checkpointed parts merged into a file (or, with --partition-by, a
hive-partitioned directory), stdout, or nowhere (dry run); a batch file's response lines; a Ray run's staged
directory; skipped rows' errors file."""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa

from score_batch.io_formats.columns import ERROR_FIELDS
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location
from score_batch.io_formats.writers import (
    STDOUT,
    StdoutJsonlWriter,
    json_lines,
    output_format,
    write_partitioned,
)
from score_batch.job.checkpoint.completion import stamped
from score_batch.job.checkpoint.identity import FINGERPRINTED, RunIdentity
from score_batch.job.checkpoint.parts import PartStore
from score_batch.job.checkpoint.record_check import DIGESTED, check_record
from score_batch.job.outputs.query_ranking import rank_parts
from score_batch.job.preflight.contract import OutputContract
from score_batch.job.preflight.paths import RunPaths, normalized
from score_batch.job.run_config import RunConfig

log = logging.getLogger(__name__)
Check = Callable[[], None]  # raises Stopped at a safe point when a signal came (ScoringPhase.check)


class NullSink:
    """A dry run: rows are planned and counted, nothing is written, nothing was finished before (and the base
    of StdoutSink)."""

    rows_written = 0  # output rows (lines) written, for the report

    def resumed_record(self) -> dict | None:
        return None

    def listed(self) -> frozenset[int]:
        return frozenset()

    def done(self, window: int, input_hash: str) -> bool:
        return False

    def start(self, fingerprint: RunIdentity) -> None: ...

    def check_read(self, windows_read: int) -> None: ...

    def write(self, window: int, part: pa.Table, contract: OutputContract, input_hash: str) -> None: ...

    def commit(self, contract: OutputContract, check: Check, fingerprint: RunIdentity | None = None) -> int:
        return 0  # no row was skipped

    def abort(self, keep_checkpoints: bool) -> None: ...


class StdoutSink(NullSink):
    """JSONL on stdout as windows finish (nothing to resume); skipped rows go to --errors-file (or the log)."""

    def __init__(self, paths: RunPaths) -> None:
        self._writer: StdoutJsonlWriter | None = None
        self.errors = ErrorsSink(paths.errors)
        self._held: list[pa.Table] = []  # ranked runs print once every query is complete
        self.rows_written = 0

    def write(self, window: int, part: pa.Table, contract: OutputContract, input_hash: str) -> None:
        """Print the window's output rows and divert its failed rows (ranked runs: hold them to the end)."""
        self._held.append(part)
        if not contract.ranked:
            self._print(contract)

    def _print(self, contract: OutputContract) -> None:
        """Write the held parts' output rows as JSON lines."""
        if self._writer is None:
            self._writer = StdoutJsonlWriter(contract.final_schema())
        for kept in _output_rows(self._held, contract, self.errors):
            self._writer.write(contract.final_view(kept))
            self.rows_written += kept.num_rows
        self._held = []

    def commit(self, contract: OutputContract, check: Check, fingerprint: RunIdentity | None = None) -> int:
        """Print held ranked rows; publish the errors list (lines already printed stay printed)."""
        if contract.ranked:
            self._print(contract)
        self.errors.commit()
        return self.errors.count

    def abort(self, keep_checkpoints: bool) -> None:
        """Drop the unpublished errors list."""
        self.errors.abort()


class PartsSink:
    """One checkpointed Parquet part per window beside OUTPUT; at the end, one merge published atomically."""

    def __init__(self, config: RunConfig, paths: RunPaths) -> None:
        self.config = config
        self.paths = paths
        self.rows_written = 0
        self.destination = paths.output
        self.format = "parquet" if config.partition_by else output_format(config.output)
        if not self.destination.publishes_in_steps and self.destination.exists() and not config.overwrite:
            # Checked again under the lock: a run that finished after this one's preflight published it
            # (object stores: a publish cut off midway may be there, replaced under --resume).
            raise InputError(f"output {config.output!r} already exists; pass --overwrite to replace it")
        self.parts = PartStore(paths.parts)
        self._previous = self.parts.load() if self.parts.exists() else None
        if self.parts.exists() and not config.resume and not config.overwrite:
            raise InputError(
                f"a previous run left checkpointed parts in {self.parts.dir.uri!r}; pass --resume to "
                "continue it or --overwrite to start over"
            )

    def start(self, fingerprint: RunIdentity) -> None:
        """Refuse to resume parts of another run (naming what differs); record this run's identity."""
        previous = self._previous
        if self.config.resume and previous is not None and previous != fingerprint.digest:
            what = fingerprint.difference(_shaped(self.parts.record()))
            raise InputError(
                f"cannot --resume: the parts in {self.parts.dir.uri!r} were written "
                + (f"differently: {what}" if what else f"with a different {FINGERPRINTED}")
                + "; rerun with the original ones, or pass --overwrite (without --resume) to start over"
            )
        if self.config.resume and previous is None:
            log.info("nothing to resume in %s; starting from the beginning", self.parts.dir)
        if not (self.config.resume and previous is not None):
            # --overwrite's earlier parts, or parts without a valid manifest (never trusted): deleted only
            # now, once nothing before scoring refused the run
            self.parts.clear()
        self.parts.start(
            fingerprint.digest, keep=self.config.resume and previous is not None, record=fingerprint.record
        )

    def resumed_record(self) -> dict | None:
        """The fingerprint record of the parts this --resume continues (None: nothing to continue)."""
        return self.parts.record() if self.config.resume and self._previous is not None else None

    def listed(self) -> frozenset[int]:
        """Windows the manifest lists as finished (to be verified by done())."""
        return frozenset(self.parts.windows()) if self.config.resume else frozenset()

    def done(self, window: int, input_hash: str) -> bool:
        """True when --resume finds this window's part, intact and scored from the same input."""
        return self.config.resume and self.parts.verified(window, input_hash)

    def scored(self, window: int) -> pa.Table:
        """A done window's checkpointed part (its rows, failed ones included)."""
        return self.parts.read(window)

    def write(self, window: int, part: pa.Table, contract: OutputContract, input_hash: str) -> None:
        """Checkpoint the window (all rows, failed ones included)."""
        self.parts.write(window, part, input_hash)

    def check_read(self, windows_read: int) -> None:
        """Refuse to merge checkpoints of windows this run did not read (the input got shorter since)."""
        beyond = [window for window in self.parts.windows() if window >= windows_read]
        if beyond:
            raise InputError(
                f"cannot --resume: the checkpoints in {self.parts.dir.uri!r} hold window {beyond[0]}, but the input "
                f"now ends after {windows_read} windows (it changed since); pass --overwrite (without "
                "--resume) to start over"
            )

    def commit(self, contract: OutputContract, check: Check, fingerprint: RunIdentity | None = None) -> int:
        """Merge the parts in window order into OUTPUT (published in one step), list skipped rows, drop parts."""
        errors = ErrorsSink(self.paths.errors)
        try:
            tables = self._final_tables(contract, check, errors)
            # The errors file is published before the output: an output never appears without its list.
            self._publish(tables, contract, errors.commit, fingerprint, check, self.destination, self.format)
        except BaseException:
            errors.abort()
            raise
        stale = self.paths.default_errors
        if errors.path is None or normalized(errors.path) != normalized(stale):  # an earlier run's list
            stale.delete()
        self.parts.clear()
        return errors.count

    def _final_tables(self, contract: OutputContract, check: Check, errors: ErrorsSink) -> Iterator[pa.Table]:
        """The output rows in output order, window by window (ranked: all at once); failed rows to errors."""
        for kept in _output_rows(map(self.parts.read, self.parts.windows()), contract, errors):
            self.rows_written += kept.num_rows
            yield contract.final_view(kept)
            if not contract.ranked:
                check()  # a signal during the merge stops it; the parts stay for --resume

    def _publish(self, tables, contract, ready, fingerprint, check, destination: Location, form: str) -> None:
        """Tables published at destination; ready() runs once every row is written, before the output appears.
        One file is written whole and published in one step (see Location.atomic_writer). --partition-by:
        hive-partitioned Parquet in a staging directory, published whole (a local rename; object stores:
        uploaded under a hidden prefix, moved into place, _SUCCESS last); a signal stops the writing and the
        upload (check), never the step that replaces the output."""
        schema = contract.final_schema()
        if self.config.partition_by:
            partitioning = contract.partition_schema(self.config.partition_by)
            staging = destination.staging_directory()
            try:
                write_partitioned(tables, staging, stamped(schema, fingerprint), partitioning, check)
                ready()
                destination.publish_directory(staging, check)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            return
        writer = destination.atomic_writer(
            stamped(schema, fingerprint) if form == "parquet" else schema, form
        )
        try:
            for table in tables:
                writer.write(table)
            ready()
            writer.commit()
        except BaseException:
            writer.abort()
            raise

    def abort(self, keep_checkpoints: bool) -> None:
        """Stopped runs keep their parts for --resume; a refused run (bad input, a refused --resume) leaves the
        checkpoint as it found it: the parts it wrote itself go, those it resumed stay, unchanged."""
        if not keep_checkpoints:
            self.parts.undo()


def _shaped(record: dict | None) -> dict | None:
    """A manifest's identity record when it has a record's shape (job/checkpoint/record_check), else None
    (unnamed); its input left out (parts records hold none; an older version's held the files' sizes and
    times)."""
    if isinstance(record, dict):
        record = {key: value for key, value in record.items() if key != "input"}
    try:
        return check_record(record, "of the checkpoint manifest", required=DIGESTED[:-1])
    except InputError:
        return None


def _output_rows(
    parts: Iterable[pa.Table], contract: OutputContract, errors: ErrorsSink
) -> Iterator[pa.Table]:
    """The output rows of parts in output order, part by part (ranked: all at once, as a query's items may sit
    in any part); their failed rows to errors."""
    for kept, failed in (
        [rank_parts(list(parts), contract)] if contract.ranked else map(contract.split, parts)
    ):
        errors.write(failed)
        yield kept


class StagedFile:
    """Lines written to a staging file (opened at the first write) and published at a Location in one step."""

    def __init__(self, target: Location) -> None:
        self.target = target
        self._tmp: Path | None = None
        self._handle = None

    def write(self, lines: list[str]) -> None:
        if self._handle is None:
            self._tmp = self.target.staging_file()
            self._handle = open(self._tmp, "w", encoding="utf-8")
        self._handle.writelines(lines)

    def commit(self) -> bool:
        """Publish what was written; False, with the target untouched, when nothing was."""
        if self._handle is None:
            return False
        self._handle.close()
        self._handle = None
        try:
            self.target.publish_file(self._tmp)
        finally:
            self._tmp.unlink(missing_ok=True)
        return True

    def abort(self) -> None:
        """Drop the unpublished file; the target is untouched."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


class ErrorsSink:
    """Skipped rows under --on-error skip: JSONL lines published at the errors target, or warnings in the log."""

    def __init__(self, path: Location | None) -> None:
        self.path = path
        self.count = 0
        self._file = None if path is None else StagedFile(path)

    def write(self, failed: pa.Table) -> None:
        """Record failed rows (a part-schema table)."""
        if failed.num_rows == 0:
            return
        self.count += failed.num_rows
        lines = json_lines(failed.select(list(ERROR_FIELDS)))  # row_index, query_id, item_id, error
        if self._file is not None:
            self._file.write(lines)
            return
        for line in lines:
            log.warning("skipped %s", line.rstrip())

    def commit(self) -> None:
        """Publish the list, or remove an earlier run's list when nothing was skipped this time."""
        if self._file is None:
            return
        if self._file.commit():
            log.info("skipped rows are listed in %s", self.path)  # the run's one warning names it too
        else:
            self.path.delete()

    def abort(self) -> None:
        """Drop the unpublished list."""
        if self._file is not None:
            self._file.abort()


class LinesSink:
    """A batch file's response lines: a staging file published in one step, stdout, or nowhere (a dry run)."""

    def __init__(self, destination: Location | None, stdout: bool) -> None:
        self.stdout = stdout
        self.rows_written = 0  # response lines
        self.file = None if destination is None else StagedFile(destination)
        if self.file is not None:
            self.file.write([])  # created before any scoring; an empty batch publishes an empty file

    def write(self, lines: list[str]) -> None:
        if self.file is not None or self.stdout:
            self.rows_written += len(lines)
        if self.file is not None:
            self.file.write(lines)
        elif self.stdout:
            sys.stdout.writelines(lines)
            sys.stdout.flush()

    def commit(self) -> None:
        """Publish the finished file (nothing to do for stdout or a dry run)."""
        if self.file is not None:
            self.file.commit()

    def abort(self, keep_checkpoints: bool = False) -> None:
        """Drop the unpublished file (a batch file has no checkpoints); the destination is untouched."""
        if self.file is not None:
            self.file.abort()


class StagedDirectorySink:
    """A directory output that other writers fill (a Ray run's write tasks): a hidden staging directory beside
    OUTPUT on its store, published whole (`_SUCCESS` last) after the errors file."""

    def __init__(self, destination: Location, schema: pa.Schema, errors: ErrorsSink) -> None:
        self.destination, self.schema, self.errors = destination, schema, errors
        self.rows_written: int | None = None  # set by a ranked run; else the items less the skipped ones
        self.staging = destination.temp_sibling(directory=True)  # `.NAME.tmp-…`: a dead run's is removed

    def commit(self) -> int:
        """Publish the errors file, then OUTPUT; the rows left out (--on-error skip)."""
        self.errors.commit()
        self.destination.replace_with(self.staging)
        return self.errors.count

    def abort(self, keep_checkpoints: bool) -> None:
        """Drop the unpublished errors list (the staging directory goes in remove)."""
        self.errors.abort()

    def remove(self) -> None:
        """Drop what is left of the staging directory (nothing after a local publish)."""
        self.staging.delete_tree()


def open_sink(config: RunConfig, paths: RunPaths) -> NullSink | StdoutSink | PartsSink:
    """A dry run's NullSink, stdout's streamed JSONL, or an output file's checkpointed parts."""
    if config.dry_run:
        return NullSink()
    if config.output == STDOUT or paths.output is None:
        return StdoutSink(paths)
    return PartsSink(config, paths)
