"""Runs one score-batch job: read windows, score, checkpoint parts, merge atomically, report."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from cli.config import RunConfig, model_identity
from cli.report import RunReport, versions
from cli.windows import ROW_INDEX, group_window, output_columns
from engine.scorer import Scorer, load_planner
from io_formats.errors import InputError
from io_formats.parts import PartStore
from io_formats.readers import InputSource, open_source, read_windows
from io_formats.writers import (
    STDOUT,
    AtomicTableWriter,
    StdoutJsonlWriter,
    build_schema,
    infer_type,
    output_format,
    rows_to_table,
)

log = logging.getLogger("score_batch")
ERROR_FIELDS = ("row_index", "query_id", "item_id", "error")  # one line of the errors file


class Stopped(Exception):
    """The run was stopped by a signal; completed windows are checkpointed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Turns SIGINT/SIGTERM into a Stopped exception at the next safe point (between batches)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def check(self) -> None:
        """Raise Stopped when a signal arrived."""
        if self.signum is not None:
            raise Stopped(self.signum)


def run_job(config: RunConfig) -> RunReport:
    """Run a whole job under the config; raises InputError / ScoringInputError for user mistakes."""
    started = time.perf_counter()
    report = RunReport(dry_run=config.dry_run, settings=_settings(config), versions=versions())
    source = open_source(config.input)
    fmt = output_format(config.output)
    parts = None if config.output == STDOUT or config.dry_run else _prepare_destination(config)

    load_started = time.perf_counter()
    if config.dry_run:
        planner, setup = load_planner(config.model_dir, config.engine)
        scorer = None
    else:
        scorer = Scorer.from_pretrained(config.model_dir, config.engine)
        planner, setup = scorer.planner, scorer.setup
    report.seconds_load = round(time.perf_counter() - load_started, 3)
    report.backend, report.device = setup.backend, str(setup.device)
    pooled_dim = setup.info.hidden_size if config.engine.scoring.pooled_hidden_states else None

    mapping, windows = read_windows(source, config.columns, config.window_rows)
    if parts is not None:
        fingerprint = config.fingerprint(model_identity(config.model_dir), source.identity())
        _check_resume(parts, fingerprint, config)
        parts.start(fingerprint)
    stdout_writer = None
    # Streaming to stdout has no OUTPUT.errors.jsonl to default to: skipped rows go to --errors-file if given.
    stdout_errors = (
        open(config.errors_file, "w", encoding="utf-8")
        if parts is None and not config.dry_run and config.on_error == "skip" and config.errors_file
        else None
    )
    schema = None
    total = source.total_rows() if mapping.layout == "long" else None
    progress = tqdm(
        total=total,
        unit="item",
        file=sys.stderr,
        dynamic_ncols=True,
        desc="scoring",
        disable=config.quiet or not sys.stderr.isatty(),
    )
    scoring_started = time.perf_counter()
    try:
        with StopSignals() as stop:
            for number, rows in enumerate(windows):
                report.rows_read += len(rows)
                if parts is not None and config.resume and parts.has(number):
                    report.rows_skipped_by_resume += len(rows)
                    progress.update(sum(len(r.item_ids) for r in rows))
                    continue
                if config.on_error == "fail":
                    _fail_on_row_error(rows, source)
                grouped = group_window(rows)
                plan = planner.plan(grouped.groups)
                for name in ("groups", "packs", "batches", "packed_tokens", "pairwise_tokens"):
                    setattr(report, name, getattr(report, name) + getattr(plan.stats, name))
                results = None
                if scorer is not None:

                    def advance(count: int) -> None:
                        progress.update(count)
                        stop.check()

                    results = scorer.run(plan, advance)
                columns = output_columns(rows, grouped, results, mapping.keep, pooled_dim is not None)
                errors = [e for e in columns["error"] if e is not None]
                report.items += len(columns["error"])
                report.items_failed += len(errors)
                if config.dry_run:
                    continue
                report.items_scored += len(columns["error"]) - len(errors)
                if config.on_error == "fail" and errors:
                    raise InputError(
                        f"{source.label}: {errors[0]} (use --on-error record or skip to keep going)"
                    )
                if schema is None:
                    schema = part_schema(columns, mapping.keep, pooled_dim)
                table = rows_to_table(columns, schema)
                if parts is not None:
                    parts.write(number, table)
                else:
                    if stdout_writer is None:
                        stdout_writer = StdoutJsonlWriter(final_schema(schema, config.on_error))
                    _emit(table, stdout_writer, config, stdout_errors)
                stop.check()
    except InputError:
        # A bad row or value: the input must change, which invalidates these parts anyway.
        if parts is not None:
            parts.clear()
        raise
    finally:
        progress.close()
        if stdout_errors is not None:
            stdout_errors.close()
    report.seconds_scoring = round(time.perf_counter() - scoring_started, 3)
    if parts is not None:
        _merge_parts(parts, config, fmt)
    report.seconds_total = round(time.perf_counter() - started, 3)
    report.finish()
    return report


def _prepare_destination(config: RunConfig) -> PartStore:
    """Refuse to clobber an existing output or stray parts unless --overwrite / --resume say so."""
    destination = Path(config.output)
    if not destination.parent.exists():
        raise InputError(f"output directory {str(destination.parent)!r} does not exist")
    parts = PartStore(destination)
    if destination.exists() and not config.overwrite:
        raise InputError(f"output {config.output!r} already exists; pass --overwrite to replace it")
    if parts.exists() and not config.resume:
        if not config.overwrite:
            raise InputError(
                f"a previous run left checkpointed parts in {str(parts.dir)!r}; pass --resume to continue it "
                "or --overwrite to start over"
            )
        parts.clear()
    return parts


def _check_resume(parts: PartStore, fingerprint: str, config: RunConfig) -> None:
    """Refuse to resume parts written with other settings, model or input."""
    previous = parts.fingerprint()
    if config.resume and previous is not None and previous != fingerprint:
        raise InputError(
            f"cannot --resume: the parts in {str(parts.dir)!r} were written with a different model, input or "
            "settings; rerun with the original ones, or pass --overwrite (without --resume) to start over"
        )
    if config.resume and previous is None:
        log.info("nothing to resume in %s; starting from the beginning", parts.dir)


def _fail_on_row_error(rows, source: InputSource) -> None:
    """Under --on-error fail, stop at the first unreadable row before scoring anything."""
    for row in rows:
        if row.error is not None:
            raise InputError(
                f"{source.label}: row {row.index}: {row.error} (use --on-error record or skip to keep going)"
            )


def part_schema(columns: dict, keep: tuple[str, ...], pooled_dim: int | None) -> pa.Schema:
    """The checkpoint schema (all columns, row index and error included), typed from the first window."""
    id_types = (infer_type(columns["query_id"], pa.int64()), infer_type(columns["item_id"], pa.int64()))
    kept = [(name, infer_type(columns[name], pa.string())) for name in keep]
    schema = build_schema(id_types, kept, pooled_dim, with_error=True)
    return schema.insert(0, pa.field(ROW_INDEX, pa.int64()))


def final_schema(schema: pa.Schema, on_error: str) -> pa.Schema:
    """The user-facing schema: no row index; the error column only under --on-error record."""
    schema = schema.remove(schema.get_field_index(ROW_INDEX))
    if on_error != "record":
        schema = schema.remove(schema.get_field_index("error"))
    return schema


def _emit(table: pa.Table, writer, config: RunConfig, errors_out=None) -> None:
    """Write a part's rows to the final writer; under skip, divert failed rows to the errors file."""
    if config.on_error == "skip":
        failed = table.filter(pc.is_valid(table["error"]))
        if failed.num_rows:
            _write_errors(failed, errors_out, config)
        table = table.filter(pc.is_null(table["error"]))
    writer.write(table.select(writer.schema.names).cast(writer.schema))


def error_lines(rows) -> list[str]:
    """The errors-file JSONL lines of skipped rows (dicts with row_index, query_id, item_id, error)."""
    return [json.dumps({k: row[k] for k in ERROR_FIELDS}, default=str) + "\n" for row in rows]


def _write_errors(failed: pa.Table, errors_out, config: RunConfig) -> None:
    """Record skipped rows: in the errors file, or as log lines when there is none."""
    rows = failed.select([ROW_INDEX, *ERROR_FIELDS[1:]]).rename_columns(list(ERROR_FIELDS)).to_pylist()
    if errors_out is not None:
        errors_out.writelines(error_lines(rows))
    else:
        for row in rows:
            log.warning("skipped %s", row["error"])


def _merge_parts(parts: PartStore, config: RunConfig, fmt: str) -> None:
    """Concatenate the parts in order into the destination (temporary file + rename), then drop them."""
    windows = list(parts.windows())
    if not windows:
        raise InputError(f"input {config.input!r} has no rows")
    part_schema = parts.read(windows[0]).schema
    writer = AtomicTableWriter(config.output, final_schema(part_schema, config.on_error), fmt)
    errors_path = Path(config.errors_file or f"{config.output}.errors.jsonl")
    errors_out = open(errors_path, "w", encoding="utf-8") if config.on_error == "skip" else None
    try:
        for window in windows:
            _emit(parts.read(window), writer, config, errors_out)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    finally:
        if errors_out is not None:
            errors_out.close()
            if errors_path.stat().st_size == 0:
                errors_path.unlink()
            else:
                log.warning("skipped rows are listed in %s", errors_path)
    parts.clear()


def _settings(config: RunConfig) -> dict:
    """The run's settings as plain JSON values."""
    import dataclasses

    return json.loads(json.dumps(dataclasses.asdict(config), default=str))
