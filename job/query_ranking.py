"""Rankings over whole queries: rank 1 = best score, ties by input order; a query's rows come out best first.

A ranking group is the rows of one query: the rows sharing a `query_id` when the input has an id column
(the query text is not part of the key), else the rows sharing the query text. Without id columns every row
of a group carries the same generated `query_id`: the row index of the group's first row. See docs/ranking.md.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from score_batch.engine.run.ranking import ranks, top_k_order
from score_batch.io_formats.columns import QUERY_ID, QUERY_KEY, RANK, ROW_INDEX, SCORE
from score_batch.job.contract import OutputContract


def with_group_ids(part: pa.Table, contract: OutputContract) -> pa.Table:
    """Without an id column, give every row the generated query id of its group: its first row's index."""
    if contract.query_ids_given or part.num_rows == 0:
        return part
    firsts = part.select([QUERY_KEY, ROW_INDEX]).group_by(QUERY_KEY).aggregate([(ROW_INDEX, "min")])
    group = pc.index_in(part[QUERY_KEY], value_set=firsts[QUERY_KEY])  # (rows,) each row's group
    ids = firsts[f"{ROW_INDEX}_min"].take(group).cast(part.schema.field(QUERY_ID).type)
    return part.set_column(part.schema.get_field_index(QUERY_ID), QUERY_ID, ids)


def rank_rows(part: pa.Table, contract: OutputContract) -> pa.Table:
    """Rows of every query (input order in, across all windows) → queries in order of first appearance,
    each query's scored items best first with their rank (only the best top_k under top_k), then its
    failed items (rank null, input order). The whole output is held in memory while it is ranked."""
    keys = part[QUERY_KEY].to_pylist()
    scores = part[SCORE].to_pylist()
    members: dict[str, list[int]] = {}
    for position, key in enumerate(keys):
        members.setdefault(key, []).append(position)
    order: list[int] = []
    rank_of: dict[int, int] = {}
    for positions in members.values():
        group_scores = [scores[p] for p in positions]
        group_ranks = ranks(group_scores)
        best = top_k_order(group_scores, contract.top_k or len(positions))
        for index in best:
            order.append(positions[index])
            rank_of[positions[index]] = group_ranks[index]
        order.extend(p for p, r in zip(positions, group_ranks) if r is None)
    ranked = part.take(pa.array(order, pa.int64()))
    rank_column = pa.array([rank_of.get(p) for p in order], pa.int32())
    schema = contract.ranked_schema()
    return ranked.add_column(schema.get_field_index(RANK), schema.field(RANK), rank_column)


def rank_parts(parts: list[pa.Table], contract: OutputContract) -> tuple[pa.Table, pa.Table]:
    """Part tables of a whole run (input order) → (the output rows ranked, the failed rows to list); both
    carry the group ids (with_group_ids), so a skipped row's query_id matches its query's output rows."""
    whole = pa.concat_tables(parts or [contract.part_schema().empty_table()])
    kept, failed = contract.split(with_group_ids(whole, contract))
    return rank_rows(kept, contract), failed
