"""Per-item outputs of a run collected into GroupResults; non-finite outputs found and named."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from score_batch.engine.activation import ResolvedActivation, activate
from score_batch.engine.plan.packing import ItemRef
from score_batch.engine.types import GroupResult


def non_finite_rows(raw: np.ndarray) -> np.ndarray:  # raw: [rows, num_scores] → [rows] bool
    """Rows holding a NaN or an infinity in any score."""
    return ~np.isfinite(raw).all(axis=1)


def non_finite_message(raw_row: np.ndarray, item: int, name: str | None = None) -> str:
    """The item error of a row that stays non-finite when scored alone, naming the item and the value. name:
    how to name it instead of "item N" (a chunk under truncate="chunk": "item 3 (chunk 2 of 5)")."""
    value = next(float(v) for v in raw_row if not np.isfinite(v))
    return f"non-finite score ({value}) for {name or f'item {item}'}"


class ResultTable:
    """NaN-initialised outputs of every item in flat arrays (groups one after another), filled a batch at a time
    (one fancy-index assignment per array: put_rows); results() gives each group views of its rows."""

    def __init__(self, item_counts: list[int], num_scores: int, pooled_dim: int | None) -> None:
        self.starts = np.concatenate([[0], np.cumsum(item_counts, dtype=np.int64)])  # [groups + 1]
        total = int(self.starts[-1])
        # raw [items, num_scores], scores [items, num_scores], pooled [items, hidden] or None
        self._arrays = [np.full((total, width), np.nan, np.float32) for width in (num_scores, num_scores)]
        self._arrays.append(None if pooled_dim is None else np.full((total, pooled_dim), np.nan, np.float32))
        self.item_errors: list[list[str | None]] = [[None] * n for n in item_counts]

    def rows(self, refs) -> np.ndarray:  # [len(refs)] int64
        """The flat rows of items (ItemRefs)."""
        starts = self.starts
        return np.fromiter((starts[ref.group] + ref.item for ref in refs), dtype=np.int64, count=len(refs))

    def put_rows(self, rows: np.ndarray, *outputs: np.ndarray | None) -> None:
        """Store (raw, scores, pooled) of many items at their flat rows ([n, num_scores] ×2, [n, hidden] or None)."""
        for array, values in zip(self._arrays, outputs):
            if array is not None and values is not None:
                array[rows] = values

    def put(self, ref: ItemRef, *outputs: np.ndarray | None) -> None:
        """Store one item's (raw, scores, pooled) ([num_scores], [num_scores], [hidden] or None)."""
        self.put_rows(self.rows([ref]), *outputs)

    def fail(self, ref: ItemRef, raw: np.ndarray, name: str | None = None) -> None:
        """Mark an item whose output is non-finite on its own: an item error, NaN everywhere (name: see
        non_finite_message)."""
        self.item_errors[ref.group][ref.item] = non_finite_message(raw, ref.item, name)
        self.put(ref, np.nan, np.nan, np.nan)

    def copy(self, copies: dict[ItemRef, tuple[ItemRef, ...]], name: Callable[[ItemRef], str]) -> None:
        """Give each repeated sequence (copies: original → repeats) its original's outputs, in one gather and
        one scatter per array; a failed original's failure goes to its repeats in their own names (name)."""
        pairs = [(original, repeat) for original, repeats in copies.items() for repeat in repeats]
        sources, targets = self.rows([p[0] for p in pairs]), self.rows([p[1] for p in pairs])
        for array in self._arrays:
            if array is not None:
                array[targets] = array[sources]
        for source, (original, repeat) in zip(sources, pairs):
            if self.item_errors[original.group][original.item] is not None:
                message = non_finite_message(self._arrays[0][source], repeat.item, name(repeat))
                self.item_errors[repeat.group][repeat.item] = message

    def results(
        self, errors: list[list[str | None]], activation: ResolvedActivation, score_index: int
    ) -> list[GroupResult]:
        """GroupResults in group order; `score` is the activated value of each item (docs/semantics.md)."""
        raw, scores, pooled = self._arrays
        activated = scores if activation.name == "none" else raw  # what `score` is computed from
        groups = [slice(a, b) for a, b in zip(self.starts[:-1], self.starts[1:])]  # views of the flat arrays
        return [
            GroupResult(
                scores=scores[rows],
                score=activate(activated[rows], activation.name, score_index),
                pooled=None if pooled is None else pooled[rows],
                errors=list(group_errors),
                item_errors=tuple(item_errors),
                raw=raw[rows],
            )
            for rows, group_errors, item_errors in zip(groups, errors, self.item_errors)
        ]


def planned_results(plan, pooled_dim: int | None) -> list[GroupResult]:
    """A dry run's stand-in for a plan's results: NaN scores, the plan's per-item errors (over-long items,
    untokenizable text: the row errors the real run would report) and, when chunked, each item's planned
    chunk count (pooled_dim: the pooled vectors' width, None when none are asked for)."""
    results = []
    for index, group in enumerate(plan.tokenized):
        count = len(group.item_ids)
        scores = np.full((count, 1), np.nan, np.float32)  # [items, 1]
        pooled = None if pooled_dim is None else np.full((count, pooled_dim), np.nan, np.float32)
        chunks = None if plan.chunked is None else np.asarray(plan.chunked[index].counts, np.int32)
        results.append(GroupResult(scores, scores[:, 0], pooled, list(group.errors), chunks=chunks))
    return results


class Finished:
    """A plan run whole when started (an encoder's plan, a dry run's planned results): the PlanRun interface
    (engine/run/packed_runner.py) with nothing left to launch."""

    def __init__(self, results: list[GroupResult]) -> None:
        self._results = results

    def launch_rest(self) -> None: ...

    def results(self) -> list[GroupResult]:
        return self._results
