"""Overlap: the next window is prepared on a worker thread while this one runs (job/local.py chains three)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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
