"""The run report: counts, timings, memory, settings and versions of one run."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from score_batch import __version__
from score_batch.errors import exit_code
from score_batch.io_formats.writers import durable_replace, exclusive_temp
from score_batch.job.checkpoint.identity import package_versions
from score_batch.machine import device_name, seconds_since_start

log = logging.getLogger(__name__)
PLAN_COUNTS = ("groups", "packs", "batches", "packed_tokens", "pairwise_tokens", "sequences", "duplicates")
REPORT_VERSION = 3  # docs/operations.md lists the fields


@dataclass
class RunReport:
    """What one run did; written as JSON with --report (on success and on failure) and summarized on stderr."""

    report_version: int = REPORT_VERSION
    status: str = "running"  # succeeded | failed | stopped; running: written at the start (a killed run's)
    pid: int = field(default_factory=os.getpid)  # the process that runs (or ran) it
    exit_code: int | None = None
    error: str | None = None
    started_at: str = field(default_factory=lambda: _now())
    ended_at: str | None = None
    rows_read: int = 0
    items: int = 0  # the output's items, failed ones included (a resumed run: its resumed windows' too)
    # items = items_scored + items_failed + reused + duplicates + items_resumed (under --truncate chunk
    # duplicates counts repeated chunks, which leave their items scored)
    items_scored: int = 0  # items this run ran through the model: not failed, reused or copied
    items_failed: int = 0  # the output's failed items (a resumed run: its resumed windows' too)
    items_skipped: int = 0  # failed items listed in the errors file (--on-error skip)
    items_resumed: int = 0  # items with scores read back from checkpoint parts (--resume), not scored now
    rows_written: int = 0  # output rows (a batch file's: response lines); under --top-k the kept ones
    rows_skipped_by_resume: int = 0
    requests: int = 0  # OpenAI batch file: request lines (0 for table input)
    requests_failed: int = 0  # OpenAI batch file: request lines answered with an error line
    groups: int = 0
    packs: int = 0
    batches: int = 0
    packed_tokens: int = 0
    pairwise_tokens: int = 0
    sequences: int = 0  # sequences scored: the items, or with --truncate chunk their chunks
    duplicates: int = 0  # (query, item) pairs equal to an earlier one of the run: scored once, copied
    reused: int = 0  # pairs whose values were copied from an earlier output (--reuse): not tokenized or run
    # pairs an earlier output held without every value this run writes (a trimmed column, a null): scored again
    reuse_incomplete: int = 0
    empty_queries: int = 0  # rows whose query is "" (or no token ids): scored as given, warned about
    empty_items: int = 0  # items that are "" (or no token ids): scored as given, warned about
    seconds_import: float = 0.0  # importing torch at the run's start (process start-up, not the job's work)
    seconds_load: float = 0.0
    seconds_scoring: float = 0.0
    seconds_total: float = 0.0
    items_per_second: float = 0.0
    peak_rss_mb: float = 0.0
    backend: str = ""
    device: str = ""
    dtype: str = ""  # as resolved (--dtype auto: bfloat16 on CUDA, float32 on CPU)
    packing: str = ""  # as resolved: mis (one packed sequence per query) or single (one item per sequence)
    layers: str = ""  # as resolved: native (engine/native) or transformers (its modeling code)
    # the native layers' element-wise kernels: torch or flashinfer; none for transformers layers
    ops: str = ""
    # what auto fell back from when FlashInfer failed its check at load, and why (engine/model/proof.py)
    fallbacks: list = field(default_factory=list)
    dry_run: bool = False
    already_complete: bool = False  # --resume found the output complete for the same model, settings, input
    ray_workers: int = 0  # actors of a --ray run (0: a local run)
    score_stats: dict = field(default_factory=dict)  # job/score_stats.ScoreStats.summary() of the output
    settings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    # input_tokens (what the pairs would run one by one), computed_tokens (what ran), device,
    # device_seconds, items_per_second; with --price-per-hour: price_per_hour, cost, cost_per_million_items.
    # A dry run: input_tokens, planned_tokens (what a run would compute) and device only.
    usage: dict = field(default_factory=dict)
    # --verify: items re-scored alone through the reference path, max_abs_diff, bound, ok, failed_items, path,
    # seconds (engine/run/verify.py); None when the run verified nothing
    verify: dict | None = None

    def add_setup(self, setup) -> None:
        """The engine settings as resolved for this model and machine (an engine.model.setup.ResolvedSetup)."""
        self.backend, self.device = setup.backend, str(setup.device)
        self.dtype, self.packing = str(setup.dtype).removeprefix("torch."), setup.packing
        fp8 = getattr(setup, "fp8", "none")  # FP8 GEMMs over bf16 activations (engine/native/fp8.py)
        self.dtype = {"scaled_mm": "fp8", "emulated": "fp8-emulated"}.get(fp8, self.dtype)
        self.layers, self.ops, self.fallbacks = setup.layers, setup.ops, list(setup.fallbacks)

    @property
    def items_with_scores(self) -> int:
        """Items this run gave a score: scored, reused or copied, not resumed (the throughput and cost count
        them)."""
        return 0 if self.dry_run else self.items - self.items_failed - self.items_resumed

    def add_usage(self, price_per_hour: float | None) -> None:
        """The usage object (its field's comment lists it); a dry run computes nothing: planned tokens only."""
        tokens = "planned_tokens" if self.dry_run else "computed_tokens"
        self.usage = usage = {"input_tokens": self.pairwise_tokens, tokens: self.packed_tokens}
        usage["device"] = device_name(self.device)
        if self.dry_run:
            return
        workers = self.ray_workers or 1
        usage["device_seconds"] = round(self.seconds_scoring * workers, 3)
        usage["items_per_second"] = self.items_per_second
        if price_per_hour is not None:
            cost = price_per_hour * self.seconds_total * workers / 3600
            per_million = round(cost * 1e6 / self.items_with_scores, 6) if self.items_with_scores else None
            usage.update(
                price_per_hour=price_per_hour, cost=round(cost, 6), cost_per_million_items=per_million
            )

    def add_plan(self, stats) -> None:
        """Add one window's planning counts (groups, packs, batches, tokens)."""
        for name in PLAN_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(stats, name))

    def end(self, error: BaseException | None) -> None:
        """Record how the run ended: status, exit code, error message, end time."""
        self.exit_code = exit_code(error)
        self.status = "succeeded" if self.exit_code == 0 else "stopped" if self.exit_code >= 128 else "failed"
        self.error = None if error is None else f"{type(error).__name__}: {error}"
        self.ended_at = _now()

    def finish(self) -> None:
        """Fill the derived numbers: throughput and peak memory."""
        if self.seconds_scoring > 0:
            self.items_per_second = round(self.items_with_scores / self.seconds_scoring, 2)
        self.peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    def summary(self) -> str:
        """One line for stderr."""
        if self.already_complete:
            return "score-batch: already complete (same model, settings and input); the output is unchanged"
        verb, count = ("planned", self.items) if self.dry_run else ("scored", self.items_scored)
        # a Ray run has no --resume
        resumed = "" if self.ray_workers else f", {self.rows_skipped_by_resume} rows resumed"
        source = (
            f"{self.rows_read} requests ({self.requests_failed} failed, {self.items_failed} items in them)"
            if self.requests
            else f"{self.rows_read} rows ({self.items_failed} failed{resumed})"
        )
        ratio = self.pairwise_tokens / self.packed_tokens if self.packed_tokens else 0.0
        work = (  # a Ray run's plans are made on its workers, uncounted
            f"on Ray with {self.ray_workers} workers{self._saved()}"
            if self.ray_workers
            else f"in {self.groups} groups, {self.packs} packs, {self.batches} batches; {self.packed_tokens} "
            f"tokens packed vs {self.pairwise_tokens} pairwise ({ratio:.2f}x{self._saved()})"
        )
        cost = f"cost {self.usage['cost']:.4g}, " if "cost" in self.usage else ""
        rate = "" if self.dry_run else f"{self.items_per_second:.1f} items/s, "  # a dry run scores none
        return (
            f"score-batch: {verb} {count} items from {source} {work}{self._written()}; "
            f"{self.seconds_total:.1f}s total, {rate}{cost}peak RSS "
            f"{self.peak_rss_mb:.0f} MB"
        )

    def _written(self) -> str:
        """The rows written, for the summary line, where not one per item (--top-k, --on-error skip), else ''."""
        top_k = self.settings.get("top_k")
        if self.dry_run or self.requests or not (top_k or self.items_skipped):
            return ""
        kept = f", the best {top_k} of each query" if top_k else ""
        skipped = f", {self.items_skipped} failed left out" if self.items_skipped else ""
        return f"; wrote {self.rows_written} rows{kept}{skipped}"

    def _saved(self) -> str:
        """What reuse and dedup saved, for the summary line ('' when nothing)."""
        said = ""
        if self.reused:
            said += f", {self.reused} of {self.items} pairs reused from earlier outputs"
        if self.reuse_incomplete:
            said += f", {self.reuse_incomplete} pairs scored again (an earlier output lacked a value)"
        if self.duplicates:
            said += f", {self.duplicates} duplicate pairs scored once"
        return said

    def write(self, path: str) -> None:
        """Write the report as JSON to a file (atomically), or to stderr for - (one line, as log lines are)."""
        written = dataclasses.asdict(self)
        if path == "-":
            sys.stderr.write(json.dumps(written, default=str) + "\n")
            return
        text = json.dumps(written, indent=2, default=str) + "\n"
        tmp = exclusive_temp(Path(path))
        tmp.write_text(text)
        durable_replace(tmp, Path(path))


def report_failure(
    report: str | None, error: BaseException, *, overwrite: bool, resume: bool = False
) -> None:
    """Write the report of a run that failed before it started; a report path that may not be written is left
    alone (with a warning), so the original error stands."""
    if not report:
        return
    from score_batch.job.preflight.paths import check_report_file

    try:
        check_report_file(report, replaceable=overwrite or resume)
    except Exception as refused:  # noqa: BLE001 - the run's own error is the one to show
        log.warning("no report written: %s", refused)
        return
    failed = RunReport(versions=versions())
    failed.seconds_total = seconds_since_start()
    failed.end(error)
    failed.write(report)


def versions() -> dict:
    """Versions of the pieces that decide the numbers, from package metadata (nothing is imported)."""
    return {
        "score-batch": __version__,
        "python": sys.version.split()[0],
        **package_versions(("torch", "transformers", "pyarrow")),
    }


def settings_of(config) -> dict:
    """A run's settings as plain JSON values."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def _now() -> str:
    """The current time as an ISO 8601 timestamp (UTC)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
