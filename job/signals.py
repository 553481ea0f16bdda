"""SIGINT/SIGTERM become a Stopped exception at the next safe point, so a run stops cleanly between batches."""

from __future__ import annotations

import signal


class Stopped(Exception):
    """The run was stopped by a signal; completed windows are checkpointed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Records SIGINT/SIGTERM while active; check() raises Stopped once one arrived."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def check(self) -> None:
        """Raise Stopped when a signal arrived."""
        if self.signum is not None:
            raise Stopped(self.signum)
