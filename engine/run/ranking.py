"""Rankings of scored items (pure; no torch): rank 1 = highest score, ties by input order, failed items unranked.

One rule, in ranked_order, for the Python API (`ranks`, `top_k_order`) and the job layer (its rankings and top-k
over whole queries, job/outputs/query_ranking), so both order items the same way. A failed item has the score
None or NaN: it gets no rank and is never in a top-k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ranked_order(groups: np.ndarray, scores: np.ndarray, top_k: int | None) -> tuple[np.ndarray, ...]:
    """(order, rank, failed) over items of several groups: positions by group code, each group's scored items
    best first (equal scores in input order; only the best top_k) then its failed ones (NaN) in input order;
    rank[i] is order[i]'s place in its group (1 = best; meaningless where failed[i])."""
    n = len(scores)
    failed = np.isnan(scores)  # [items]
    order = np.lexsort((np.arange(n), np.where(failed, 0.0, -scores), failed, groups))  # [items]
    starts = np.flatnonzero(np.r_[True, groups[order][1:] != groups[order][:-1]]) if n else np.zeros(0, int)
    rank = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n])) + 1  # [items] place in its group
    keep = failed[order] | (rank <= (top_k if top_k is not None else n))
    return order[keep], rank[keep], failed[order][keep]


def _one_group(scores: Sequence[float | None], top_k: int | None) -> tuple[np.ndarray, ...]:
    """ranked_order of one group's scores (None as NaN)."""
    values = np.array([np.nan if s is None else float(s) for s in scores], np.float64)  # [items]
    return ranked_order(np.zeros(len(values), np.int64), values, top_k)


def top_k_order(scores: Sequence[float | None], k: int | None) -> list[int]:
    """Indices of the k best scored items, best first; equal scores keep input order; failed items never
    appear. k = None gives every scored item; a k beyond the number of scored items gives them all."""
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
        raise ValueError(f"k must be a non-negative integer or None, got {k!r}")
    order, _, failed = _one_group(scores, k)
    return order[~failed].tolist()


def ranks(scores: Sequence[float | None]) -> list[int | None]:
    """Rank of every item in input order: 1 = highest score, ties by input order (earlier first), None if failed."""
    result: list[int | None] = [None] * len(scores)
    for index, rank, failed in zip(*(a.tolist() for a in _one_group(scores, None))):
        result[index] = None if failed else rank
    return result
