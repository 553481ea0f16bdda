"""Rankings of scored items (pure; no torch): rank 1 = highest score, ties by input order, failed items unranked.

Shared by the Python API (`Scorer.rank`) and the job layer (its rank and top-k options), so both order items the same
way. A failed item has the score None or NaN: it gets no rank and is never in a top-k.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence


def _is_scored(score: float | None) -> bool:
    """True for a real score (not None, not NaN)."""
    return score is not None and not math.isnan(float(score))


def top_k_order(scores: Sequence[float | None], k: int | None) -> list[int]:
    """Indices of the k best scored items, best first; equal scores keep input order; failed items never
    appear. k = None gives every scored item; a k beyond the number of scored items gives them all."""
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
        raise ValueError(f"k must be a non-negative integer or None, got {k!r}")
    scored = [(-float(score), index) for index, score in enumerate(scores) if _is_scored(score)]
    if k is None or k >= len(scored):
        best = sorted(scored)
    else:
        best = heapq.nsmallest(k, scored)  # (−score, index): highest score first, then earliest input
    return [index for _, index in best]


def ranks(scores: Sequence[float | None]) -> list[int | None]:
    """Rank of every item in input order: 1 = highest score, ties by input order (earlier first), None if failed."""
    result: list[int | None] = [None] * len(scores)
    for rank, index in enumerate(top_k_order(scores, None), start=1):
        result[index] = rank
    return result
