"""The run report: counts, timings, memory, settings and versions of one run."""

from __future__ import annotations

import dataclasses
import json
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunReport:
    """What one run did; written as JSON with --report and summarized on stderr."""

    rows_read: int = 0
    items: int = 0
    items_scored: int = 0
    items_failed: int = 0
    items_skipped: int = 0  # failed items listed in the errors file (--on-error skip)
    rows_skipped_by_resume: int = 0
    groups: int = 0
    packs: int = 0
    batches: int = 0
    packed_tokens: int = 0
    pairwise_tokens: int = 0
    seconds_load: float = 0.0
    seconds_scoring: float = 0.0
    seconds_total: float = 0.0
    items_per_second: float = 0.0
    peak_rss_mb: float = 0.0
    backend: str = ""
    device: str = ""
    dry_run: bool = False
    ray_workers: int = 0  # actors of a --ray run (0: a local run)
    settings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)

    def add_plan(self, stats) -> None:
        """Add one window's planning counts (groups, packs, batches, tokens)."""
        for name in ("groups", "packs", "batches", "packed_tokens", "pairwise_tokens"):
            setattr(self, name, getattr(self, name) + getattr(stats, name))

    def finish(self) -> None:
        """Fill the derived numbers: throughput and peak memory."""
        if self.seconds_scoring > 0:
            self.items_per_second = round(self.items_scored / self.seconds_scoring, 2)
        self.peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    def summary(self) -> str:
        """One line for stderr."""
        if self.ray_workers:
            return (
                f"score-batch: scored {self.items_scored} items from {self.rows_read} rows ({self.items_failed} "
                f"failed) on Ray with {self.ray_workers} workers; {self.seconds_total:.1f}s total, "
                f"{self.items_per_second:.1f} items/s"
            )
        ratio = self.pairwise_tokens / self.packed_tokens if self.packed_tokens else 0.0
        verb = "planned" if self.dry_run else "scored"
        count = self.items if self.dry_run else self.items_scored
        return (
            f"score-batch: {verb} {count} items from {self.rows_read} rows ({self.items_failed} failed, "
            f"{self.rows_skipped_by_resume} rows resumed) in {self.groups} groups, {self.packs} packs, "
            f"{self.batches} batches; {self.packed_tokens} tokens packed vs {self.pairwise_tokens} pairwise "
            f"({ratio:.2f}x); {self.seconds_total:.1f}s total, {self.items_per_second:.1f} items/s, "
            f"peak RSS {self.peak_rss_mb:.0f} MB"
        )

    def write(self, path: str) -> None:
        """Write the report as JSON."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2, default=str) + "\n")


def versions() -> dict:
    """Versions of the pieces that decide the numbers."""
    import pyarrow
    import torch
    import transformers

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "pyarrow": pyarrow.__version__,
    }
