"""Overlap: the next window is prepared on a worker thread while this one runs (job/runners/local.py chains
three); finished windows are written on another (Writer)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")
_END = object()


class Prefetch(Generic[In, Out]):
    """prepare(item) for each item, in order, one item ahead on a worker thread (inline when not enabled); a
    worker's exception is raised at its item."""

    def __init__(self, items: Iterable[In], enabled: bool) -> None:
        self._source = iter(items)
        self._enabled = enabled
        self._prepare: Callable[[In], Out] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def start(self, prepare: Callable[[In], Out]) -> None:
        """Set the preparing function and, when enabled, begin preparing the first item now."""
        self._prepare = prepare
        if self._enabled:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="score-batch-prefetch")
            self._pending = self._pool.submit(self._next_prepared)

    def _next_prepared(self):
        item = next(self._source, _END)
        return _END if item is _END else self._prepare(item)

    def __iter__(self) -> Iterator[Out]:
        if self._prepare is None:
            raise RuntimeError("Prefetch.start(prepare) must be called before iterating")
        if not self._enabled:
            yield from map(self._prepare, self._source)
            return
        while True:
            prepared = self._pending.result()
            if prepared is _END:
                return
            self._pending = self._pool.submit(self._next_prepared)
            yield prepared

    def close(self) -> None:
        """Wait for the item in flight (its result is dropped) and stop the worker."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetch[In, Out]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Writer(Generic[Out]):
    """Jobs run in order on one worker thread (inline when not enabled), at most `waiting` queued behind the one
    running (submit waits past that); their futures taken back in order (finished). Once a job has raised, the
    later ones do not run (their futures hold Skipped)."""

    def __init__(self, enabled: bool, waiting: int = 1) -> None:
        self._pool = ThreadPoolExecutor(1, "score-batch-writer") if enabled else None
        self._waiting = waiting
        self._futures: deque[Future] = deque()
        self._failed = threading.Event()

    def submit(self, job: Callable[[], Out]) -> None:
        """Queue a job (run it, when not enabled); first wait while `waiting` jobs are queued and one runs."""
        if self._pool is None:
            future: Future = Future()
            try:
                future.set_result(self._run(job))
            except BaseException as error:  # taken back by finished(), as a worker's would be
                future.set_exception(error)
            self._futures.append(future)
            return
        while sum(not future.done() for future in self._futures) > self._waiting:
            wait([next(future for future in self._futures if not future.done())])
        self._futures.append(self._pool.submit(self._run, job))

    def _run(self, job: Callable[[], Out]) -> Out:
        if self._failed.is_set():
            raise Skipped("an earlier job failed")
        try:
            return job()
        except BaseException:
            self._failed.set()
            raise

    def finished(self, block: bool = False) -> Iterator[Future]:
        """The futures of the jobs done, in order, each taken back once (block: every job's, waiting for them)."""
        while self._futures and (block or self._futures[0].done()):
            future = self._futures.popleft()
            wait([future])
            yield future

    def close(self) -> None:
        """Wait for the jobs queued and stop the worker."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class Skipped(Exception):
    """A Writer's job that did not run: an earlier one failed."""
