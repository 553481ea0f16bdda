"""Overlap: the next window is read, hashed, grouped and planned on a worker thread while this one runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

In = TypeVar("In")
Out = TypeVar("Out")
_END = object()


def prefetched(items: Iterable[In], prepare: Callable[[In], Out], enabled: bool) -> Iterator[Out]:
    """prepare(item) for each item, in order, one item ahead on a worker thread (inline when not enabled).

    The worker's exceptions are raised here, at the item they belong to; closing the iterator waits
    for the one item in flight.
    """
    source = iter(items)
    if not enabled:
        yield from map(prepare, source)
        return

    def next_prepared():
        item = next(source, _END)
        return _END if item is _END else prepare(item)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="score-batch-prefetch") as pool:
        pending = pool.submit(next_prepared)
        while True:
            prepared = pending.result()
            if prepared is _END:
                return
            pending = pool.submit(next_prepared)
            yield prepared
