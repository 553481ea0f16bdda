"""Preflight, every check that needs no model weights, run before any model is loaded (a failure is a one-line
exit 2 with the report written): the destination guard, paths and collisions, column names and types from the
input's metadata (or its JSONL lines), the partition columns and the --reuse outputs (job.run checks the
reserved output names and opens the input just before)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyarrow.fs import FileType

from score_batch.io_formats.earlier import open_earlier
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location
from score_batch.io_formats.readers import InputSource, column_types, input_mapping
from score_batch.io_formats.schema import ColumnMapping
from score_batch.io_formats.writers import OUTPUT_FORMATS, STDOUT, SUCCESS, output_format
from score_batch.job.checkpoint.completion import Completion
from score_batch.job.checkpoint.identity import RunIdentity
from score_batch.job.checkpoint.parts import MANIFEST
from score_batch.job.preflight.contract import (
    OutputContract,
    check_jsonl_columns,
    check_partition_by,
    partition_names,
)
from score_batch.job.preflight.paths import (
    RunPaths,
    check_local_container,
    check_run_paths,
    parts_dir,
    written,
)
from score_batch.job.run_config import RunConfig

log = logging.getLogger(__name__)
PLACEHOLDER_POOLED_DIM = 1  # the pooled column's width is not needed to know its name


@dataclass(frozen=True)
class Checked:
    """What preflight established about a run: the open input, the checked output and (tables) the columns."""

    source: InputSource | None  # the table input (None: a runner that reads its input itself)
    paths: RunPaths  # every path the run writes
    mapping: ColumnMapping | None  # None: a batch file, whose requests have no columns
    types: dict[str, pa.DataType]
    identity: RunIdentity | None = (
        None  # job/checkpoint/identity, set by job.run after preflight (None: a batch file)
    )


def preflight(config: RunConfig, source: InputSource, directory: bool = False) -> Checked:
    """Check a table run on its open input before any model load (directory: a Ray run's directory output)."""
    destination = check_destination(config, directory=directory)
    if config.errors_file and config.on_error != "skip":
        instead = {"record": "failed rows stay in the output with their error"}.get(
            config.on_error, "the first failed row stops the run"
        )
        log.warning(
            "--errors-file %s is written only under --on-error skip; under --on-error %s %s",
            config.errors_file, config.on_error, instead,
        )  # fmt: skip
    paths = check_run_paths(config, source.files, destination, source.directories)
    mapping = input_mapping(source, config.columns)
    types = column_types(source, mapping)
    check_jsonl_columns(mapping, types, config.output)
    if config.partition_by:  # partition columns must be usable output columns (not lists, …)
        output_contract(config, mapping, types, PLACEHOLDER_POOLED_DIM).partition_schema(config.partition_by)
    open_earlier(config.reuse, config.storage_options, config.reuse_missing_ok)  # they exist, with score keys
    return Checked(source, paths, mapping, types)


def output_contract(
    config: RunConfig, mapping: ColumnMapping, types: dict, hidden_size: int
) -> OutputContract:
    """This run's output contract (hidden_size: the pooled column's width, when pooled states are asked for)."""
    pooled_dim = hidden_size if config.engine.scoring.pooled_hidden_states else None
    return OutputContract.from_types(
        mapping, types, pooled_dim, config.on_error, config.rank, config.top_k, config.chunked
    )


def run_contract(config: RunConfig, checked: Checked, setup) -> OutputContract:
    """The run's output contract once the model is known (setup: its ResolvedSetup, for the pooled width);
    with --partition-by, the limits its directory names meet (checked per window before it is scored)."""
    contract = output_contract(config, checked.mapping, checked.types, setup.info.hidden_size)
    if not config.partition_by:
        return contract
    return dataclasses.replace(
        contract, partition_names=partition_names(config.partition_by, checked.paths.output)
    )


def check_destination(config: RunConfig, directory: bool) -> Location | None:
    """Refuse an output we may not create or replace; None for stdout. directory: a Ray run's output (with
    --partition-by the output is a directory too, and the partition columns must be ids or kept columns)."""
    text, name = config.output, "output"
    partitioned = bool(config.partition_by)
    if partitioned:
        check_partition_by(config.partition_by, config.columns.keep_columns)
    dataset = directory or partitioned
    writer = "--partition-by" if partitioned else "--ray"
    if text == STDOUT:
        if directory:
            raise InputError(f"{writer} writes a directory of Parquet files; give -o OUTPUT_DIR, not -")
        return None
    if partitioned and Path(text.rstrip("/")).suffix.lower() in OUTPUT_FORMATS:
        raise InputError(
            f"{name} {text!r}: --partition-by writes a directory of Parquet files; "
            "give a directory path (without .parquet or .jsonl)"
        )
    destination = written(config, text)
    check_local_container(name, destination)  # a file in the way, or a place that takes no files
    missing = destination.missing_container()
    if missing is not None:
        raise InputError(missing)
    kind = destination.info().type
    if kind == FileType.Directory and not dataset:
        raise InputError(f"{name} {text!r} is a directory; give a .parquet or .jsonl file path")
    if not dataset:
        output_format(text)  # a .csv output fails here, in a dry run too
    if kind == FileType.File and dataset:
        raise InputError(f"{name} {text!r} is a file; {writer} writes a directory of Parquet files")
    if (
        kind == FileType.Directory
        and (config.resume or config.overwrite)
        and _unfinished_publish(destination)
    ):
        log.info("%s holds a publish of this output cut off midway; this run replaces it", destination)
        return destination
    if kind != FileType.NotFound and not config.overwrite:
        # an output --resume finds recorded as complete goes on (job.run checks it against the input)
        if not (config.resume and Completion(destination, partitioned).exists()):
            raise InputError(f"{name} {text!r} already exists; pass --overwrite to replace it")
    if kind == FileType.Directory and dataset and config.overwrite:  # only an empty or finished dataset
        names = destination.list_names() + destination.list_directories()
        if names and SUCCESS not in names:
            raise InputError(
                f"{name} {text!r} is a directory without a {SUCCESS} marker, so not a dataset this "
                "tool wrote; --overwrite will not delete it: remove it yourself or choose another path"
            )
    return destination


def _unfinished_publish(destination: Location) -> bool:
    """A dataset prefix without _SUCCESS beside this output's checkpoints: an object store's publish cut off."""
    return (
        destination.publishes_in_steps
        and not destination.child(SUCCESS).exists()
        and parts_dir(destination).child(MANIFEST).exists()
    )
