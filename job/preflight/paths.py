"""Every path a run writes (RunPaths, resolved once in preflight), checked against every path it reads and
against each other before any scoring; OUTPUT.lock (OutputLock), one run per output. Paths are compared as
normalized URIs: local paths with `..` and symlinks resolved (also for parts that do not exist yet),
object-store ones as scheme://bucket/key with `.` and `..` folded.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from score_batch.errors import is_environment_error
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location, has_glob, parse_location
from score_batch.io_formats.writers import STDOUT
from score_batch.job.checkpoint.completion import Completion
from score_batch.job.run_config import RunConfig
from score_batch.signals import StopSignals

log = logging.getLogger(__name__)
lock_log = logging.getLogger("score_batch.job.lock")  # a fixed name (tests/test_log_names.py)


def normalized(where) -> str:
    """The URI a path is compared by: a Location or an InputFile by its key(), a Path with `..` and symlinks
    resolved (also for the parts that do not exist yet)."""
    where = getattr(where, "location", where)  # an InputFile counts through its location
    key = getattr(where, "key", None)
    return key() if callable(key) else "file://" + os.path.realpath(os.path.abspath(where))


def check_collisions(writes: dict[str, object], reads: dict[str, object]) -> None:
    """Refuse a write path that is, contains or lies inside a read path, or that another write path uses."""
    resolved_writes = {name: normalized(path) for name, path in writes.items()}
    resolved_reads = {name: normalized(path) for name, path in reads.items()}
    for name, path in resolved_writes.items():
        for read_name, read_path in resolved_reads.items():
            if _overlap(path, read_path):
                raise InputError(
                    f"{name} {str(writes[name])!r} would overwrite or mix into {read_name} "
                    f"{str(reads[read_name])!r}; choose another path"
                )
    for first, second in itertools.combinations(resolved_writes, 2):
        if _overlap(resolved_writes[first], resolved_writes[second]):
            raise InputError(
                f"{first} {str(writes[first])!r} and {second} {str(writes[second])!r} are the same path; "
                "give them different paths"
            )


def _overlap(a: str, b: str) -> bool:
    """True when a and b are the same path or one lies inside the other."""
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def written(config: RunConfig, text: str) -> Location:
    """A path the run writes (OUTPUT, --errors-file) on its store; InputError for a read-only scheme."""
    return parse_location(text, config.storage_options, write=True)


def default_errors_path(destination: Location) -> Location:
    """OUTPUT.errors.jsonl: where skipped rows go unless --errors-file says otherwise."""
    return destination.sibling(".errors.jsonl")


def parts_dir(destination: Location) -> Location:
    """OUTPUT.parts: the checkpoint directory of an output."""
    return destination.sibling(".parts")


@dataclass(frozen=True)
class RunPaths:
    """Every path one run writes, resolved once in preflight; later phases take them from here."""

    output: Location | None  # None: stdout
    parts: Location | None  # OUTPUT.parts/: the checkpoints (None: stdout or a dry run)
    lock: Location | None  # OUTPUT.lock (None: stdout or a dry run)
    errors: Location | None  # where --on-error skip lists skipped rows (None: the log, or not skipping)
    default_errors: Location | None  # OUTPUT.errors.jsonl: an earlier run's list, removed when stale
    report: Location | None  # --report FILE (None: none, or stderr)
    completion: Completion | None = None  # the output's completion record (None: stdout or a dry run)

    @classmethod
    def resolve(cls, config: RunConfig, destination: Location | None) -> RunPaths:
        """The paths of a run whose output was checked by check_destination (destination None: stdout)."""
        writes = destination is not None and not config.dry_run
        # --on-error skip lists skipped rows in --errors-file, else OUTPUT.errors.jsonl (or the log: None)
        errors = None
        if config.on_error == "skip" and not config.dry_run and config.errors_file != STDOUT:  # -: the log
            if config.errors_file:
                errors = written(config, config.errors_file)
            elif destination is not None:
                errors = default_errors_path(destination)
        report = Location.on_disk(config.report) if config.report and config.report != STDOUT else None
        return cls(
            destination,
            parts_dir(destination) if writes else None,
            lock_path(destination) if writes else None,
            errors,
            default_errors_path(destination) if writes else None,
            report,
            Completion(destination, bool(config.partition_by)) if writes else None,
        )

    @property
    def leftovers(self) -> tuple[Location, ...]:
        """Paths beside which an interrupted run may have left temporary files (the output's lock held)."""
        return tuple(p for p in (self.output, self.default_errors, self.errors) if p is not None)

    def writes(self) -> dict[str, Location]:
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
    config: RunConfig, input_files: tuple, destination: Location | None, input_directories: tuple = ()
) -> RunPaths:
    """Refuse written paths that touch a read path or each other, and an unwritable errors file; the paths."""
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


def check_report_path(config: RunConfig) -> None:
    """The report must be writable, and no path the run reads or writes; an existing one is replaced only
    by --overwrite, --resume or a retry. Checked first: a report written on a later failure never lands on
    the output, an input or the model."""
    if not config.report:
        return
    check_report_file(config.report, config.overwrite or config.resume)
    if config.report == STDOUT:
        return
    report = {"report": Location.on_disk(config.report)}
    for name, where in _named_paths(config).items():
        if name.startswith(("input", "model")):
            check_collisions(report, {name: where})
        else:
            check_collisions({name: where, **report}, {})


def _named_paths(config: RunConfig) -> dict[str, object]:
    """The paths a run will touch as the arguments name them (inputs before listing; globs by their base)."""
    named: dict[str, object] = {"model directory": Path(config.model_dir)}
    for i, text in enumerate(config.inputs):
        if text != STDOUT:
            base = _glob_base(text)
            kind = "file" if base == text and not os.path.isdir(text) else "directory"
            named[f"input {kind} {i}"] = base
    try:
        output = None if config.output == STDOUT else written(config, config.output)
        errors = written(config, config.errors_file) if config.errors_file not in (None, STDOUT) else None
    except InputError:  # preflight names the bad path, with the report written
        return named
    if output is not None:
        named |= {"output": output, "checkpoint directory": parts_dir(output), "lock file": lock_path(output)}
        named["errors file"] = errors or default_errors_path(output)
    elif errors is not None:
        named["errors file"] = errors
    return named


def _glob_base(text: str) -> str:
    """An INPUT up to its first glob component (the directory a glob searches)."""
    parts = text.split("/")
    for i, part in enumerate(parts):
        if has_glob(part):
            return "/".join(parts[:i]) or "."
    return text


def check_report_file(report: str, replaceable: bool) -> None:
    """A --report path (- is stderr) must be writable; an existing report is replaced only when replaceable
    or when it is a failed run's report."""
    if report != STDOUT:
        path = Location.on_disk(report)
        check_side_file("report", path, replaceable or _failed_report(path))


def _failed_report(path: Location) -> bool:
    """True when path holds the report of a run that did not succeed."""
    try:
        return json.loads(path.read_bytes() or b"").get("status") != "succeeded"
    except (OSError, ValueError, AttributeError):
        return False


def check_side_file(name: str, path: Location, replaceable: bool) -> None:
    """A side file (errors file, report) must be creatable now, and replaced only when allowed."""
    if path.is_dir():
        raise InputError(f"{name} {path.uri!r} is a directory; give a file path")
    check_local_container(name, path, probe=False)
    if path.exists() and not replaceable:
        raise InputError(f"{name} {path.uri!r} already exists; pass --overwrite to replace it")
    check_local_container(name, path)


def check_local_container(name: str, path: Location, probe: bool = True) -> None:
    """A local path's directory must exist, be a directory and (probe) take new files now, before hours of
    scoring: an InputError (exit 2) names a file in the way, a missing directory or a place no file can be
    created (/proc); a machine that refuses (permission, read-only, disk full) stays an OSError (exit 3)."""
    if not path.local:
        return
    shown = Path(path.uri) if "://" not in path.uri else Path(path.path)
    parent = shown.parent
    if not Path(path.path).parent.is_dir():
        blocking = next((p for p in (parent, *parent.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            raise InputError(f"{name} {path.uri!r}: {str(blocking)!r} is a file, not a directory")
        raise InputError(f"{name} directory {str(parent)!r} does not exist")
    if not probe:
        return
    try:
        path.temp_sibling().delete()
    except OSError as error:
        if is_environment_error(error):
            raise
        raise InputError(
            f"{name} {path.uri!r}: no file can be created in {str(parent)!r} ({error.strerror or error})"
        ) from None


UNREADABLE_LOCK_SECONDS = 10.0  # a lock file written in one small write is readable well within this


def lock_path(destination: Location) -> Location:
    """The lock file of an output: OUTPUT.lock."""
    return destination.sibling(".lock")


class OutputLock:
    """Held while a run writes an output; a lock left by a dead process on this host is taken over. Created
    atomically by Location.create_exclusive: O_EXCL locally, a conditional write on S3 (io_formats.locations)."""

    def __init__(self, path: Location) -> None:
        self.path = path
        self.held = False

    def __enter__(self) -> OutputLock:
        try:
            self.acquire()
        except BaseException:  # a stop as acquire returns: __exit__ is not called for a failed __enter__
            self.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Create the lock file exclusively, or take over a stale one; exit 2 naming a live holder."""
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}).encode()
        for _ in range(3):
            try:
                with StopSignals() as stops:  # a stop while it is made waits until `held` says whose it is
                    self.held = self.path.create_exclusive(record)
                if threading.current_thread() is threading.main_thread():  # where the handlers were set
                    stops.check()
            except BaseException:  # a stop once it is made: the file is this run's to remove
                self.release()
                raise
            if self.held:
                return
            holder = self._holder()
            if holder is None:
                age = self.path.age_seconds()  # None where the store does not say
                if age is not None and age > UNREADABLE_LOCK_SECONDS:
                    lock_log.warning(
                        "removing the unreadable lock %s (a run died while writing it)", self.path
                    )
                    self.path.delete()
                else:  # vanished or still being written: look again
                    time.sleep(0.05)
                continue
            if not self._stale(holder):
                raise InputError(
                    f"another run is writing this output: {self.path} is held by pid {holder.get('pid')} on "
                    f"{holder.get('host')} since {holder.get('started')}; wait for it, or stop it and rerun "
                    "(its lock is taken over once the process is gone)"
                )
            lock_log.warning(
                "taking over the lock %s left by pid %s (no longer running)", self.path, holder.get("pid")
            )
            if self._holder() == holder:  # unless another run replaced it meanwhile
                self.path.delete()
        raise InputError(f"could not take the lock {self.path}; another run keeps racing for it")

    def release(self) -> None:
        """Remove the lock file if this run holds it."""
        if self.held:
            try:
                self.path.delete()
            except BaseException:  # a stop while removing it: removed all the same, then the stop goes on
                self.path.delete()
                raise
            self.held = False

    def _holder(self) -> dict | None:
        """The lock file's record, or None when it cannot be read."""
        try:
            holder = json.loads(self.path.read_bytes())
        except (OSError, ValueError, TypeError):
            return None
        return holder if isinstance(holder, dict) else None

    @staticmethod
    def _stale(holder: dict) -> bool:
        """True when the holder ran on this host and its process is gone."""
        pid = holder.get("pid")
        return holder.get("host") == socket.gethostname() and isinstance(pid, int) and process_gone(pid)


def process_gone(pid: int) -> bool:
    """True when no process of this pid runs on this machine (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
