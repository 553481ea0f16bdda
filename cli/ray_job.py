"""A score-batch run on Ray Data: read units → rows → whole query groups → actor pool of Scorers → Parquet dir.

Each actor loads the model once and scores batches of complete query groups with the same code as a
local run (group_window → Scorer → output_columns), so scores and schema match a local run; every
output row also carries the input's `row_index`. Ray restarts a dead actor and retries its batch.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cli.config import RunConfig
from cli.report import RunReport, versions
from cli.runner import error_lines, final_schema, part_schema
from cli.windows import ROW_INDEX, group_window, output_columns, query_group_key
from engine.errors import ScoringInputError
from engine.scorer import load_planner
from io_formats.errors import InputError
from io_formats.readers import ReadUnit, input_mapping, open_source, read_unit, read_units

log = logging.getLogger("score_batch")
RAY_HINT = "pip install -e '.[ray]'"
ROW_INDEX_COLUMN = "row_index"
ROWS_PER_PARTITION = 200_000  # input rows per hash partition of the grouping shuffle
LIGHT_CPUS = 0.5  # logical CPUs of the read and grouping tasks (I/O and pickling, no model)
FAULT_ONCE_ENV = "SCORE_BATCH_FAULT_ONCE"  # fault injection for tests: a marker file path


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide a Ray run goes."""

    address: str | None = None  # None: start a local Ray; "auto": join the running cluster
    num_workers: int = 1
    gpus_per_worker: float | None = None  # None: 1 when the cluster has GPUs and the device allows, else 0
    cpus_per_worker: float = 1.0
    groups_per_batch: int = 64


def _read_rows(batch: dict, mapping, fail_on_error: bool, source_label: str) -> dict:
    """Ray Data stage: read units → rows keyed by query group (pickled InputRows)."""
    keys, blobs = [], []
    for unit in batch["unit"]:
        for row in read_unit(pickle.loads(unit), mapping):
            if row.error is not None and fail_on_error:
                raise InputError(
                    f"{source_label}: row {row.index}: {row.error} (use --on-error record or skip)"
                )
            keys.append(_group_key(row, mapping.layout))
            blobs.append(pickle.dumps(row))
    return {"group": keys, "rows": blobs}


def _group_key(row, layout: str) -> str:
    """Rows of one long-layout query share a key (as in group_window); other rows stand alone."""
    if layout != "long" or row.error is not None:
        return f"row:{row.index}"
    return repr(query_group_key(row))


def _collapse_group(group: pa.Table) -> pa.Table:
    """One query group (all its rows) → one row holding the pickled list of rows."""
    rows = [pickle.loads(blob) for blob in group.column("rows").to_pylist()]
    return pa.table({"rows": pa.array([pickle.dumps(rows)], pa.binary())})


def _wrap_rows(batch: pa.Table) -> pa.Table:
    """Nested layout: each row is already a group of its own."""
    rows = [pickle.dumps([pickle.loads(blob)]) for blob in batch.column("rows").to_pylist()]
    return pa.table({"rows": pa.array(rows, pa.binary())})


class ScoreActor:
    """Holds one loaded Scorer; scores batches of complete query groups into output tables."""

    def __init__(self, config: RunConfig, schema: pa.Schema, threads: int) -> None:
        import torch

        from engine.scorer import Scorer

        torch.set_num_threads(max(1, threads))
        self.config = config
        self.schema = schema
        self.scorer = Scorer.from_pretrained(config.model_dir, config.engine)
        self.keep = config.columns.keep_columns
        self.pooled = config.engine.scoring.pooled_hidden_states

    def __call__(self, batch: pa.Table) -> pa.Table:
        _maybe_inject_fault()
        rows = sorted(
            (row for blob in batch.column("rows").to_pylist() for row in pickle.loads(blob)),
            key=lambda row: row.index,
        )
        grouped = group_window(rows)
        results = self.scorer.score(grouped.groups)
        columns = output_columns(rows, grouped, results, self.keep, self.pooled)
        if self.config.on_error == "fail":
            first = next((e for e in columns["error"] if e is not None), None)
            if first is not None:
                raise InputError(
                    f"{self.config.input}: {first} (use --on-error record or skip to keep going)"
                )
        columns[ROW_INDEX_COLUMN] = columns.pop(ROW_INDEX)
        return pa.Table.from_arrays(
            [pa.array(columns[f.name], type=f.type) for f in self.schema], schema=self.schema
        )


def _maybe_inject_fault() -> None:
    """Tests: kill this worker process once (the first call that finds no marker file creates it)."""
    marker = os.environ.get(FAULT_ONCE_ENV)
    if marker:
        try:
            with open(marker, "x"):
                pass
        except FileExistsError:
            return
        os._exit(1)


def _sample_schema(config: RunConfig, units: list[ReadUnit], mapping, pooled_dim: int | None) -> pa.Schema:
    """The output schema a local run would infer, typed from the first unit's rows; plus row_index."""
    rows = read_unit(units[0], mapping)[: config.window_rows]
    columns = output_columns(rows, group_window(rows), None, mapping.keep, pooled_dim is not None)
    schema = final_schema(part_schema(columns, mapping.keep, pooled_dim), config.on_error)
    if config.on_error == "skip":
        schema = schema.append(pa.field("error", pa.string()))
    return schema.append(pa.field(ROW_INDEX_COLUMN, pa.int64()))


def run_ray_job(config: RunConfig, options: RayOptions) -> RunReport:
    """Run a job on Ray Data and write a directory of Parquet files at config.output."""
    try:
        import ray
    except ImportError:
        raise InputError(f"--ray needs Ray Data, which is not installed: {RAY_HINT}") from None
    started = time.perf_counter()
    report = RunReport(
        ray_workers=options.num_workers,
        settings={"ray": options.__dict__},
        versions={**versions(), "ray": ray.__version__},
    )
    source = open_source(config.input)
    destination = _check_destination(config)
    _, setup = load_planner(config.model_dir, config.engine)  # refuse bad settings before starting workers
    report.backend, report.device = setup.backend, str(setup.device)
    mapping = input_mapping(source, config.columns)
    units = read_units(source)
    if not units:
        raise InputError(f"input {config.input!r} has no rows")
    pooled_dim = setup.info.hidden_size if config.engine.scoring.pooled_hidden_states else None
    schema = _sample_schema(config, units, mapping, pooled_dim)

    if not ray.is_initialized():
        # A local Ray gets one spare logical CPU beyond the actors, so the read and grouping stages
        # can run while every actor holds its CPUs (on a cluster the cluster's sizes apply).
        local_cpus = max(os.cpu_count() or 1, int(options.num_workers * options.cpus_per_worker)) + 1
        ray.init(
            address=options.address,
            num_cpus=None if options.address else local_cpus,
            include_dashboard=False,
            log_to_driver=not config.quiet,
        )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = not config.quiet
    gpus = options.gpus_per_worker
    if gpus is None:
        gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 and config.engine.device != "cpu" else 0

    dataset = ray.data.from_items([{"unit": pickle.dumps(u)} for u in units], override_num_blocks=len(units))
    dataset = dataset.map_batches(
        _read_rows,
        fn_args=(mapping, config.on_error == "fail", source.label),
        batch_size=1,
        num_cpus=LIGHT_CPUS,
    )
    if mapping.layout == "long":
        partitions = max(2 * options.num_workers, -(-(source.total_rows() or 0) // ROWS_PER_PARTITION))
        dataset = dataset.groupby("group", num_partitions=partitions).map_groups(
            _collapse_group, batch_format="pyarrow", num_cpus=LIGHT_CPUS
        )
    else:
        dataset = dataset.map_batches(_wrap_rows, batch_format="pyarrow", num_cpus=LIGHT_CPUS)
    dataset = dataset.map_batches(
        ScoreActor,
        fn_constructor_args=(config, schema, int(options.cpus_per_worker)),
        batch_size=options.groups_per_batch,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=options.num_workers),
        num_cpus=options.cpus_per_worker,
        num_gpus=gpus,
    )  # Ray Data restarts a dead actor and retries its batch (max_restarts/max_task_retries -1 by default)
    staging = destination.with_name(f".{destination.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        try:
            if config.on_error == "skip":
                dataset = dataset.materialize()
                failed = dataset.map_batches(_failed_rows, batch_format="pyarrow")
                report.items_failed = _write_errors(failed, config)
                dataset = dataset.map_batches(_scored_rows, batch_format="pyarrow")
            dataset.write_parquet(str(staging))
        except Exception as error:
            message = _user_error(error)
            if message is not None:
                raise InputError(message) from None
            raise
        _publish(staging, destination, config.overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _fill_report(report, destination, config, started)
    return report


def _user_error(error: BaseException) -> str | None:
    """The message of a user mistake (InputError / ScoringInputError) raised inside a Ray task, if any."""
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, (InputError, ScoringInputError)):
            return str(current)
        pending += [getattr(current, "cause", None), current.__cause__, current.__context__]
    match = re.search(r"(?:InputError|ScoringInputError): (.+)", str(error))
    return match.group(1).strip() if match else None


def _failed_rows(table: pa.Table) -> pa.Table:
    """Rows that carry an error (Arrow types kept)."""
    return table.filter(pc.is_valid(table["error"]))


def _scored_rows(table: pa.Table) -> pa.Table:
    """Rows without an error, without the error column (Arrow types kept)."""
    return table.filter(pc.is_null(table["error"])).drop_columns(["error"])


def _check_destination(config: RunConfig) -> Path:
    """OUTPUT_DIR must be a directory path we may create (or replace with --overwrite)."""
    if config.output == "-":
        raise InputError("--ray writes a directory of Parquet files; give -o OUTPUT_DIR, not -")
    if config.resume:
        raise InputError("--resume is for local runs; a Ray run retries failed work itself")
    if config.dry_run:
        raise InputError("--dry-run plans on this machine; run it without --ray")
    destination = Path(config.output)
    if destination.exists() and not config.overwrite:
        raise InputError(f"output {config.output!r} already exists; pass --overwrite to replace it")
    if destination.exists() and not destination.is_dir():
        raise InputError(f"output {config.output!r} is a file; --ray writes a directory of Parquet files")
    if not destination.parent.exists():
        raise InputError(f"output directory {str(destination.parent)!r} does not exist")
    return destination


def _publish(staging: Path, destination: Path, overwrite: bool) -> None:
    """Move the finished staging directory to the destination (replacing it under --overwrite)."""
    if destination.exists() and overwrite:
        old = destination.with_name(f".{destination.name}.old-{os.getpid()}")
        destination.rename(old)
        staging.rename(destination)
        shutil.rmtree(old)
    else:
        staging.rename(destination)


def _write_errors(failed, config: RunConfig) -> int:
    """Under --on-error skip: list skipped rows in the errors file (JSONL), as a local run does."""
    path = Path(config.errors_file or f"{config.output}.errors.jsonl")
    rows = failed.take_all()
    if not rows:
        return 0
    rows = [{**row, "row_index": row[ROW_INDEX_COLUMN]} for row in rows]
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(error_lines(sorted(rows, key=lambda r: r["row_index"])))
    log.warning("skipped rows are listed in %s", path)
    return len(rows)


def _fill_report(report: RunReport, destination: Path, config: RunConfig, started: float) -> None:
    """Counts read back from the written files."""
    names = ["score", ROW_INDEX_COLUMN] + (["error"] if config.on_error == "record" else [])
    table = pq.read_table(destination, columns=names)
    report.rows_read = len(pc.unique(table.column(ROW_INDEX_COLUMN)))
    if config.on_error == "record":
        report.items_failed = table.num_rows - table.column("error").null_count
    report.items = table.num_rows + (report.items_failed if config.on_error == "skip" else 0)
    report.items_scored = int(pc.sum(pc.is_valid(table.column("score"))).as_py() or 0)
    report.seconds_total = report.seconds_scoring = round(time.perf_counter() - started, 3)
    report.finish()
