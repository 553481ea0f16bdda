"""Rankings over whole queries: rank 1 = best score, ties by input order; a query's rows come out best first.

A ranking group is the rows of one query: the rows sharing a `query_id` when the input has id columns (one, or
a composite key of several; the query text is not part of the key), else the rows sharing the query text. See
docs/ranking.md. Columnar: the rows sorted once by engine/run/ranking's ranked_order, no Python object per row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from score_batch.engine.run.ranking import ranked_order
from score_batch.io_formats.columns import QUERY_KEY, RANK, SCORE
from score_batch.job.preflight.contract import OutputContract


def rank_parts(parts: list[pa.Table], contract: OutputContract) -> tuple[pa.Table, pa.Table]:
    """Part tables of a whole run (input order, across all windows) → (the output rows ranked, the failed rows
    to list). Ranked: queries in order of first appearance, each query's scored items best first with their
    rank (only the best top_k under top_k), then its failed items (rank null, input order). The whole output
    is held in memory while it is ranked."""
    kept, failed = contract.split(pa.concat_tables(parts or [contract.part_schema().empty_table()]))
    group = pc.dictionary_encode(kept[QUERY_KEY].combine_chunks()).indices  # codes by first appearance
    group = group.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)  # [rows]
    score = kept[SCORE].fill_null(np.nan).to_numpy().astype(np.float64)  # [rows] null or NaN: no rank
    order, rank, unranked = ranked_order(group, score, contract.top_k)
    rank_column = pa.array(rank.astype(np.int32), pa.int32(), mask=unranked)
    schema = contract.ranked_schema()
    ranked = kept.take(pa.array(order, pa.int64()))
    return ranked.add_column(schema.get_field_index(RANK), schema.field(RANK), rank_column), failed
