"""Skipped rows under --on-error skip: a JSONL list published at the errors target, or warnings in the log."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
from score_batch.io_formats.target import Target
from score_batch.job.contract import OutputContract

log = logging.getLogger(__name__)


class ErrorsSink:
    """Skipped rows: JSONL lines in a staging file published at the errors target, or warnings in the log."""

    def __init__(self, path: Target | None) -> None:
        self.path = path
        self.count = 0
        self._tmp: Path | None = None
        self._handle = None

    def write(self, failed: pa.Table) -> None:
        """Record failed rows (a part-schema table)."""
        if failed.num_rows == 0:
            return
        self.count += failed.num_rows
        lines = OutputContract.error_lines(failed)
        if self.path is None:
            for line in lines:
                log.warning("skipped %s", line.rstrip())
            return
        if self._handle is None:
            self._tmp = self.path.staging_file()
            self._handle = open(self._tmp, "w", encoding="utf-8")
        self._handle.writelines(lines)

    def commit(self) -> None:
        """Publish the list (or remove an earlier run's list when nothing was skipped this time)."""
        if self.path is None:
            return
        if self._handle is None:
            self.path.delete()
            return
        self._handle.close()
        self._handle = None
        try:
            self.path.publish_file(self._tmp)
        finally:
            self._tmp.unlink(missing_ok=True)
        log.info("skipped rows are listed in %s", self.path)  # the run's one warning names it too

    def abort(self) -> None:
        """Drop the unpublished list."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
