"""An OpenAI-style batch file run: request lines → a window of pairs → the one scoring loop → response lines.

A runner of job.run's loop with a table run's guarantees (output locked, one atomic publish, the report); a
request that cannot be parsed or scored gets an error line and the run goes on (the batch format's way).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

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
from score_batch.io_formats.batch_requests import STDIN, BatchError, BatchRequest, response_line
from score_batch.io_formats.columns import SCORE, SCORES
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.readers import InputSource
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.io_formats.window import Window, encode_queries
from score_batch.job.outputs.sinks import LinesSink
from score_batch.job.preflight.checks import Checked, check_destination
from score_batch.job.preflight.contract import OutputContract
from score_batch.job.preflight.paths import check_run_paths
from score_batch.job.report import RunReport
from score_batch.job.reuse import ScoredPairs
from score_batch.job.run_config import STDOUT, RunConfig
from score_batch.job.runners.phase import ScoredWindow, ScoringPhase, load_engine
from score_batch.job.runners.scoring import Prepared, WindowTools, planned, prepare, score_window

log = logging.getLogger(__name__)
LOGGED_FAILURES = 10  # failed requests named in the log; the rest are counted
PAIRS = OutputContract((pa.int64(), pa.int64()), (), None, "record", False)  # the scored part's columns


def batch_preflight(config: RunConfig, source: InputSource) -> Checked:
    """The batch-file runner's preflight (no weights): settings a batch file cannot honour, the output, paths."""
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
    if source.path != STDIN and (len(source.files) != 1 or source.directories):
        raise InputError(f"input {source.label!r}: an OpenAI batch file is one JSONL file, or - for stdin")
    destination = check_destination(config, directory=False)
    paths = check_run_paths(config, source.files, destination)
    return Checked(source, paths, mapping=None, types={})


def run_batch_file(config: RunConfig, checked: Checked, report: RunReport) -> None:
    """Every request (stdin: from the source's spool) → a window of pairs (_window) → job/runners/scoring.py →
    one response line each, published in one step."""
    batch, destination = readers.batch_reader(checked.source), checked.paths.output
    scorer, planner, _ = load_engine(config, report)
    tools = WindowTools(planner, PAIRS, None, None, ScoredPairs())  # no keys: nothing is copied
    scoring = config.engine.scoring
    switches = RequestActivation(scoring.activation, scoring.score_index, scoring.label_score)
    model, created = str(config.model_dir), int(time.time())
    sink = LinesSink(
        None if config.dry_run else destination, stdout=config.output == STDOUT and not config.dry_run
    )
    with ScoringPhase(config, report, sink) as phase:
        for number, requests in enumerate(_windows(batch.requests(), config.window_rows)):
            window, bounds = _window(requests, planner)
            prepared, part = prepare(number, window, tools), None
            if prepared.todo.groups:
                prepared = planned(prepared, tools)  # _columns reads its plan (score_window keeps it)
                part, _ = score_window(prepared, tools, scorer, phase.advance)
            columns = _columns(window, prepared, part, scorer)
            lines, items, failed, refused = [], 0, 0, 0  # failed items, in refused requests
            for request, start, stop in zip(requests, bounds, bounds[1:]):
                line, error = _response(request, slice(start, stop), columns, switches, model, created)
                items += len(request.items)
                if error is not None:
                    failed, refused = failed + len(request.items), refused + 1
                    if report.requests_failed + refused <= LOGGED_FAILURES:
                        log.warning("request %r failed: %s", request.custom_id, error.message)
                lines.append(line)
            stats, count = None if part is None else prepared.plan.stats, len(requests)
            phase.add(ScoredWindow(count, items, failed, stats, requests=count, requests_failed=refused))
            sink.write(lines)  # a dry run's sink writes nowhere
            phase.check()
        report.verify = scorer.verify() if scorer is not None else None  # --verify, before the publish
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


def _window(requests: list[BatchRequest], planner: Planner) -> tuple[Window, list[int]]:
    """The requests as a window (a row per engine group: the request's index, the group as query id, the items'
    request positions as item ids) and each request's first item (and the end). Per request, in vLLM's order:
    max_tokens_per_query / max_tokens_per_doc cut the texts; a pair over truncate_prompt_tokens N keeps N tokens,
    or with TEI's truncate one over the model's limit is cut longest first: its own group, or a row with the
    reason as its error. A request whose settings cannot be honoured gets its error here (and no rows)."""
    rows: list[tuple] = []  # (request index, group, query, items, their positions, error)
    bounds, group = [], 0
    for request in requests:
        bounds.append(len(rows))
        if request.error is None and request.use_activation is False and planner.cfg.label_score == "sigmoid":
            request.error = BatchError(
                "unsupported_parameter",
                f"line {request.line}: use_activation false asks for the raw logit, and this run gives its "
                "sigmoid (label_score sigmoid); run with --label-score logit for both",
            )
        if request.error is not None:
            continue
        limits = (request.max_tokens_per_query, request.max_tokens_per_doc)
        by_query: dict[str, list[int]] = {}  # N:N: a group per distinct text_1, in order of first appearance
        for position, query in enumerate(request.queries):
            by_query.setdefault(query, []).append(position)
        try:
            grouped = [
                (at, *cut_texts(query, [request.items[k] for k in at], *limits, planner))
                for query, at in by_query.items()
            ]
        except RequestRefused as refused:
            request.error = BatchError(refused.code, f"line {request.line}: {refused}")
            continue
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
                group, at = group + 1, [positions[k] for k in kept]
                rows.append((request.index, group, query, [items[k] for k in kept], at, None))
            for k, pair in cut.items():
                group += 1
                if isinstance(pair, str):
                    rows.append((request.index, -1, query, [items[k]], [positions[k]], pair))
                else:
                    rows.append((request.index, group, pair.query, pair.items, [positions[k]], None))
    bounds.append(len(rows))
    index, groups, queries, items, positions, errors = [list(c) for c in zip(*rows)] or [[] for _ in range(6)]
    codes, values = encode_queries(queries)
    offsets = np.concatenate([[0], np.cumsum([len(row) for row in items])]).astype(np.int64)
    window = Window(
        np.array(index, np.int64), codes, values, [item for row in items for item in row], offsets, groups, {},
        pa.array([p for row in positions for p in row], pa.int64()), errors,
    )  # fmt: skip
    return window, offsets[bounds].tolist()


def _columns(window: Window, prepared: Prepared, part: pa.Table | None, scorer) -> tuple:
    """[items] of a window: each pair's error (the row's, or the plan's), the prompt tokens up to it ([items +
    1], cumulative), its position in its request; the part's score and scores ([items, num_scores]), None where
    nothing ran (a dry run)."""
    errors = [window.errors[row] for row in window.item_rows().tolist()]
    tokens = np.zeros(window.num_items, np.int64)
    for group, refs in () if part is None else zip(prepared.plan.tokenized, prepared.todo.refs):
        query = len(getattr(group, "query_ids", ()))  # a pair plan's groups have none
        for at, error, ids in zip(refs.tolist(), group.errors, group.item_ids):
            errors[at] = error
            if error is None:
                tokens[at] = query + len(ids)
    tokens, positions = np.concatenate([[0], np.cumsum(tokens)]), window.item_ids.to_numpy()  # [items + 1]
    if part is None or scorer is None:
        return errors, tokens, positions, None, None
    scores = part[SCORES].combine_chunks().values.to_numpy(zero_copy_only=False).reshape(window.num_items, -1)
    return errors, tokens, positions, part[SCORE].to_numpy(), scores


def _response(
    request: BatchRequest, rows: slice, columns: tuple, switches, model: str, created: int
) -> tuple:
    """A request's output line and its error, from its rows of the window's _columns."""
    errors, tokens, positions, score, scores = columns
    values, failures = [math.nan] * len(request.items), [None] * len(request.items)
    ran = score is not None and rows.start < rows.stop
    activated = switches.values(scores[rows], score[rows], request.use_activation) if ran else ()
    for k, position in enumerate(positions[rows].tolist()):
        failures[position] = errors[rows.start + k]
        if ran:
            values[position] = float(activated[k])
            if failures[position] is None and not math.isfinite(values[position]):
                failures[position] = "the model gave a non-finite score"
    scored = None if score is None else values
    return response_line(
        request, scored, failures, int(tokens[rows.stop] - tokens[rows.start]), model, created
    )
