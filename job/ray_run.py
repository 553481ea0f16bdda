"""A score-batch run on Ray Data: read units → rows → whole query groups → actor pool of Scorers → Parquet dir.

Each actor loads the model once and scores batches of complete query groups with the same code as a
local run (group_window → Scorer → output_columns), so scores and schema match a local run; every
output row also carries the input's `row_index`. Ray restarts a dead actor and retries its batch.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.scorer import load_planner
from io_formats.errors import InputError
from io_formats.readers import InputSource, column_types, input_mapping, read_unit, read_units
from io_formats.writers import exclusive_temp
from job.config import RayOptions, RunConfig
from job.contract import ERROR, ROW_INDEX, OutputContract
from job.lock import OutputLock
from job.policy import (
    ErrorsSink,
    default_errors_path,
    enforce_fail,
    errors_path,
    publish_directory,
    remove_leftovers,
)
from job.ranking import rank_rows
from job.report import RunReport
from job.windows import group_window, output_columns, query_group_key
from score_batch.errors import UserError

log = logging.getLogger(__name__)
RAY_HINT = "pip install -e '.[ray]'"
ROWS_PER_PARTITION = 200_000  # input rows per hash partition of the grouping shuffle
LIGHT_CPUS = 0.5  # logical CPUs of the read and grouping tasks (I/O and pickling, no model)
FAULT_ONCE_ENV = "SCORE_BATCH_FAULT_ONCE"  # fault injection for tests: a marker file path


def _read_rows(batch: dict, mapping, types: dict) -> dict:
    """Ray Data stage: read units → rows keyed by query group (pickled InputRows)."""
    keys, blobs = [], []
    for unit in batch["unit"]:
        for row in read_unit(pickle.loads(unit), mapping, types):
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
    """Holds one loaded Scorer; scores batches of complete query groups into part-schema tables."""

    def __init__(self, config: RunConfig, contract: OutputContract, threads: int) -> None:
        import torch

        from engine.scorer import Scorer

        torch.set_num_threads(max(1, threads))
        self.config = config
        self.contract = contract
        self.scorer = Scorer.load(config.model_dir, config.engine)

    def __call__(self, batch: pa.Table) -> pa.Table:
        _maybe_inject_fault()
        rows = sorted(
            (row for blob in batch.column("rows").to_pylist() for row in pickle.loads(blob)),
            key=lambda row: row.index,
        )
        grouped = group_window(rows)
        results = self.scorer.score(grouped.groups)
        contract = self.contract
        columns = output_columns(rows, grouped, results, contract)
        part = self.contract.part_table(columns)
        return part


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


def check_ray_run(config: RunConfig) -> None:
    """What a Ray run refuses before anything starts."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise InputError(f"--ray needs Ray Data, which is not installed: {RAY_HINT}") from None
    if config.resume:
        raise InputError("--resume is for local runs; a Ray run retries failed work itself")
    if config.dry_run:
        raise InputError("--dry-run plans on this machine; run it without --ray")
    from io_formats.locations import is_uri

    if any(is_uri(text) and not text.startswith("file://") for text in (*config.inputs, config.output)):
        raise InputError(
            "--ray reads and writes local (or shared) paths; object-store URIs are for local runs for now"
        )


def run_ray(config: RunConfig, source: InputSource, destination: Path, report: RunReport) -> None:
    """Run a checked job on Ray Data, filling report; writes a directory of Parquet files at destination."""
    import ray

    options = config.ray or RayOptions()
    started = time.perf_counter()
    report.ray_workers = options.num_workers
    report.versions["ray"] = ray.__version__
    with OutputLock(destination):
        _run_locked(config, options, source, destination, report, started)


def _run_locked(
    config, options: RayOptions, source, destination: Path, report: RunReport, started: float
) -> None:
    """The Ray run, once the paths are checked and the output directory is ours."""
    import ray

    remove_leftovers(destination, default_errors_path(destination), errors_path(config))
    _, setup = load_planner(config.model_dir, config.engine)  # refuse bad settings before starting workers
    report.backend, report.device = setup.backend, str(setup.device)
    mapping = input_mapping(source, config.columns)
    units = read_units(source)
    if not units:
        raise InputError(f"input {config.input!r} has no rows")
    pooled_dim = setup.info.hidden_size if config.engine.scoring.pooled_hidden_states else None
    types = column_types(source, mapping)
    contract = OutputContract.from_types(
        mapping, types, pooled_dim, config.on_error, config.rank, config.top_k
    )

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
        fn_args=(mapping, types),
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
        fn_constructor_args=(config, contract, int(options.cpus_per_worker)),
        batch_size=options.groups_per_batch,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=options.num_workers),
        num_cpus=options.cpus_per_worker,
        num_gpus=gpus,
    )  # Ray Data restarts a dead actor and retries its batch (max_restarts/max_task_retries -1 by default)
    staging = exclusive_temp(destination, directory=True)
    errors = ErrorsSink(errors_path(config))
    try:
        try:
            if config.on_error != "record":
                # Failed rows come back as data (exceptions lose their cause on the way from a worker):
                # under fail the first one in input order stops the run, under skip they are listed.
                dataset = dataset.materialize()
                failed = _sorted_table(
                    dataset.map_batches(_failed_rows, batch_format="pyarrow").take_all(), contract
                )
                enforce_fail(contract, failed, source.label)
                errors.write(failed)
            if contract.ranked:  # rankings span the whole output: gathered and ranked on the driver
                _write_ranked(dataset, contract, staging)
            else:
                dataset = dataset.map_batches(_output_rows, fn_args=(contract,), batch_format="pyarrow")
                dataset.write_parquet(str(staging))
        except Exception as error:
            user_error = _user_error(error)
            if user_error is not None:
                raise user_error from None
            raise
        publish_directory(staging, destination)
        errors.commit()
    except BaseException:
        errors.abort()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report.items_skipped = errors.count
    _fill_report(report, destination, config, started)


def _user_error(error: BaseException) -> UserError | None:
    """The user mistake raised inside a Ray task, if any (Ray wraps it; its cause chain keeps the original)."""
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, UserError):
            return current
        pending += [getattr(current, "cause", None), current.__cause__, current.__context__]
    return None


def _write_ranked(dataset, contract: OutputContract, staging: Path) -> None:
    """All scored rows in input order, ranked per query, written as one Parquet file of the Ray schema."""
    import ray

    tables = ray.get(dataset.to_arrow_refs()) or [contract.part_schema().empty_table()]
    rows = pa.concat_tables([t.cast(contract.part_schema()) for t in tables]).sort_by(ROW_INDEX)
    kept, _ = contract.split(rows)
    pq.write_table(contract.ray_view(rank_rows(kept, contract)), staging / "part-00000.parquet")


def _failed_rows(table: pa.Table) -> pa.Table:
    """Rows that carry an error (part schema)."""
    return table.filter(pc.is_valid(table[ERROR]))


def _output_rows(table: pa.Table, contract: OutputContract) -> pa.Table:
    """Rows of the output directory, in the contract's Ray schema (failed rows left out under skip)."""
    kept, _ = contract.split(table)
    return contract.ray_view(kept)


def _sorted_table(rows: list[dict], contract: OutputContract) -> pa.Table:
    """Failed rows gathered from the workers, back in input order."""
    rows = sorted(rows, key=lambda row: row[ROW_INDEX])
    return pa.Table.from_pylist(rows, schema=contract.part_schema())


def _fill_report(report: RunReport, destination: Path, config: RunConfig, started: float) -> None:
    """Counts read back from the written files."""
    names = ["score", ROW_INDEX] + ([ERROR] if config.on_error == "record" else [])
    table = pq.read_table(destination, columns=names)
    report.rows_read = len(pc.unique(table.column(ROW_INDEX)))
    if config.on_error == "record":
        report.items_failed = table.num_rows - table.column(ERROR).null_count
    else:
        report.items_failed = report.items_skipped
    report.items = table.num_rows + report.items_skipped
    report.items_scored = int(pc.sum(pc.is_valid(table.column("score"))).as_py() or 0)
    report.seconds_total = report.seconds_scoring = round(time.perf_counter() - started, 3)
    report.finish()
