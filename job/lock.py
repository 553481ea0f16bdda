"""One run per output: an exclusive lock file beside it naming its holder (pid, host, start time)."""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location

log = logging.getLogger(__name__)
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
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Create the lock file exclusively, or take over a stale one; exit 2 naming a live holder."""
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}).encode()
        for _ in range(3):
            if self.path.create_exclusive(record):
                self.held = True
                return
            holder = self._holder()
            if holder is None:
                age = self.path.age_seconds()  # None where the store does not say
                if age is not None and age > UNREADABLE_LOCK_SECONDS:
                    log.warning("removing the unreadable lock %s (a run died while writing it)", self.path)
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
            log.warning(
                "taking over the lock %s left by pid %s (no longer running)", self.path, holder.get("pid")
            )
            if self._holder() == holder:  # unless another run replaced it meanwhile
                self.path.delete()
        raise InputError(f"could not take the lock {self.path}; another run keeps racing for it")

    def release(self) -> None:
        """Remove the lock file if this run holds it."""
        if self.held:
            self.path.delete()
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
