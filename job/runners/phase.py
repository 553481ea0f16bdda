"""The scoring phase every runner shares: the engine loaded once, progress (a bar on a terminal, else a log line
every few seconds), stop signals, the sink's commit or abort, and the report's counts built from the
ScoredWindows each runner hands to `add` (never by hand)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from tqdm import tqdm

from score_batch.engine.model.setup import ResolvedSetup, load_planner
from score_batch.engine.plan.planner import Planner
from score_batch.engine.scorer import Scorer
from score_batch.errors import UserError
from score_batch.io_formats.columns import ERROR, SCORE
from score_batch.job.policy import enforce_failed_rate
from score_batch.job.report import RunReport
from score_batch.job.run_config import RunConfig
from score_batch.job.score_stats import ScoreStats
from score_batch.signals import StopSignals

log = logging.getLogger(__name__)
progress_log = logging.getLogger("score_batch.job.progress")  # a fixed name (tests/test_log_names.py)
# counts a window adds to the report's field of the same name (and rows → rows_read, failed → items_failed)
ADDED = (
    "items", "reused", "reuse_incomplete", "duplicates", "requests", "requests_failed", "empty_queries",
    "empty_items",
)  # fmt: skip


@dataclass(frozen=True)
class ScoredWindow:
    """What one scored (or resumed, or dry-run planned) window adds to the run: counts, plan, scores."""

    rows: int  # input rows (or request lines) read
    items: int  # output items: rows of the output, failed ones included
    failed: int  # items that carry an error
    plan: object | None = None  # the window's PlanStats (None: nothing planned)
    scores: object = ()  # the items' scores, for the report's distribution (an Arrow or numpy array)
    # (query identity, items) per query group of the window: job/windows.query_identity, the same query in any
    # window counted as one for the report's items_per_query
    query_items: Iterable[tuple[Hashable, int]] = ()
    resumed: bool = False  # a window --resume found checkpointed: read back, not scored
    reused: int = 0  # pairs copied from earlier outputs (--reuse)
    reuse_incomplete: int = 0  # pairs found there without every value this run writes: scored again
    duplicates: int = 0  # pairs copied from an earlier window of the run (the plan counts those within one)
    requests: int = 0  # request lines (OpenAI batch files)
    requests_failed: int = 0
    written: bool = True  # False: the window stopped the run (--on-error fail) and was not written
    # rows whose query, and items that, are empty ("" or no token ids): scored as given, counted and warned
    # about (job/windows.empty_counts)
    empty_queries: int = 0
    empty_items: int = 0

    @classmethod
    def resumed_part(cls, rows: int, part, query_items: Iterable[tuple[Hashable, int]]) -> ScoredWindow:
        """A window --resume read back from its checkpoint part: its items and failed items (the output's
        counts, as an uninterrupted run's), none scored now."""
        failed = part.num_rows - part[ERROR].null_count
        return cls(rows, part.num_rows, failed, scores=part[SCORE], query_items=query_items, resumed=True)


@dataclass
class ScoringPhase:
    """One run's scoring: enter it, `add` every window, `commit` the sink (see the module)."""

    config: RunConfig
    report: RunReport
    sink: object  # job/outputs/sinks.py: write, commit, abort(keep_checkpoints)
    total_items: int | None = None  # for the progress bar's ETA (None: unknown)
    show_progress: bool = True  # False where another progress display runs (Ray Data's bars)
    immediate_stop: bool = False  # a signal stops at once (Ray: the driver only waits, no safe points)
    stats: ScoreStats = field(default_factory=ScoreStats)

    def __enter__(self) -> ScoringPhase:
        self._started = time.perf_counter()
        quiet = self.config.quiet or not self.show_progress
        self.progress = Progress(self.total_items, quiet, self.config.progress_seconds)
        self._signals = StopSignals(immediate=self.immediate_stop).__enter__()
        self._sizes_added = False
        return self

    def advance(self, items: int) -> None:
        """Items finished inside a window (the engine's callback): progress, and a pending stop is raised."""
        self.progress.update(items)
        self.check()

    def check(self) -> None:
        """Raise Stopped at this safe point when a signal came."""
        self._signals.check()

    def add(self, window: ScoredWindow) -> None:
        """Count a finished window into the report and the score statistics."""
        report = self.report
        report.rows_read += window.rows
        report.items_failed += window.failed
        for name in ADDED:
            setattr(report, name, getattr(report, name) + getattr(window, name))
        if window.resumed:
            report.rows_skipped_by_resume += window.rows
            report.items_resumed += window.items - window.failed
        elif window.written and not self.config.dry_run:
            report.items_scored += window.items - window.failed - window.reused - self._copies(window)
        if window.plan is not None:
            report.add_plan(window.plan)
        self.stats.add_scores(window.scores)
        items = list(window.query_items)
        self._sizes_added |= bool(items)
        self.stats.add_query_items(items)
        self.progress.rows += window.rows

    def _copies(self, window: ScoredWindow) -> int:
        """The window's items copied from another of the run: across windows, and within it by its plan (not
        under --truncate chunk: the plan counts repeated chunks, and their items are still scored)."""
        planned = window.plan.duplicates if window.plan is not None and not self.config.chunked else 0
        return window.duplicates + planned

    def commit(self, *args, **kwargs) -> None:
        """The scoring time and statistics into the report, then the sink's commit: the rows it left out
        (--on-error skip's) and the rows it wrote."""
        self.check()  # nothing is published after a signal
        self._close_timing()
        report = self.report
        report.items_skipped = self.sink.commit(*args, **kwargs) or 0
        written = getattr(self.sink, "rows_written", None)  # None: a sink that does not count (unranked Ray)
        report.rows_written = report.items - report.items_skipped if written is None else written
        warn_empty(report)

    def _close_timing(self) -> None:
        if not self.report.seconds_scoring:
            self.report.seconds_scoring = round(time.perf_counter() - self._started, 3)
            if self.stats.count or self.stats.non_finite or self._sizes_added:  # else: nothing to describe
                summary = self.stats.summary()
                if not self._sizes_added:  # a runner that sees no query groups (Ray) gives none
                    summary.pop("items_per_query")
                self.report.score_stats = summary

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if error is not None:
                # A user mistake: the input or settings must change, which invalidates the checkpoints; a
                # signal, the machine or a bug: --resume continues from them.
                self.sink.abort(keep_checkpoints=not isinstance(error, UserError))
        finally:
            self._signals.__exit__(kind, error, traceback)
            self.progress.close()
            self._close_timing()  # a stopped or failed run reports what it did until then
            self.report.finish()
        if error is None:
            self.check()  # a signal after the last safe point (the publish): still a stop, 130/143
            enforce_failed_rate(self.report, self.config)  # the output and its completion record are written


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

    def update(self, items: int) -> None:
        """Count finished items; log a line when the interval has passed."""
        self.items += items
        self._bar.update(items)
        now = time.monotonic()
        if self._lines and now - self._last >= self.every:
            self._last = now
            progress_log.info("progress: %s", self.describe(now))

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


def warn_empty(report: RunReport) -> None:
    """One warning with the counts of empty queries and items: scored as given (as CrossEncoder does), but
    usually a data bug."""
    said = []
    if report.empty_queries:
        said.append(f"{report.empty_queries} of {report.rows_read} rows have an empty query")
    if report.empty_items:
        said.append(f"{report.empty_items} of {report.items} items are empty")
    if said:
        log.warning(
            "%s; scored as given, around their templates (docs/semantics.md: empty queries and items)",
            " and ".join(said),
        )


def load_engine(
    config: RunConfig, report: RunReport, on_planner: Callable[[Planner, ResolvedSetup], None] | None = None
) -> tuple[Scorer | None, Planner, ResolvedSetup]:
    """The loaded Scorer (None: a dry run), its planner and setup; on_planner(planner, setup) runs before the
    weights load."""
    started = time.perf_counter()
    # proven before the keys and plans use it: an auto fallback is in the score identity and the planner
    planner, setup = load_planner(config.model_dir, config.engine, prove=not config.dry_run)
    if on_planner is not None:
        on_planner(planner, setup)
    scorer = None if config.dry_run else Scorer.load(config.model_dir, config.engine, (planner, setup))
    report.seconds_load = round(time.perf_counter() - started, 3)
    report.add_setup(setup)  # as proven: auto's fallbacks included
    return scorer, planner, setup
