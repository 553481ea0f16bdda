"""Progress on stderr (a bar on a terminal, else a log line every few seconds) and the failed items' warning."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

from score_batch.io_formats.locations import Location
from score_batch.job.report import RunReport
from score_batch.job.run_config import STDOUT, RunConfig

log = logging.getLogger(__name__)


class Progress:
    """Counts scored items and rows; shows them as a tqdm bar (terminal) or periodic log lines (log files)."""

    def __init__(self, total_items: int | None, quiet: bool, every_seconds: float) -> None:
        self.total = total_items
        self.items = 0
        self.rows = 0
        self.every = every_seconds
        self._started = self._last = time.monotonic()
        terminal = sys.stderr.isatty()
        self._bar = tqdm(
            total=total_items,
            unit="item",
            file=sys.stderr,
            dynamic_ncols=True,
            desc="scoring",
            disable=quiet or not terminal,
        )
        self._lines = not quiet and not terminal

    def add_rows(self, rows: int) -> None:
        """Count input rows read."""
        self.rows += rows

    def update(self, items: int) -> None:
        """Count finished items; log a line when the interval has passed."""
        self.items += items
        self._bar.update(items)
        now = time.monotonic()
        if self._lines and now - self._last >= self.every:
            self._last = now
            log.info("progress: %s", self.describe(now))

    def describe(self, now: float) -> str:
        """Rows, items, rate and (when the total is known) the ETA."""
        elapsed = max(now - self._started, 1e-9)
        rate = self.items / elapsed
        text = f"{self.rows} rows, {self.items} items, {rate:.1f} items/s"
        if self.total:
            left = max(self.total - self.items, 0)
            eta = int(left / rate) if rate > 0 else None
            eta_text = "unknown" if eta is None else f"{eta // 3600}:{eta % 3600 // 60:02d}:{eta % 60:02d}"
            text += f", {100 * self.items / self.total:.1f}%, ETA {eta_text}"
        return text

    def close(self) -> None:
        """Close the bar."""
        self._bar.close()


def warn_failed_items(report: RunReport, config: RunConfig, errors: Location | None) -> None:
    """Warn how many items failed and where they went (errors: RunPaths.errors), --quiet or not; batch files'
    runner warns of its own."""
    if not report.items_failed or report.requests:
        return
    count = f"{report.items_failed} of {report.items} items"
    if config.dry_run:
        message = f"dry run: {count} would fail (--on-error {config.on_error})"
    elif config.on_error == "skip":  # no errors file (-o - without --errors-file): the log lists them
        logged = "the log above, one line each (pass --errors-file to keep them in a file)"
        where = logged if errors is None else errors.uri
        message = f"{count} failed and were left out of the output; they are listed in {where}"
    else:
        output = "the output" if config.output == STDOUT else config.output
        message = f"{count} failed; their rows in {output} carry the error"
    log.warning("%s", message)
