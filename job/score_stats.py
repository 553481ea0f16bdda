"""The distribution of a run's scores and of its items per query, for the report (alerting on a drifted model).

Memory is bounded: count, min, max and mean are exact; the quantiles are exact up to SAMPLE_SIZE finite scores,
then from a reservoir sample (fixed seed: the same input gives the same report). Items per query are counted
per distinct query of the run by a 64-bit hash, for at most MAX_QUERIES queries (the report says when more).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from score_batch.io_formats.columns import SCORE

SAMPLE_SIZE = 100_000  # scores kept for the quantiles: 800 kB; rank error of a sampled quantile ≲ 0.5 points
QUANTILES = (0.01, 0.05, 0.25, 0.50, 0.75, 0.95, 0.99)
MAX_QUERIES = 1 << 22  # distinct queries counted for items_per_query: 4,194,304 (64 MiB)
MERGE_EVERY = 1 << 16  # new (query, items) counts held before they are merged into the sorted arrays


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
        self._seed, self._rng = seed, None  # the generator on first use: numpy.random is not imported before
        self.queries = QueryItems()

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

    def add_query_items(self, items: Iterable[tuple[Hashable, int]]) -> None:
        """Count items per query: (the query's identity, its items in one window), the same query in any window."""
        self.queries.add(items)

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
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        slots = self._rng.integers(0, numbers + 1)  # (m,)
        hit = slots < self.sample_size
        slots, values = slots[hit], values[hit]
        # A later value replaces an earlier one in the same slot: keep the last hit per slot.
        _, last_from_end = np.unique(slots[::-1], return_index=True)
        keep = slots.size - 1 - last_from_end
        self._sample[slots[keep]] = values[keep]

    def summary(self) -> dict:
        """The report's numbers: count, min, p01 … p99, max, mean (finite scores), items per query."""
        scores: dict = {"count": self.count, "non_finite": self.non_finite}
        if self.count:
            quantiles = np.quantile(self._sample, QUANTILES)  # linear interpolation, numpy's default
            scores["min"] = self._min
            scores.update({quantile_name(q): float(v) for q, v in zip(QUANTILES, quantiles)})
            scores["max"] = self._max
            scores["mean"] = self._sum / self.count
        exact = self.count <= self.sample_size  # every finite score is kept
        scores["quantiles"] = "exact" if exact else f"sampled ({self.sample_size} scores)"
        return {"scores": scores, "items_per_query": self.queries.summary()}


def written_scores(directory: str, filesystem: pafs.FileSystem) -> Iterator[pa.Array]:
    """The `score` column of an unranked Ray run's output directory, streamed batch by batch."""
    import pyarrow.dataset as ds  # here: it imports pandas when installed (~0.2 s)

    dataset = ds.dataset(directory, filesystem=filesystem, format="parquet")
    return (batch.column(0) for batch in dataset.to_batches(columns=[SCORE]))


def _float_array(scores) -> np.ndarray:
    """Scores as a float64 array without nulls."""
    if isinstance(scores, (pa.Array, pa.ChunkedArray)):
        return scores.drop_null().to_numpy(zero_copy_only=False).astype(np.float64)
    if isinstance(scores, np.ndarray):
        return scores.astype(np.float64).ravel()
    return np.array([s for s in scores if s is not None], np.float64)


class QueryItems:
    """Items per distinct query, by a 64-bit hash of the query's identity (module doc: the memory bound)."""

    def __init__(self, limit: int = MAX_QUERIES) -> None:
        self.limit = limit
        self._keys = np.empty(0, np.int64)  # (queries,) sorted, distinct query hashes
        self._counts = np.empty(0, np.int64)  # (queries,) items of each
        self._new: list[tuple[int, int]] = []  # (hash, items) not merged yet
        self.full = False  # a query was left out: the limit was reached

    def add(self, items: Iterable[tuple[Hashable, int]]) -> None:
        """Count (query identity, items) pairs."""
        self._new.extend((hash(query), int(count)) for query, count in items)
        if len(self._new) >= MERGE_EVERY:
            self._merge()

    def _merge(self) -> None:
        """Fold the new counts into the sorted arrays; past the limit, new queries are left out."""
        if not self._new:
            return
        new = np.array(self._new, np.int64)  # (n, 2) hash, items
        self._new = []
        keys, inverse = np.unique(new[:, 0], return_inverse=True)
        counts = np.bincount(inverse, weights=new[:, 1]).astype(np.int64)  # per distinct new hash
        at = np.searchsorted(self._keys, keys)  # where each would sit in the sorted known hashes
        known = at < self._keys.size
        known[known] = self._keys[at[known]] == keys[known]
        np.add.at(self._counts, at[known], counts[known])
        keys, counts = keys[~known], counts[~known]
        room = self.limit - self._keys.size
        if keys.size > room:
            self.full = True
            keys, counts = keys[:room], counts[:room]
        if keys.size:
            merged = np.concatenate([self._keys, keys])
            order = np.argsort(merged, kind="stable")
            self._keys, self._counts = merged[order], np.concatenate([self._counts, counts])[order]

    def summary(self) -> dict:
        """Queries, and the min / median / max of their item counts (median as numpy's: mean of the middle two)."""
        self._merge()
        if not self._keys.size:
            return {"queries": 0}
        counts = self._counts
        summary = {
            "queries": int(counts.size),
            "min": int(counts.min()),
            "median": float(np.median(counts)),
            "max": int(counts.max()),
        }
        if self.full:
            summary["counted"] = f"{self.limit} distinct queries (the limit); the others are left out"
        return summary
