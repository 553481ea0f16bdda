"""Preflight: every check that needs no model weights, run before any model is loaded.

Paths and collisions, existence of inputs, column names and types from the input's metadata (or its
JSONL lines), reserved output names and the partition columns. A failure here is a one-line exit 2
with the report written, and no model was loaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pyarrow as pa
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.readers import InputSource, column_types, input_mapping, open_source
from score_batch.io_formats.schema import ColumnMapping
from score_batch.job.config import RunConfig
from score_batch.job.contract import ROW_INDEX, OutputContract
from score_batch.job.paths import RunPaths, check_run_paths
from score_batch.job.policy import check_destination

PLACEHOLDER_POOLED_DIM = 1  # the pooled column's width is not needed to know its name


@dataclass(frozen=True)
class Checked:
    """What preflight established about a table run: the open input, the checked output and the columns."""

    source: InputSource | None  # the table input (None: a runner that reads its input itself)
    paths: RunPaths  # every path the run writes
    mapping: ColumnMapping
    types: dict[str, pa.DataType]

    @property
    def destination(self):
        """The checked output (a local Path or an object-store Location); None for stdout."""
        return self.paths.output


def preflight(config: RunConfig, directory: bool = False) -> Checked:
    """Check a table run before any model load (directory: the output is a directory of Parquet files, as
    for Ray); the caller closes the returned source."""
    source = open_source(config.inputs, config.storage_options)
    try:
        destination = check_destination(config, directory=directory)
        paths = check_run_paths(config, source.files, destination, source.directories)
        mapping = input_mapping(source, config.columns)
        types = column_types(source, mapping)
        check_output_names(config, mapping, types)
    except BaseException:
        source.close()
        raise
    return Checked(source, paths, mapping, types)


def output_contract(config: RunConfig, mapping: ColumnMapping, types: dict, pooled_dim: int | None):
    """The output contract of this run (pooled_dim: the model's hidden size, when pooled states are asked for)."""
    return OutputContract.from_types(mapping, types, pooled_dim, config.on_error, config.rank, config.top_k)


def check_output_names(config: RunConfig, mapping: ColumnMapping, types: dict) -> None:
    """Kept columns may not take a name the output itself writes; partition columns must be usable."""
    pooled = PLACEHOLDER_POOLED_DIM if config.engine.scoring.pooled_hidden_states else None
    contract = output_contract(config, mapping, types, pooled)
    written = reserved_names(contract)
    clash = [name for name in mapping.keep if name in written]
    if clash:
        names = ", ".join(repr(name) for name in clash)
        raise InputError(
            f"--keep-columns {names}: the output writes a column of that name itself "
            f"(its own columns: {', '.join(sorted(written))}); leave it out or rename it in the input"
        )
    if config.partition_by:
        contract.partition_schema(config.partition_by)


def reserved_names(contract: OutputContract) -> set[str]:
    """Every column name this run's output contract writes itself (parts, final file, Ray files)."""
    own = dataclasses.replace(contract, kept=())  # the columns written without any kept column
    schema = own.ranked_schema() if own.ranked else own.part_schema()
    return set(schema.names) | {ROW_INDEX, "pooled_hidden_state"}
