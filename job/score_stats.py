"""The distribution of a run's scores and of its items per query, for the report (alerting on a drifted model).

Memory is bounded whatever the run's size: count, min, max and mean are exact; the quantiles are exact up to
SAMPLE_SIZE finite scores and beyond that come from a uniform random sample of SAMPLE_SIZE scores (reservoir
sampling with a fixed seed, so the same input gives the same report). Items per query are kept as a histogram
of group sizes (one counter per distinct size), so their min, median and max are always exact.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

SAMPLE_SIZE = 100_000  # scores kept for the quantiles: 800 kB; rank error of a sampled quantile ≲ 0.5 points
QUANTILES = (0.01, 0.05, 0.25, 0.50, 0.75, 0.95, 0.99)


def quantile_name(q: float) -> str:
    """0.05 → 'p05'."""
    return f"p{round(q * 100):02d}"


class ScoreStats:
    """Accumulates finite scores (non-finite and missing ones are only counted) and items per query."""

    def __init__(self, sample_size: int = SAMPLE_SIZE, seed: int = 0) -> None:
        if sample_size < 1:
            raise ValueError(f"sample_size must be at least 1, got {sample_size}")
        self.sample_size = sample_size
        self.count = 0  # finite scores seen
        self.non_finite = 0  # NaN / ±inf scores left out of the distribution
        self._min = float("inf")
        self._max = float("-inf")
        self._sum = 0.0
        # (≤ sample_size,) all scores until it is full, then a reservoir
        self._sample = np.empty(0, np.float64)
        self._rng = np.random.default_rng(seed)
        self._sizes: Counter[int] = Counter()  # items per query → number of queries

    def add_scores(self, scores: pa.Array | pa.ChunkedArray | np.ndarray | Iterable[float | None]) -> None:
        """Count a batch of scores; nulls (failed items) are skipped, NaN and ±inf counted apart."""
        values = _float_array(scores)  # (n,) float64 without nulls
        finite = np.isfinite(values)
        self.non_finite += int(values.size - finite.sum())
        values = values[finite]
        if values.size == 0:
            return
        self._min = min(self._min, float(values.min()))
        self._max = max(self._max, float(values.max()))
        self._sum += float(values.sum())
        self._offer(values)
        self.count += values.size

    def add_query_sizes(self, sizes: Iterable[int]) -> None:
        """Count queries by their number of items."""
        self._sizes.update(int(size) for size in sizes)

    def _offer(self, values: np.ndarray) -> None:
        """Algorithm R over a batch: value number i (0-based over the run) replaces slot j ~ U{0..i} if j fits."""
        room = self.sample_size - self._sample.size
        if room > 0:
            self._sample = np.concatenate([self._sample, values[:room]])
            values, first = values[room:], self.count + min(room, values.size)
        else:
            first = self.count
        if values.size == 0:
            return
        numbers = first + np.arange(values.size, dtype=np.int64)  # (m,) each value's position in the run
        slots = self._rng.integers(0, numbers + 1)  # (m,)
        hit = slots < self.sample_size
        slots, values = slots[hit], values[hit]
        # A later value replaces an earlier one in the same slot: keep the last hit per slot.
        _, last_from_end = np.unique(slots[::-1], return_index=True)
        keep = slots.size - 1 - last_from_end
        self._sample[slots[keep]] = values[keep]

    @property
    def exact(self) -> bool:
        """True while every finite score is kept (the quantiles are exact)."""
        return self.count <= self.sample_size

    def summary(self) -> dict:
        """The report's numbers: count, min, p01 … p99, max, mean (finite scores), items per query."""
        scores: dict = {"count": self.count, "non_finite": self.non_finite}
        if self.count:
            quantiles = np.quantile(self._sample, QUANTILES)  # linear interpolation, numpy's default
            scores["min"] = self._min
            scores.update({quantile_name(q): float(v) for q, v in zip(QUANTILES, quantiles)})
            scores["max"] = self._max
            scores["mean"] = self._sum / self.count
        scores["quantiles"] = "exact" if self.exact else f"sampled ({self.sample_size} scores)"
        return {"scores": scores, "items_per_query": _size_summary(self._sizes)}


def written_scores(directory: str, filesystem: pafs.FileSystem) -> Iterator[pa.Array]:
    """The `score` column of a directory of Parquet files (an unranked Ray run's output, whose scores are never
    gathered in one place), streamed batch by batch."""
    import pyarrow.dataset as ds  # here: it imports pandas when installed (~0.2 s)

    dataset = ds.dataset(directory, filesystem=filesystem, format="parquet")
    return (batch.column(0) for batch in dataset.to_batches(columns=["score"]))


def _float_array(scores) -> np.ndarray:
    """Scores as a float64 array without nulls."""
    if isinstance(scores, (pa.Array, pa.ChunkedArray)):
        return scores.drop_null().to_numpy(zero_copy_only=False).astype(np.float64)
    if isinstance(scores, np.ndarray):
        return scores.astype(np.float64).ravel()
    return np.array([s for s in scores if s is not None], np.float64)


def _size_summary(sizes: Counter[int]) -> dict:
    """Queries, and the min / median / max of their item counts (median as numpy's: mean of the middle two)."""
    queries = sum(sizes.values())
    if queries == 0:
        return {"queries": 0}
    ordered = sorted(sizes.items())
    lower, upper = _nth(ordered, (queries - 1) // 2), _nth(ordered, queries // 2)
    return {"queries": queries, "min": ordered[0][0], "median": (lower + upper) / 2, "max": ordered[-1][0]}


def _nth(histogram: list[tuple[int, int]], n: int) -> int:
    """The n-th value (0-based) of the sorted values a (value, count) histogram stands for."""
    for value, count in histogram:
        if n < count:
            return value
        n -= count
    raise IndexError(n)
