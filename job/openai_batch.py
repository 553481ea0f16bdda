"""An OpenAI-style batch file run: request lines → engine groups → one response line per request.

A runner of job.run's loop (preflight: batch_preflight; score and publish: run_batch_file), so the
same guarantees as a local table run hold: paths checked and the output locked before scoring, lines written to an exclusive temporary file and published by atomic rename,
nothing partial at the destination, counts and timings in the report. A request that cannot be
parsed or scored gets an error line and the run goes on (the batch format's own error handling).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from pathlib import Path
from typing import Literal

import numpy as np
from score_batch.engine import Group
from score_batch.engine.planner import Planner
from score_batch.io_formats import readers
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.listing import InputFormat
from score_batch.io_formats.locations import is_uri
from score_batch.io_formats.openai_batch import (
    STDIN,
    BatchError,
    BatchFileReader,
    BatchRequest,
    error_line,
    rerank_body,
    score_body,
    success_line,
)
from score_batch.io_formats.readers import InputSource
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.io_formats.writers import durable_replace, exclusive_temp
from score_batch.job.config import STDOUT, RunConfig
from score_batch.job.local import load_engine
from score_batch.job.policy import check_destination, check_run_paths
from score_batch.job.preflight import Checked
from score_batch.job.report import RunReport
from score_batch.job.signals import StopSignals
from tqdm import tqdm

log = logging.getLogger(__name__)
LOGGED_FAILURES = 10  # failed requests named in the log; the rest are counted
UNLIMITED = 1 << 40  # token limits of the planner that measures whole pairs for truncate_prompt_tokens
Activation = Literal["none", "sigmoid", "softmax"]


def is_openai_batch(input_format: str, source: InputSource) -> bool:
    """True when the run reads an OpenAI-style batch file (io_formats.readers.input_format decides)."""
    return readers.input_format(source, input_format) == InputFormat.OPENAI_BATCH


def batch_preflight(config: RunConfig, source: InputSource) -> Checked:
    """The batch-file runner's preflight (no weights): its settings, the output and every written path."""
    check_batch_config(config)
    destination = check_destination(config, directory=False)
    paths = check_run_paths(config, () if config.input == STDIN else (Path(config.input),), destination)
    return Checked(source, paths, mapping=None, types={})


def run_batch_file(config: RunConfig, checked: Checked, report: RunReport) -> None:
    """The batch-file runner's score-and-publish phase (job.run holds the lock and removed leftovers):
    every request scored, one response line each, published in one step; fills report.

    For stdin, the opened source's spool is read.
    """
    _score_requests(config, checked.destination, report, readers.batch_reader(checked.source))


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


def _score_requests(config: RunConfig, destination, report: RunReport, batch: BatchFileReader) -> None:
    """Load the engine, score the requests window by window and publish the response lines."""
    scorer, planner, setup = load_engine(config, report)
    model, created = str(config.model_dir), int(time.time())
    switches = _Switches(
        getattr(config.engine.scoring, "activation", "auto"), config.engine.scoring.score_index
    )
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
            for window in _windows(batch.requests(), config.window_rows):
                report.rows_read += len(window)
                groups, owners = _groups(window, planner)
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
                    line, error = _response(request, number, owners, plan, results, model, created, switches)
                    items = len(request.items)
                    report.items += items
                    report.requests += 1
                    if error is not None:
                        report.items_failed += items
                        report.requests_failed += 1
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


@dataclasses.dataclass(frozen=True)
class _Part:
    """Some items of a request: the engine group scoring them (None: refused) and their request positions."""

    group: int | None
    positions: list[int]
    refused: str | None = None  # why these items are not scored (group None)


Owners = dict[int, list[_Part]]  # request number → its parts


def _groups(window: list[BatchRequest], planner: Planner) -> tuple[list[Group], Owners]:
    """The engine groups of a window's good requests, and per request its (group index, item positions).

    A request with truncate_prompt_tokens N has each pair longer than N tokens scored as its own group of
    token ids: the pair's last N tokens (what vLLM keeps); encoder cross-encoders build pairs from text, so
    there such a pair gets an error instead.
    """
    groups: list[Group] = []
    owners: Owners = {}
    for number, request in enumerate(window):
        if request.error is not None:
            continue
        owners[number] = []
        for query, positions in request.grouped():
            items = [request.items[p] for p in positions]
            cut: dict[int, Group | str] = {}
            if request.truncate_prompt_tokens is not None:
                cut = _truncated(query, items, request.truncate_prompt_tokens, planner)
            kept = [k for k in range(len(positions)) if k not in cut]
            if kept:
                owners[number].append(_Part(len(groups), [positions[k] for k in kept]))
                groups.append(Group(query, [items[k] for k in kept]))
            for k, group in cut.items():
                if isinstance(group, str):
                    owners[number].append(_Part(None, [positions[k]], group))
                else:
                    owners[number].append(_Part(len(groups), [positions[k]]))
                    groups.append(group)
    return groups, owners


def _truncated(query: str, items: list[str], keep: int, planner: Planner) -> dict[int, Group | str]:
    """Per item whose whole (query, item) sequence is over keep tokens: its last keep tokens as a token-id group
    (split so the query keeps what is left of it), or why it cannot be cut."""
    limits = dataclasses.replace(
        planner.limits,
        max_pack_tokens=UNLIMITED,
        max_positions=None,
        pair_max_length=None if planner.limits.pair_max_length is None else UNLIMITED,
    )
    cfg = dataclasses.replace(planner.cfg, max_query_tokens=None, max_item_tokens=None, truncate="error")
    measured = dataclasses.replace(planner, cfg=cfg, limits=limits).plan([Group(query, items)]).tokenized[0]
    cut: dict[int, Group | str] = {}
    for k, ids in enumerate(measured.item_ids):
        if ids is None:
            continue  # the run's own planning reports why
        if planner.limits.pair_max_length is not None:
            if len(ids) > keep:
                cut[k] = (
                    f"truncate_prompt_tokens {keep}: the pair has {len(ids)} tokens, and an encoder "
                    "cross-encoder's pairs cannot be cut to their last tokens (use --truncate item-tail)"
                )
            continue
        sequence = measured.reference_sequence(k)
        if len(sequence) <= keep:
            continue
        tail = sequence[-keep:]
        query_len = min(len(measured.query_ids), keep)
        if measured.item_first:  # item then query: the query keeps its last tokens
            cut[k] = Group(tail[len(tail) - query_len :], [tail[: len(tail) - query_len]])
        else:  # query then item: what is left of the query (at least one token) leads
            lead = max(1, len(measured.query_ids) - (len(sequence) - keep))
            cut[k] = Group(tail[:lead], [tail[lead:]])
    return cut


def _response(
    request, number, owners, plan, results, model, created, switches: _Switches
) -> tuple[str, BatchError | None]:
    """A request's output line, and its error (None when it was scored, or planned in a dry run)."""
    if request.error is not None:
        return error_line(request, request.error), request.error
    scores = [math.nan] * len(request.items)
    errors: list[str | None] = [None] * len(request.items)
    tokens = 0
    for part in owners[number]:
        if part.group is None:
            for position in part.positions:
                errors[position] = part.refused
            continue
        planned = plan.tokenized[part.group]
        values = None
        if results is not None:
            result = results[part.group]
            values = switches.values(result.scores, result.score, request.use_activation)
        for k, position in enumerate(part.positions):
            errors[position] = planned.errors[k]
            if planned.errors[k] is None:
                tokens += len(getattr(planned, "query_ids", [])) + len(planned.item_ids[k])
            if values is not None:
                scores[position] = float(values[k])
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


@dataclasses.dataclass(frozen=True)
class _Switches:
    """A request's use_activation applied to the engine's results, as vLLM's PoolingParams.use_activation.

    None: the run's own `score` (what a table run writes). False: the raw value, entry score_index of
    `scores`. True: the activated value: the run's `score` when the run applies an activation (its
    --activation, `auto` by default: the model's own, as vLLM's default use_activation=true), else a
    sigmoid (one score per item) or softmax (several) over `scores`.
    """

    run_activation: str  # the run's ScoringConfig.activation (auto | none | sigmoid | softmax)
    score_index: int

    def values(self, scores: np.ndarray, score: np.ndarray, use_activation: bool | None) -> np.ndarray:
        """[n] values of one group's items; scores: [n, num_scores], score: [n] (the run's)."""
        if use_activation is None:
            return score
        if not use_activation:
            return scores[:, self.score_index]
        if self.run_activation != "none":
            return score
        activation: Activation = "sigmoid" if scores.shape[1] == 1 else "softmax"
        return _activate(scores, activation, self.score_index)


def _activate(scores: np.ndarray, activation: Activation, score_index: int) -> np.ndarray:
    """engine.activation.activate (imported when needed: it arrives with the engine's activation work)."""
    from score_batch.engine.activation import activate

    return activate(scores, activation, score_index)


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


__all__ = ["batch_preflight", "check_batch_config", "is_openai_batch", "run_batch_file"]
