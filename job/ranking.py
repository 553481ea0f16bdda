"""Rankings over whole queries: rank 1 = best score, ties by input order; a query's rows come out best first."""

from __future__ import annotations

import pyarrow as pa
from score_batch.engine.ranking import ranks, top_k_order
from score_batch.job.contract import QUERY_KEY, RANK, OutputContract


def rank_rows(part: pa.Table, contract: OutputContract) -> pa.Table:
    """Rows of every query (input order in, across all windows) → queries in order of first appearance,
    each query's scored items best first with their rank (only the best top_k under top_k), then its
    failed items (rank null, input order). The whole output is held in memory while it is ranked.
    """
    keys = part[QUERY_KEY].to_pylist()
    scores = part["score"].to_pylist()
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
    """Part tables of a whole run (input order) → (the output rows ranked, the failed rows to list)."""
    kept, failed = contract.split(pa.concat_tables(parts or [contract.part_schema().empty_table()]))
    return rank_rows(kept, contract), failed
