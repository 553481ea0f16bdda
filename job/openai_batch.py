"""An OpenAI-style batch file run: request lines → engine groups → one response line per request.

The same guarantees as a local table run (job/local.py): paths checked and the output locked
before scoring, lines written to an exclusive temporary file and published by atomic rename,
nothing partial at the destination, counts and timings in the report. A request that cannot be
parsed or scored gets an error line and the run goes on (the batch format's own error handling).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path

from score_batch.engine import Group
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import is_uri
from score_batch.io_formats.openai_batch import (
    STDIN,
    BatchError,
    BatchRequest,
    error_line,
    read_requests,
    rerank_body,
    score_body,
    success_line,
)
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.io_formats.writers import durable_replace, exclusive_temp
from score_batch.job.config import STDOUT, RunConfig
from score_batch.job.local import load_engine
from score_batch.job.lock import OutputLock
from score_batch.job.policy import check_destination, check_run_paths, remove_leftovers
from score_batch.job.report import RunReport
from score_batch.job.signals import StopSignals
from tqdm import tqdm

log = logging.getLogger(__name__)
LOGGED_FAILURES = 10  # failed requests named in the log; the rest are counted


def run_openai_batch(config: RunConfig, report: RunReport) -> None:
    """Score every request of a batch file and write one response line per request, filling report."""
    started = time.perf_counter()
    check_batch_config(config)
    destination = check_destination(config, directory=False)
    check_run_paths(config, () if config.input == STDIN else (Path(config.input),), destination)
    with OutputLock.for_run(config, destination):
        _run_locked(config, destination, report, started)


def check_batch_config(config: RunConfig) -> None:
    """Refuse settings a batch file cannot honour (they belong to table input or to the Ray runner)."""
    refusals = {
        "--ray": config.ray is not None,
        "--resume": config.resume,
        "--top-k (use top_n in rerank requests)": getattr(config, "top_k", None) is not None,
        "--rank (rerank requests return their results sorted)": getattr(config, "rank", False),
        "--pooled-hidden-states": config.engine.scoring.pooled_hidden_states,
        "column options (--query-col, --keep-columns, ...)": config.columns != ColumnOverrides(),
    }
    for option, given in refusals.items():
        if given:
            raise InputError(f"{option} does not apply to an OpenAI batch file (--input-format openai-batch)")
    if not isinstance(config.input, str) or (config.input != STDIN and not Path(config.input).is_file()):
        raise InputError(f"input {config.input!r}: an OpenAI batch file is one JSONL file, or - for stdin")
    if config.output != STDOUT and is_uri(config.output):
        raise InputError(f"output {config.output!r}: an OpenAI batch output is a local .jsonl file or -")
    if config.output != STDOUT and Path(config.output).suffix.lower() not in (".jsonl", ".ndjson"):
        raise InputError(
            f"output {config.output!r}: an OpenAI batch output is JSONL; give a .jsonl path or -"
        )
    if config.errors_file or config.on_error == "skip":
        log.warning(
            "--on-error and --errors-file do not apply to a batch file: failed requests get error lines"
        )


def _run_locked(config: RunConfig, destination: Path | None, report: RunReport, started: float) -> None:
    """The run, once the paths are checked and the output is ours."""
    if destination is not None and not config.dry_run:
        remove_leftovers(destination)
    scorer, planner, setup = load_engine(config, report)
    model, created = str(config.model_dir), int(time.time())
    failures = _Failures()
    progress = tqdm(
        unit="item",
        file=sys.stderr,
        dynamic_ncols=True,
        desc="scoring",
        disable=config.quiet or not sys.stderr.isatty(),
    )
    sink = _LineSink(
        None if config.dry_run else destination, stdout=config.output == STDOUT and not config.dry_run
    )
    scoring_started = time.perf_counter()
    try:
        with StopSignals() as stop:
            for window in _windows(read_requests(config.input), config.window_rows):
                report.rows_read += len(window)
                groups, owners = _groups(window)
                plan = planner.plan(groups) if groups else None
                results = None
                if plan is not None:
                    report.add_plan(plan.stats)
                    if scorer is not None:

                        def advance(count: int) -> None:
                            progress.update(count)
                            stop.check()

                        results = scorer.run(plan, advance)
                lines = []
                for number, request in enumerate(window):
                    line, error = _response(request, number, owners, plan, results, model, created)
                    items = len(request.items)
                    report.items += items
                    if error is not None:
                        report.items_failed += items
                        failures.add(request, error)
                    elif scorer is not None:
                        report.items_scored += items
                    lines.append(line)
                if not config.dry_run:
                    sink.write(lines)
                stop.check()
            report.seconds_scoring = round(time.perf_counter() - scoring_started, 3)
            sink.commit()
    except BaseException:
        sink.abort()
        raise
    finally:
        progress.close()
    failures.summarize(report.rows_read)
    report.seconds_total = round(time.perf_counter() - started, 3)
    report.finish()


def _windows(requests, window_items: int):
    """Lists of requests holding about window_items items (or that many requests) each; a request is never split."""
    window: list[BatchRequest] = []
    items = 0
    for request in requests:
        window.append(request)
        items += len(request.items)
        if items >= window_items or len(window) >= window_items:
            yield window
            window, items = [], 0
    if window:
        yield window


def _groups(window: list[BatchRequest]) -> tuple[list[Group], dict[int, list[tuple[int, list[int]]]]]:
    """The engine groups of a window's good requests, and per request its (group index, item positions)."""
    groups: list[Group] = []
    owners: dict[int, list[tuple[int, list[int]]]] = {}
    for number, request in enumerate(window):
        if request.error is not None:
            continue
        owners[number] = []
        for query, positions in request.grouped():
            owners[number].append((len(groups), positions))
            groups.append(Group(query, [request.items[p] for p in positions]))
    return groups, owners


def _response(request, number, owners, plan, results, model, created) -> tuple[str, BatchError | None]:
    """A request's output line, and its error (None when it was scored, or planned in a dry run)."""
    if request.error is not None:
        return error_line(request, request.error), request.error
    scores = [math.nan] * len(request.items)
    errors: list[str | None] = [None] * len(request.items)
    tokens = 0
    for group_index, positions in owners[number]:
        planned = plan.tokenized[group_index]
        for k, position in enumerate(positions):
            errors[position] = planned.errors[k]
            if planned.errors[k] is None:
                tokens += len(getattr(planned, "query_ids", [])) + len(planned.item_ids[k])
            if results is not None:
                result = results[group_index]
                scores[position] = float(result.score[k])
                if errors[position] is None and result.errors[k] is not None:
                    errors[position] = result.errors[k]
                if errors[position] is None and not math.isfinite(scores[position]):
                    errors[position] = "the model gave a non-finite score"
    failed = [p for p, e in enumerate(errors) if e is not None]
    if failed:
        first = failed[0]
        error = BatchError(
            "invalid_input",
            f"line {request.line}: {len(failed)} of {len(errors)} inputs could not be scored; "
            f"{request.item_field}[{first}]: {errors[first]}",
        )
        return error_line(request, error), error
    if results is None:
        return "", None
    if request.endpoint == "rerank":
        return success_line(request, rerank_body(request, scores, tokens, model)), None
    return success_line(request, score_body(request, scores, tokens, model, created)), None


class _Failures:
    """Failed requests: the first few named in the log, all counted."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, request: BatchRequest, error: BatchError) -> None:
        self.count += 1
        if self.count <= LOGGED_FAILURES:
            log.warning("request %r failed: %s", request.custom_id, error.message)

    def summarize(self, total: int) -> None:
        if self.count:
            log.warning("%d of %d requests failed; their output lines carry the error", self.count, total)


class _LineSink:
    """Response lines: to an exclusive temporary file renamed onto the destination, to stdout, or nowhere."""

    def __init__(self, destination: Path | None, stdout: bool) -> None:
        self.destination = destination
        self.stdout = stdout
        self.tmp = exclusive_temp(destination) if destination is not None else None
        self._handle = open(self.tmp, "w", encoding="utf-8") if self.tmp is not None else None

    def write(self, lines: list[str]) -> None:
        if self._handle is not None:
            self._handle.writelines(lines)
        elif self.stdout:
            sys.stdout.writelines(lines)
            sys.stdout.flush()

    def commit(self) -> None:
        """Publish the finished file (nothing to do for stdout or a dry run)."""
        if self._handle is None:
            return
        self._handle.close()
        self._handle = None
        durable_replace(self.tmp, self.destination)
        self.tmp = None

    def abort(self) -> None:
        """Drop the unpublished file; the destination is untouched."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


__all__ = ["check_batch_config", "run_openai_batch"]
