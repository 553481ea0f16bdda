"""Preflight: every check that needs no model weights, run before any model is loaded.

Paths and collisions, column names and types from the input's metadata (or its JSONL lines), the partition
columns and the --reuse outputs (job.run checks the reserved output names and opens the input just before).
A failure here is a one-line exit 2 with the report written, and no model loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from score_batch.io_formats.earlier import open_earlier
from score_batch.io_formats.readers import InputSource, column_types, input_mapping
from score_batch.io_formats.schema import ColumnMapping
from score_batch.job.contract import OutputContract, check_jsonl_columns
from score_batch.job.identity import RunIdentity
from score_batch.job.paths import RunPaths, check_run_paths
from score_batch.job.policy import check_destination
from score_batch.job.run_config import RunConfig

PLACEHOLDER_POOLED_DIM = 1  # the pooled column's width is not needed to know its name


@dataclass(frozen=True)
class Checked:
    """What preflight established about a run: the open input, the checked output and (tables) the columns."""

    source: InputSource | None  # the table input (None: a runner that reads its input itself)
    paths: RunPaths  # every path the run writes
    mapping: ColumnMapping | None  # None: a batch file, whose requests have no columns
    types: dict[str, pa.DataType]
    identity: RunIdentity | None = None  # job/identity, set by job.run after preflight (None: a batch file)

    @property
    def destination(self):
        """The checked output (a Location: a local path or an object store); None for stdout."""
        return self.paths.output


def preflight(config: RunConfig, source: InputSource, directory: bool = False) -> Checked:
    """Check a table run on its open input before any model load (directory: a Ray run's directory output)."""
    destination = check_destination(config, directory=directory)
    if config.ranked_output:
        check_destination(config, directory=directory, ranked=True)
    paths = check_run_paths(config, source.files, destination, source.directories)
    mapping = input_mapping(source, config.columns)
    types = column_types(source, mapping)
    check_jsonl_columns(mapping, types, config.output)
    if config.partition_by:  # partition columns must be usable output columns (not lists, …)
        pooled = PLACEHOLDER_POOLED_DIM if config.engine.scoring.pooled_hidden_states else None
        output_contract(config, mapping, types, pooled).partition_schema(config.partition_by)
    open_earlier(config.reuse, config.storage_options, config.reuse_missing_ok)  # they exist, with score keys
    return Checked(source, paths, mapping, types)


def output_contract(config: RunConfig, mapping: ColumnMapping, types: dict, pooled_dim: int | None):
    """This run's output contract (pooled_dim: the model's hidden size, when pooled states are asked for)."""
    return OutputContract.from_types(
        mapping, types, pooled_dim, config.on_error, config.rank, config.top_k, config.chunked
    )


def run_contract(config: RunConfig, checked: Checked, setup) -> OutputContract:
    """The run's output contract once the model is known (setup: its ResolvedSetup, for the pooled width)."""
    pooled_dim = setup.info.hidden_size if config.engine.scoring.pooled_hidden_states else None
    return output_contract(config, checked.mapping, checked.types, pooled_dim)
