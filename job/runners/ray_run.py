"""A score-batch run on Ray Data: read units → query groups as Arrow → whole query groups → actor pool of
Scorers → Parquet dir.

Read units (Parquet row groups, whole JSONL files) are read in Ray tasks by io_formats' readers (docs/ray.md:
why) into windows, which travel as the input's own columns (io_formats/window.window_table: Arrow, nothing
pickled); a sort-based shuffle gathers each query's rows from every unit into one row of lists. Actors read a
batch back as a local run reads a batch (readers.table_window) and score it with the local run's scoring step
(job/runners/scoring.score_window), so scores and schema match it, plus `row_index`.
--reuse's joined earlier values wait in a file beside OUTPUT, read by the actors. Ray tasks write the scored
blocks as Parquet into a StagedDirectorySink, named by their rows (a retried task rewrites its own file),
published whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from score_batch.engine.model.setup import load_planner
from score_batch.errors import UserError
from score_batch.io_formats.columns import ERROR, ROW_INDEX, SCORE, TALLY_COLUMNS
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location
from score_batch.io_formats.readers import InputSource, ReadUnit, read_unit, read_units, reader, table_window
from score_batch.io_formats.window import text_type, token_key, window_table
from score_batch.job.checkpoint.identity import RunIdentity
from score_batch.job.outputs.query_ranking import rank_parts
from score_batch.job.outputs.sinks import ErrorsSink, StagedDirectorySink
from score_batch.job.policy import enforce_fail
from score_batch.job.preflight.checks import Checked, preflight, run_contract
from score_batch.job.preflight.contract import OutputContract
from score_batch.job.report import RunReport
from score_batch.job.reuse import EarlierScores, JoinedScores, ScoredPairs, reused_schema
from score_batch.job.run_config import RayOptions, RunConfig
from score_batch.job.runners.phase import ScoredWindow, ScoringPhase
from score_batch.job.runners.scoring import WindowTools, planned, prepare, score_window
from score_batch.job.score_stats import written_scores
from score_batch.job.windows import group_codes
from score_batch.machine import tune_gc, tune_malloc

log = logging.getLogger(__name__)
RAY_HINT = "pip install -e '.[ray]'"
ROWS_PER_PARTITION = 200_000  # input rows per partition of the grouping shuffle
LIGHT_CPUS = 0.5  # logical CPUs of the read and grouping tasks (I/O and Arrow, no model)
CALLS_PER_ACTOR = 2  # batches in an actor at once: the next one is planned while one runs the model
# a block's counts (_counts), as ScoredWindow names them: its items, failed items, then its TALLIES
COUNTS = ("items", "failed", "reused", "reuse_incomplete", "duplicates")
TALLIES = [pa.field(name, pa.int64()) for name in TALLY_COLUMNS]  # counted, never written
GROUP = "__group"  # the read stage's query group key (the grouping shuffle's)


def _read_rows(batch: dict, units: list[ReadUnit], mapping, types: dict, texts) -> pa.Table:
    """Ray Data stage: read units (by their place in units) → their rows as the input's own columns
    (io_formats/window.window_table), in the long layout with each row's query group key (GROUP)."""
    tables = []
    for unit in batch["id"]:
        window = read_unit(units[int(unit)], mapping, types)
        table = window_table(window, mapping, types, texts)
        if mapping.layout == "long":
            table = table.append_column(GROUP, pa.array(_group_keys(window), pa.string()))
        tables.append(table)
    return pa.concat_tables(tables)


def _group_keys(window) -> list[str]:
    """[rows] each row's query group key, the same for a query's rows in every unit; an unreadable row stands
    alone."""
    codes, firsts = group_codes(window)
    ids, keys = window.query_id_values(), []
    for first in firsts:
        query = window.query(first)
        named = (repr(ids[first]), query if isinstance(query, str) else token_key(query))
        keys.append(hashlib.sha256(repr(named).encode()).hexdigest())
    return [keys[code] if code >= 0 else f"row:{i}" for code, i in zip(codes.tolist(), window.index.tolist())]


def _merge_group(group: pa.Table) -> pa.Table:
    """One query group's rows (from every unit holding it) as one row of lists: a batch of whole groups."""
    offsets, rows = pa.array([0, group.num_rows], pa.int32()), group.drop_columns([GROUP])
    return pa.table(
        {
            n: pa.ListArray.from_arrays(offsets, c.combine_chunks())
            for n, c in zip(rows.column_names, rows.columns)
        }
    )


def _joined_rows(reused: Location | None, index: np.ndarray) -> pa.Table | None:
    """--reuse: the joined earlier values of these input rows (a file sorted by row: few row groups read)."""
    if reused is None:
        return None
    dataset = ds.dataset(reused.path, filesystem=reused.fs, format="parquet")
    row = pc.field(ROW_INDEX)
    return dataset.to_table(filter=(row >= int(index.min())) & (row <= int(index.max())) & row.isin(index))


class ScoreActor:
    """Holds one loaded Scorer; scores batches of complete query groups into part-schema tables."""

    def __init__(
        self, config: RunConfig, checked: Checked, contract: OutputContract, reused, threads: int
    ) -> None:
        import torch

        from score_batch.engine.scorer import Scorer

        tune_malloc(os.environ)  # an actor's process is ours, as the CLI's is
        tune_gc()
        torch.set_num_threads(max(1, threads))
        self.mapping, self.types, self.reused = checked.mapping, checked.types, reused
        self.contract = contract
        self.scorer = Scorer.load(config.model_dir, config.engine)
        self.score_key = checked.identity.score_key(self.scorer.setup)  # as this actor resolved the device
        self.pairs = ScoredPairs()  # the pairs this actor wrote: a repeat in a later batch is copied
        self.running = threading.Lock()

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Part rows of the batch's groups (the input's columns: read back as a local run reads a batch) with
        their TALLIES on the first row: REUSED (pairs with values from --reuse), REUSE_INCOMPLETE (pairs found
        there without every value, scored) and DUPLICATES (pairs this actor wrote before, and repeats within
        the batch the plan scored once)."""
        if self.mapping.layout == "long":  # a row per group (_merge_group): the rows of each
            batch = pa.table({n: pc.list_flatten(c) for n, c in zip(batch.column_names, batch.columns)})
        window = table_window(batch, self.mapping, self.types)
        earlier = JoinedScores(_joined_rows(self.reused, window.index))
        tools = WindowTools(self.scorer, self.contract, self.score_key, earlier, self.pairs)
        prepared = planned(prepare(0, window, tools), tools)
        with self.running:  # the next batch is planned while this one runs the model (CALLS_PER_ACTOR)
            part, scored = score_window(prepared, tools, self.scorer)
        tallies = np.zeros((len(TALLIES), part.num_rows), np.int64)
        counted = (scored.reused, scored.reuse_incomplete, scored.duplicates + scored.plan.duplicates)
        tallies[:, :1] = np.array(counted)[:, None]
        return pa.Table.from_arrays([*part.columns, *tallies], schema=_tallied(part.schema))


def _tallied(schema: pa.Schema) -> pa.Schema:
    """A part schema with the actors' per-row tallies."""
    return pa.schema([*schema, *TALLIES])


def check_ray_preflight(config: RunConfig, source: InputSource) -> Checked:
    """A Ray run's preflight: Ray installed, no local-only flags, then the table preflight (a directory output)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise InputError(f"--ray needs Ray Data, which is not installed: {RAY_HINT}") from None
    if config.resume:
        raise InputError("--resume is for local runs; a Ray run retries failed work itself")
    if config.dry_run:
        raise InputError("--dry-run plans on this machine; run it without --ray")
    return preflight(config, source, directory=True)


def run_ray(config: RunConfig, checked: Checked, report: RunReport) -> None:
    """Score on Ray Data and publish a directory of Parquet files (local or object store), filling report."""
    import ray

    options = config.ray or RayOptions()
    report.ray_workers = options.num_workers
    report.versions["ray"] = ray.__version__
    source, destination = checked.source, checked.paths.output
    _, setup = load_planner(config.model_dir, config.engine)  # refuse bad settings before starting workers
    report.add_setup(setup)
    units = read_units(source)
    if not units:
        raise InputError(f"input {config.input!r} has no rows")
    contract = run_contract(config, checked, setup)
    partitioning = contract.partition_schema(config.partition_by) if config.partition_by else None

    if not ray.is_initialized():
        # A local Ray gets one spare logical CPU beyond the actors, so the read and grouping stages
        # can run while every actor holds its CPUs (on a cluster the cluster's sizes apply).
        local_cpus = max(os.cpu_count() or 1, int(options.num_workers * options.cpus_per_worker)) + 1
        with _quiet_core_worker(config.quiet):
            ray.init(
                address=options.address,
                num_cpus=None if options.address else local_cpus,
                include_dashboard=False,
                log_to_driver=not config.quiet,
                logging_level=logging.ERROR if config.quiet else logging.INFO,
            )
    ray.data.DataContext.get_current().enable_progress_bars = not config.quiet
    # The grouping shuffle in Ray tasks (the running workers), not hash-shuffle aggregator actors (new processes)
    ray.data.DataContext.get_current().shuffle_strategy = "sort_shuffle_pull_based"
    if config.quiet:  # Ray Data's own lines on stderr (its log file keeps them)
        for handler in logging.getLogger("ray.data").handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.ERROR)
    gpus = options.gpus_per_worker
    if gpus is None:
        gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 and config.engine.device != "cpu" else 0

    reused = _joined_on_store(config, checked, contract, gpus) if config.reuse else None
    try:
        sink = StagedDirectorySink(destination, contract.ray_schema(), ErrorsSink(checked.paths.errors))
        try:
            total_rows = source.total_rows() or 0
            dataset = _dataset(config, checked, options, units, contract, gpus, reused, total_rows)
            with ScoringPhase(config, report, sink, show_progress=False, immediate_stop=True) as phase:
                with _user_errors():
                    counts = _score_on_ray(dataset, contract, sink, partitioning, phase, source.label)
                summed = {name: sum(c[name] for c in counts) for name in COUNTS}
                phase.add(ScoredWindow(total_rows, **summed))
                phase.commit()
        finally:
            sink.remove()
    finally:
        if reused is not None:
            reused.parent.delete_tree()


@contextlib.contextmanager
def _quiet_core_worker(quiet: bool):
    """Under -q, the driver's Ray core worker (C++) logs below fatal to its session's files only
    (RAY_BACKEND_LOG_LEVEL, unless the caller set it); the line it prints about that goes to /dev/null."""
    if not quiet or "RAY_BACKEND_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["RAY_BACKEND_LOG_LEVEL"] = "fatal"
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
        os.environ.pop("RAY_BACKEND_LOG_LEVEL", None)


def _dataset(config, checked, options, units, contract, gpus, reused, total_rows: int):
    """The Ray Data pipeline: read units → rows (Arrow) → whole query groups → the actor pool (see the module)."""
    import ray

    source, mapping, types = checked.source, checked.mapping, checked.types
    nested = mapping.layout == "nested"
    texts = (_text_type(source, mapping.query, False), _text_type(source, mapping.items, nested))
    dataset = ray.data.range(len(units), override_num_blocks=len(units))  # a unit's place in units
    dataset = dataset.map_batches(
        _read_rows, fn_args=(units, mapping, types, texts), batch_size=1, num_cpus=LIGHT_CPUS
    )
    if not nested:
        partitions = max(2 * options.num_workers, -(-total_rows // ROWS_PER_PARTITION))
        dataset = dataset.groupby(GROUP, num_partitions=partitions).map_groups(
            _merge_group, batch_format="pyarrow", num_cpus=LIGHT_CPUS
        )
    return dataset.map_batches(
        ScoreActor,
        fn_constructor_args=(config, checked, contract, reused, int(options.cpus_per_worker)),
        batch_size=options.groups_per_batch,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(
            size=options.num_workers,
            max_concurrent_calls_per_actor=CALLS_PER_ACTOR,
            enable_true_multi_threading=True,
        ),
        num_cpus=options.cpus_per_worker,
        num_gpus=gpus,
    )  # Ray Data restarts a dead actor and retries its batch (max_restarts/max_task_retries -1 by default)


def _text_type(source: InputSource, name: str, nested: bool) -> pa.DataType:
    """How the query or items column's values travel (io_formats/window.text_type), from the input's type."""
    try:
        return text_type(reader(source).column_type(name), nested)
    except InputError:  # a JSONL column mixing text and token ids
        return text_type(pa.null(), nested)


def _score_on_ray(dataset, contract, sink, partitioning, phase, label: str) -> list[dict]:
    """Run the dataset (failed rows checked or listed, blocks written to staging); every block's counts."""
    import ray

    staging, errors = sink.staging, sink.errors
    if contract.on_error != "record":
        # Failed rows come back as data (exceptions lose their cause on the way from a worker): under
        # fail the first one in input order stops the run, under skip they are listed.
        dataset = dataset.materialize()
        taken = dataset.map_batches(
            lambda part: part.filter(pc.is_valid(part[ERROR])), batch_format="pyarrow"
        ).take_all()
        failed = pa.Table.from_pylist(sorted(taken, key=lambda row: row[ROW_INDEX]), contract.part_schema())
        enforce_fail(contract, failed, label)
        if not contract.ranked:  # ranked runs list them with their query's generated id
            errors.write(failed)
    if contract.ranked:  # rankings span the whole output: gathered and ranked on the driver
        schema = _tallied(contract.part_schema())
        rows = pa.concat_tables(
            [t.cast(schema) for t in ray.get(dataset.to_arrow_refs())] or [schema.empty_table()]
        )
        rows = rows.sort_by(ROW_INDEX)
        phase.add(ScoredWindow(0, 0, 0, scores=rows[SCORE]))  # the distribution before --top-k
        ranked, failed = rank_parts([rows.drop_columns(list(TALLY_COLUMNS))], contract)
        errors.write(failed)
        ranked = contract.ray_view(ranked)
        _write_files(ranked, staging.fs, staging.path, partitioning, "part-000000000000-ranked")
        sink.rows_written = ranked.num_rows
        return _counts(rows).to_pylist()
    counts = dataset.map_batches(
        _write_block,
        fn_args=(contract, staging.fs, staging.path, partitioning),
        batch_size=None,
        batch_format="pyarrow",
        num_cpus=LIGHT_CPUS,
    ).take_all()
    for scores in written_scores(staging.path, staging.fs):  # the distribution, read back from the files
        phase.add(ScoredWindow(0, 0, 0, scores=scores))
    return counts


def _joined_on_store(config: RunConfig, checked: Checked, contract, gpus) -> Location:
    """--reuse: the earlier outputs joined here (keyed as an actor resolves the engine), copied into a hidden
    directory beside OUTPUT, where every read task reaches it."""
    import ray

    task = ray.remote(_actor_score_key).options(num_cpus=LIGHT_CPUS, num_gpus=gpus)
    with _user_errors():  # the device, dtype and ops an actor resolves may differ from this machine's
        key = ray.get(task.remote(config, checked.identity))
    earlier = EarlierScores.join(config, checked.source, key, reused_schema(contract.part_schema()))
    directory = checked.paths.output.temp_sibling(directory=True)  # `.NAME.tmp-…`: a dead run's is removed
    try:
        joined = directory.child("reused.parquet")
        pafs.copy_files(str(earlier.joined), joined.path, destination_filesystem=joined.fs)
    except BaseException:
        directory.delete_tree()
        raise
    finally:
        earlier.close()
    log.info("--reuse: %d pairs found; the actors read them from %s", earlier.matched, directory)
    return joined


def _actor_score_key(config: RunConfig, identity: RunIdentity) -> bytes:
    """Ray task: the score key with the engine as an actor's resources resolve it (no weights loaded)."""
    _, setup = load_planner(config.model_dir, config.engine)
    return identity.score_key(setup)


def _write_block(
    part: pa.Table, contract: OutputContract, fs: pafs.FileSystem, directory: str, partitioning
) -> pa.Table:
    """Ray Data stage: one scored block (part schema) → Parquet file(s) in the staging directory; its counts."""
    kept, _ = contract.split(part)
    # a file name stem fixed by the block's rows, so a retried write task replaces its own files
    stem = f"part-{pc.min(part[ROW_INDEX]).as_py():012d}-{part.num_rows}" if part.num_rows else "part-empty"
    _write_files(contract.ray_view(kept), fs, directory, partitioning, stem)
    return _counts(part)


def _write_files(
    table: pa.Table, fs: pafs.FileSystem, directory: str, partitioning: pa.Schema | None, stem: str
) -> None:
    """Rows in the Ray schema as one Parquet file, or one per partition (`col=value/`, pyarrow's hive flavor)."""
    if table.num_rows == 0:
        return
    if partitioning is None:
        pq.write_table(table, f"{directory}/{stem}.parquet", filesystem=fs)
        return
    ds.write_dataset(
        table,
        directory,
        filesystem=fs,
        format="parquet",
        partitioning=ds.partitioning(partitioning, flavor="hive"),
        basename_template=f"{stem}-{{i}}.parquet",
        use_threads=False,
        max_partitions=1 << 30,  # an id column may put every row in its own partition
        existing_data_behavior="overwrite_or_ignore",
    )


def _counts(part: pa.Table) -> pa.Table:
    """A block's items, failed items (before --on-error skip, as a local run), reused pairs and duplicates."""
    failed = part.num_rows - part[ERROR].null_count
    tallied = [pc.sum(part[name]).as_py() or 0 for name in TALLY_COLUMNS]
    return pa.table({name: [count] for name, count in zip(COUNTS, (part.num_rows, failed, *tallied))})


@contextlib.contextmanager
def _user_errors():
    """A user mistake raised inside a Ray task surfaces as itself (exit 2), found in Ray's wrapper's causes."""
    try:
        yield
    except Exception as error:
        pending, seen = [error], set()
        while pending:
            current = pending.pop()
            if current is None or id(current) in seen:
                continue
            seen.add(id(current))
            if isinstance(current, UserError):
                raise current from None
            pending += [getattr(current, "cause", None), current.__cause__, current.__context__]
        raise
