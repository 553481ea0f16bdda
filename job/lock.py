"""One run per output: an exclusive lock file beside it naming its holder (pid, host, start time)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path

from score_batch.io_formats import remote
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location

log = logging.getLogger(__name__)
UNREADABLE_LOCK_SECONDS = 10.0  # a lock file written in one small write is readable well within this


def lock_path(destination: Path | Location) -> Path | Location:
    """The lock file of an output path."""
    if isinstance(destination, Location):
        return destination.sibling(".lock")
    return destination.with_name(f"{destination.name}.lock")


class OutputLock:
    """Held while a run writes an output; a lock left by a dead process on this host is taken over."""

    def __init__(self, destination: Path) -> None:
        self.path = lock_path(destination)
        self.held = False

    @classmethod
    def for_run(cls, config, destination: Path | None) -> OutputLock | contextlib.nullcontext:
        """The lock a run takes: none for stdout or a dry run."""
        if destination is None or config.dry_run:
            return contextlib.nullcontext()
        if isinstance(destination, Location):
            return RemoteOutputLock(destination, config.storage_options)
        return cls(destination)

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Create the lock file exclusively, or take over a stale one; exit 2 naming a live holder."""
        for _ in range(3):
            if self._create():
                return
            holder = self._holder()
            if holder is None and self._abandoned():
                log.warning("removing the unreadable lock %s (a run died while writing it)", self.path)
                self.path.unlink(missing_ok=True)
                continue
            if holder is None:  # vanished or still being written: look again
                time.sleep(0.05)
                continue
            if not self._stale(holder):
                raise InputError(
                    f"another run is writing this output: {self.path} is held by pid {holder.get('pid')} on "
                    f"{holder.get('host')} since {holder.get('started')}; wait for it, or stop it and rerun "
                    "(its lock is taken over once the process is gone)"
                )
            log.warning(
                "taking over the lock %s left by pid %s (no longer running)", self.path, holder.get("pid")
            )
            self._remove_if_unchanged(holder)
        raise InputError(f"could not take the lock {self.path}; another run keeps racing for it")

    def release(self) -> None:
        """Remove the lock file if this run holds it."""
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def _create(self) -> bool:
        """Atomically create the lock file with this process as holder; False when it exists."""
        try:
            handle = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(handle, "w") as out:
                json.dump(_holder_record(), out)
        except BaseException:  # a half-written lock would block every later run
            self.path.unlink(missing_ok=True)
            raise
        self.held = True
        return True

    def _abandoned(self) -> bool:
        """True for a local lock file that is still unreadable long after it was created."""
        if not isinstance(self.path, Path):
            return False
        try:
            return time.time() - self.path.stat().st_mtime > UNREADABLE_LOCK_SECONDS
        except OSError:
            return False

    def _holder(self) -> dict | None:
        """The lock file's record, or None when it cannot be read."""
        try:
            holder = json.loads(self._read())
        except (OSError, ValueError, TypeError):
            return None
        return holder if isinstance(holder, dict) else None

    def _read(self) -> str | bytes | None:
        return self.path.read_text()

    @staticmethod
    def _stale(holder: dict) -> bool:
        """True when the holder ran on this host and its process is gone."""
        if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
            return False
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def _remove_if_unchanged(self, holder: dict) -> None:
        """Remove a stale lock unless another run replaced it meanwhile."""
        if self._holder() == holder:
            self.path.unlink(missing_ok=True)


def _holder_record() -> dict:
    """Who holds a lock: this process, this host, since now."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


class RemoteOutputLock(OutputLock):
    """OUTPUT.lock on an object store, created with a conditional write (see io_formats.remote)."""

    def __init__(self, destination: Location, options: tuple[tuple[str, str], ...]) -> None:
        self.path = lock_path(destination)
        self.options = options
        self.held = False

    def release(self) -> None:
        if self.held:
            remote.delete(self.path)
            self.held = False

    def _create(self) -> bool:
        if not remote.create_exclusive(self.path, json.dumps(_holder_record()).encode(), self.options):
            return False
        self.held = True
        return True

    def _read(self) -> bytes | None:
        return remote.read_object(self.path)

    def _remove_if_unchanged(self, holder: dict) -> None:
        if self._holder() == holder:
            remote.delete(self.path)
