"""An OpenAI-style batch file run: request lines → engine groups → one response line per request.

A runner of job.run's loop (batch_preflight, run_batch_file) with a table run's guarantees: paths checked and
the output locked before scoring, lines written to an exclusive temporary file and published by atomic rename
(nothing partial at the destination), counts and timings in the report. A request that cannot be parsed or
scored gets an error line and the run goes on (the batch format's own error handling).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

from score_batch.engine import Group
from score_batch.engine.activation import RequestActivation
from score_batch.engine.plan.pair_truncation import (
    RequestRefused,
    cut_texts,
    tei_truncated_pairs,
    truncated_pairs,
)
from score_batch.engine.plan.planner import Planner
from score_batch.io_formats import readers
from score_batch.io_formats.batch_requests import (
    STDIN,
    BatchError,
    BatchRequest,
    error_line,
    rerank_body,
    score_body,
    success_line,
)
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.listing import FileFormat
from score_batch.io_formats.readers import InputSource
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.paths import check_run_paths
from score_batch.job.phase import ScoredWindow, ScoringPhase, load_engine
from score_batch.job.policy import check_destination
from score_batch.job.preflight import Checked
from score_batch.job.report import RunReport
from score_batch.job.run_config import STDOUT, RunConfig
from score_batch.job.sinks import LinesSink

log = logging.getLogger(__name__)
LOGGED_FAILURES = 10  # failed requests named in the log; the rest are counted


def is_openai_batch(input_format: str, source: InputSource) -> bool:
    """True when the run reads an OpenAI-style batch file (io_formats.readers.input_format decides)."""
    return readers.input_format(source, input_format) == FileFormat.OPENAI_BATCH


def batch_preflight(config: RunConfig, source: InputSource) -> Checked:
    """The batch-file runner's preflight (no weights): its settings, the output and every written path."""
    check_batch_config(config)
    if source.path != STDIN and (len(source.files) != 1 or source.directories):
        raise InputError(f"input {source.label!r}: an OpenAI batch file is one JSONL file, or - for stdin")
    destination = check_destination(config, directory=False)
    paths = check_run_paths(config, source.files, destination)
    return Checked(source, paths, mapping=None, types={})


def check_batch_config(config: RunConfig) -> None:
    """Refuse settings a batch file cannot honour (they belong to table input or to the Ray runner)."""
    refusals = {
        "--ray": config.ray is not None,
        "--resume": config.resume,
        "--reuse": bool(config.reuse),
        "--top-k (use top_n in rerank requests)": config.top_k is not None,
        "--rank (rerank requests return their results sorted)": config.rank,
        "--pooled-hidden-states": config.engine.scoring.pooled_hidden_states,
        "column options (--query-col, --keep-columns, ...)": config.columns != ColumnOverrides(),
    }
    for option, given in refusals.items():
        if given:
            raise InputError(f"{option} does not apply to an OpenAI batch file (--input-format openai-batch)")
    if not isinstance(config.input, str):
        raise InputError(f"input {config.input!r}: an OpenAI batch file is one JSONL file, or - for stdin")
    if config.output != STDOUT and Path(config.output).suffix.lower() not in (".jsonl", ".ndjson"):
        raise InputError(
            f"output {config.output!r}: an OpenAI batch output is JSONL; give a .jsonl path or -"
        )
    if config.errors_file or config.on_error == "skip":
        log.warning(
            "--on-error and --errors-file do not apply to a batch file: failed requests get error lines"
        )


def run_batch_file(config: RunConfig, checked: Checked, report: RunReport) -> None:
    """The batch-file runner's score-and-publish phase (job.run holds the lock, leftovers removed): every
    request scored (stdin: read from the source's spool), one response line each, published in one step."""
    batch, destination = readers.batch_reader(checked.source), checked.destination
    scorer, planner, setup = load_engine(config, report)
    model, created = str(config.model_dir), int(time.time())
    scoring = config.engine.scoring
    switches = RequestActivation(scoring.activation, scoring.score_index, scoring.label_score)
    sink = LinesSink(
        None if config.dry_run else destination, stdout=config.output == STDOUT and not config.dry_run
    )
    with ScoringPhase(config, report, sink) as phase:
        for window in _windows(batch.requests(), config.window_rows):
            groups, owners = _groups(window, planner)
            plan = planner.plan(groups) if groups else None
            results = None if plan is None or scorer is None else scorer.run(plan, phase.advance)
            lines, items, failed, refused = [], 0, 0, 0  # failed items, in refused requests
            for number, request in enumerate(window):
                line, error = _response(request, number, owners, plan, results, model, created, switches)
                items += len(request.items)
                if error is not None:
                    failed, refused = failed + len(request.items), refused + 1
                    if report.requests_failed + refused <= LOGGED_FAILURES:
                        log.warning("request %r failed: %s", request.custom_id, error.message)
                lines.append(line)
            stats = None if plan is None else plan.stats
            phase.add(
                ScoredWindow(len(window), items, failed, stats, requests=len(window), requests_failed=refused)
            )
            if not config.dry_run:
                sink.write(lines)
            phase.check()
        phase.commit()
    if report.requests_failed:
        failed = (report.requests_failed, report.rows_read)
        log.warning("%d of %d requests failed; their output lines carry the error", *failed)


def _windows(requests, window_items: int):
    """Lists of about window_items items (or that many requests) each; a request is never split."""
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

    Per request, in vLLM's order: max_tokens_per_query / max_tokens_per_doc cut the texts; then a pair over
    truncate_prompt_tokens N is scored on N of its tokens, or, with TEI's truncate, a pair over the model's
    limit is cut longest first; each such pair is its own group. A request whose settings cannot be honoured
    gets its error here."""
    groups: list[Group] = []
    owners: Owners = {}
    for number, request in enumerate(window):
        if request.error is None and request.use_activation is False and planner.cfg.label_score == "sigmoid":
            request.error = BatchError(
                "unsupported_parameter",
                f"line {request.line}: use_activation false asks for the raw logit, and this run gives its "
                "sigmoid (label_score sigmoid); run with --label-score logit for both",
            )
        if request.error is not None:
            continue
        limits = (request.max_tokens_per_query, request.max_tokens_per_doc)
        try:
            grouped = [
                (positions, *cut_texts(query, [request.items[p] for p in positions], *limits, planner))
                for query, positions in request.grouped()
            ]
        except RequestRefused as refused:
            request.error = BatchError(refused.code, f"line {request.line}: {refused}")
            continue
        owners[number] = []
        for positions, query, items in grouped:
            cut: dict[int, Group | str] = {}
            if request.truncate_prompt_tokens is not None:
                cut = truncated_pairs(
                    query, items, request.truncate_prompt_tokens, request.truncation_side, planner
                )
            elif request.truncate:
                cut = tei_truncated_pairs(query, items, request.truncation_direction, planner)
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


def _response(
    request, number, owners, plan, results, model, created, switches: RequestActivation
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


__all__ = ["batch_preflight", "check_batch_config", "is_openai_batch", "run_batch_file"]
