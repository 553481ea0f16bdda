"""SIGINT/SIGTERM become a Stopped exception: at once while nothing is written (preflight, model load),
at the next safe point while a run writes (between batches), so it stops cleanly; never inside an import (one
raised there leaves the module half-imported; inside torch's C++ start-up it aborts the process): a stop that
lands in one is delivered again once the import is done."""

from __future__ import annotations

import os
import signal
import sys
import threading

REDELIVER_SECONDS = 0.02  # a stop that landed inside an import is sent again this much later
_IMPORTING = (
    "<frozen importlib._bootstrap"  # the import system's frames (…_bootstrap and …_bootstrap_external)
)


class Stopped(BaseException):
    """The run was stopped by a signal; completed windows are checkpointed. A BaseException, as KeyboardInterrupt
    is, so that library code's `except Exception` (a guarded import, a fallback) does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.reported = False  # True once a run report says so (the CLI writes one otherwise)


class StopSignals:
    """Handles SIGINT/SIGTERM while active: immediate, Stopped raised from the handler; else at check(), the
    next safe point. A signal is remembered until the outermost one ends, so check() raises again a Stopped
    that could not propagate (raised in a weakref callback or a __del__: its report is hidden)."""

    _received: int | None = None  # the signal received since the outermost StopSignals was entered
    _depth = 0  # StopSignals active in the main thread
    _redelivering = False  # a stop that landed inside an import is to be sent again
    _delivered = False  # a Stopped was raised for the received signal (a redelivery then sends nothing)

    def __init__(self, immediate: bool = False) -> None:
        self.immediate = immediate
        self._previous: dict[int, object] = {}
        self._entered = 0  # id of the frame that entered it: only imports begun inside it hold a stop

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # handlers can only be set from the main thread; signals then act as before
        if StopSignals._depth == 0:
            StopSignals._received, StopSignals._delivered = None, False
            self._unraisable = sys.unraisablehook
            sys.unraisablehook = _unraisable_unless_stopped(sys.unraisablehook)
        StopSignals._depth += 1
        self._entered = id(sys._getframe(1))
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._previous:
            StopSignals._depth -= 1
            if StopSignals._depth == 0:
                sys.unraisablehook = self._unraisable

    def _handle(self, signum, frame) -> None:
        StopSignals._received = signum
        if not self.immediate:
            return
        if not _importing(frame, self._entered):
            StopSignals._delivered = True
            raise Stopped(signum)
        if not StopSignals._redelivering:  # once the import is done, raised then (one pending at a time)
            StopSignals._redelivering = True
            timer = threading.Timer(REDELIVER_SECONDS, _redeliver, (signum,))
            timer.daemon = True
            timer.start()

    def check(self) -> None:
        """Raise Stopped when a signal arrived."""
        if StopSignals._received is not None:
            StopSignals._delivered = True
            raise Stopped(StopSignals._received)


def _importing(frame, entered: int) -> bool:
    """True while the frame runs inside an import (a module's code, or the import system's own) begun below the
    frame whose id is entered (a run started by a module's own import is not held for that import)."""
    while frame is not None and id(frame) != entered:
        if frame.f_code.co_filename.startswith(_IMPORTING):
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int) -> None:
    """Send a stop that landed inside an import again: its handler then raises it, or defers it once more;
    nothing once it was raised (check() took it) or every StopSignals has ended (its handlers are gone)."""
    StopSignals._redelivering = False
    if StopSignals._depth > 0 and not StopSignals._delivered:
        os.kill(os.getpid(), signum)


def _unraisable_unless_stopped(hook):
    """sys.unraisablehook printing nothing for a Stopped raised where Python cannot raise (a weakref callback,
    a __del__): the signal stays received, and the next check raises it."""

    def unraisable(info) -> None:
        if not isinstance(info.exc_value, Stopped):
            hook(info)

    return unraisable


def exit_on_signals() -> None:
    """From now on SIGINT/SIGTERM end the process at once with 130/143 and one line on stderr (the command line's
    last instructions: nothing left to clean up)."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _exit_now)


def _exit_now(signum, frame) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        os.write(2, f"score-batch: stopped by {signal.Signals(signum).name}\n".encode())
    finally:
        os._exit(128 + signum)
