"""SIGINT/SIGTERM become a Stopped exception: at once while nothing is written (preflight, model load),
at the next safe point while a run writes (between batches), so it stops cleanly."""

from __future__ import annotations

import signal
import threading


class Stopped(Exception):
    """The run was stopped by a signal; completed windows are checkpointed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Handles SIGINT/SIGTERM while active. immediate: raise Stopped from the handler (nothing to leave in
    a clean state); else record the signal and raise it from check() at the next safe point."""

    def __init__(self, immediate: bool = False) -> None:
        self.immediate = immediate
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # handlers can only be set from the main thread; signals then act as before
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        if self.immediate:
            raise Stopped(signum)

    def check(self) -> None:
        """Raise Stopped when a signal arrived."""
        if self.signum is not None:
            raise Stopped(self.signum)
