"""RunConfig: every setting of one score-batch run, resolved once by the caller (the CLI or Python code)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from score_batch.choices import INPUT_FORMATS, ON_ERROR_MODES, HiveTypes, OnError, RequestedFormat
from score_batch.engine import EngineConfig
from score_batch.errors import ConfigError
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.io_formats.writers import STDOUT

DEFAULT_WINDOW_ROWS = 2048
MAX_WINDOW_ROWS = 2**31 - 1  # a window is held in memory: past this no machine holds one (nor Arrow's int64)
MAX_THREADS = 1024  # torch starts an OS thread each: 100,000 crashed the process, 2**32 overflowed
PRICE = "must be a finite price >= 0"  # the report is JSON: no Infinity in it


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide a Ray run goes."""

    address: str | None = None  # None: start a local Ray; "auto": join the running cluster
    num_workers: int = 1
    gpus_per_worker: float | None = None  # None: 1 when the cluster has GPUs and the device allows, else 0
    cpus_per_worker: float = 1.0
    groups_per_batch: int = 64

    def __post_init__(self) -> None:
        refuse(
            self,
            ("num_workers", lambda: self.num_workers < 1, "must be at least 1"),
            ("cpus_per_worker", lambda: self.cpus_per_worker <= 0, "must be positive"),
            ("gpus_per_worker", lambda: (self.gpus_per_worker or 0) < 0, "must not be negative"),
        )


def refuse(config, *checks: tuple[str, Callable[[], bool], str]) -> None:
    """ConfigError naming the first field whose check (name, refused?, why) refuses its value, in order."""
    for name, refused, why in checks:
        if refused():
            raise ConfigError(f"{type(config).__name__}.{name}", getattr(config, name), why)


@dataclass(frozen=True)
class RunConfig:
    """One run: input, output, model, columns, engine settings and batch-job behaviour."""

    input: str | tuple[str, ...]  # one INPUT, or several read in order (paths or URIs; "-" is stdin)
    output: str
    model_dir: Path
    columns: ColumnOverrides
    engine: EngineConfig
    window_rows: int = DEFAULT_WINDOW_ROWS
    on_error: OnError = "fail"
    errors_file: str | None = None
    resume: bool = False
    overwrite: bool = False
    report: str | None = None
    dry_run: bool = False
    quiet: bool = False
    ray: RayOptions | None = None  # None: a local run
    input_format: RequestedFormat = "auto"  # auto: openai-batch when the lines are batch requests, else table
    top_k: int | None = None  # keep the best top_k items per query (adds rank)
    rank: bool = False  # add a rank column (1 = best) to every row
    threads: int | None = None  # torch intra-op threads; None: the CPUs this process may use
    progress_seconds: float = 30.0  # non-terminal stderr: one progress log line per this many seconds
    # read, tokenize and pack the next windows on worker threads while this one is scored
    pipeline: bool = True
    # --storage-option key=value: endpoint, region (no secrets)
    storage_options: tuple[tuple[str, str], ...] = ()
    partition_by: tuple[str, ...] = ()  # --partition-by: OUTPUT is a hive-partitioned Parquet directory
    hive_types: HiveTypes = "infer"  # --hive-types: input partition values typed, or strings
    price_per_hour: float | None = None  # --price-per-hour: the machine's price, for the report's cost
    reuse: tuple[str, ...] = ()  # --reuse: earlier outputs whose scores are copied for pairs with equal keys
    reuse_missing_ok: bool = False  # --reuse-missing-ok: a --reuse output that is not there is a warning
    # --max-failed-rate: the largest fraction of failed items a run may end with (exit 4 above it, after the
    # output is written); None: only a run where every item failed fails
    max_failed_rate: float | None = None

    def __post_init__(self) -> None:
        stdout, rate = self.output == STDOUT, self.max_failed_rate
        refuse(  # in order: the first refused field is named (later checks may assume earlier ones held)
            self,
            ("on_error", lambda: self.on_error not in ON_ERROR_MODES, _one_of(ON_ERROR_MODES)),
            ("window_rows", lambda: self.window_rows < 1, "must be at least 1"),
            ("window_rows", lambda: self.window_rows > MAX_WINDOW_ROWS, f"must be at most {MAX_WINDOW_ROWS}"),
            ("input_format", lambda: self.input_format not in INPUT_FORMATS, _one_of(INPUT_FORMATS)),
            ("threads", lambda: self.threads is not None and self.threads < 1, "must be at least 1"),
            ("threads", lambda: (self.threads or 0) > MAX_THREADS, f"must be at most {MAX_THREADS}"),
            ("progress_seconds", lambda: self.progress_seconds <= 0, "must be positive"),
            (
                "price_per_hour",
                lambda: not (self.price_per_hour is None or 0 <= self.price_per_hour < math.inf),
                PRICE,
            ),
            ("top_k", lambda: self.top_k is not None and self.top_k < 1, "must be at least 1"),
            ("max_failed_rate", lambda: not _fraction(rate), "must be a fraction from 0 to 1"),
            ("input", lambda: not isinstance(self.input, str) and not self.input, "names no input"),
            ("partition_by", lambda: self.partition_by and stdout, "needs an output directory, not stdout"),
            ("resume", lambda: self.resume and stdout, "needs an output file (stdout cannot be resumed)"),
        )

    @property
    def inputs(self) -> tuple[str, ...]:
        """The INPUT arguments in order."""
        return (self.input,) if isinstance(self.input, str) else tuple(self.input)

    @property
    def chunked(self) -> bool:
        """Whether over-long items are scored as chunks (--truncate chunk): the output gets a chunks column."""
        return self.engine.scoring.truncate == "chunk"

    def reads_windows_of(self, record: dict | None) -> RunConfig:
        """This config reading windows of the size an earlier run's identity record names (its checkpoint
        parts are numbered by them); itself when the record names none."""
        layout = record.get("layout") if isinstance(record, dict) else None
        rows = layout.get("window_rows") if isinstance(layout, dict) else None
        if not isinstance(rows, int) or rows < 1 or rows == self.window_rows:
            return self
        return dataclasses.replace(self, window_rows=rows)


def _fraction(value: float | None) -> bool:
    """None, or a number from 0 to 1 (NaN refused)."""
    return value is None or 0 <= value <= 1


def _one_of(choices: tuple[str, ...]) -> str:
    return f"is not one of {', '.join(choices)}"
