"""Every path a run writes, checked against every path it reads and against each other before any scoring.

Paths are compared as normalized URIs: local paths with `..` and symlinks resolved (also for the parts
that do not exist yet), object-store paths as scheme://bucket/key with `.` and `..` folded.
"""

from __future__ import annotations

import os
from pathlib import Path

from score_batch.io_formats.errors import InputError


def real(path: str | Path) -> Path:
    """A path with `..` and symlinks resolved (also for the parts that do not exist yet)."""
    return Path(os.path.realpath(os.path.abspath(path)))


def normalized(where) -> str:
    """The URI a path is compared by: a Target, a Location or an InputFile by its key(), a Path resolved."""
    where = getattr(where, "location", where)  # an InputFile counts through its location
    key = getattr(where, "key", None)
    return key() if callable(key) else "file://" + str(real(where))


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
    names = list(resolved_writes)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if _overlap(resolved_writes[first], resolved_writes[second]):
                raise InputError(
                    f"{first} {str(writes[first])!r} and {second} {str(writes[second])!r} are the same path; "
                    "give them different paths"
                )


def _overlap(a: str, b: str) -> bool:
    """True when a and b are the same path or one lies inside the other."""
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")
