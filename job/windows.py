"""One window of input rows → groups for the engine → output columns in input row order."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from score_batch.engine import Group, GroupResult
from score_batch.io_formats.columns import (
    CHUNKS,
    ERROR,
    ITEM_ID,
    POOLED,
    QUERY_ID,
    QUERY_KEY,
    ROW_INDEX,
    SCORE,
    SCORE_KEY,
    SCORES,
)
from score_batch.io_formats.readers import InputRow
from score_batch.job.contract import OutputContract
from score_batch.job.query_ranking import query_key


@dataclass
class WindowGroups:
    """The groups of a window and, for each group item, the (row position, item position) it came from."""

    groups: list[Group]
    refs: list[list[tuple[int, int]]]


def query_group_key(row: InputRow) -> tuple:
    """Rows with the same query id and query (text or token ids) belong to one group."""
    return repr(row.query_id), row.query if isinstance(row.query, str) else tuple(row.query)


def group_window(rows: list[InputRow]) -> WindowGroups:
    """Gather the valid rows' items by query (same query id and text) within the window."""
    index: dict[Any, int] = {}
    groups: list[tuple[Any, list]] = []
    refs: list[list[tuple[int, int]]] = []
    for row_pos, row in enumerate(rows):
        if row.error is not None:
            continue
        key = query_group_key(row)
        if key not in index:
            index[key] = len(groups)
            groups.append((row.query, []))
            refs.append([])
        g = index[key]
        for item_pos, item in enumerate(row.items):
            groups[g][1].append(item)
            refs[g].append((row_pos, item_pos))
    return WindowGroups([Group(q, items) for q, items in groups], refs)


def without(grouped: WindowGroups, reused: dict[tuple[int, int], dict]) -> WindowGroups:
    """The groups of a window less the items --reuse found (groups left with no item are dropped)."""
    if not reused:
        return grouped
    groups, refs = [], []
    for group, g_refs in zip(grouped.groups, grouped.refs):
        kept = [k for k, ref in enumerate(g_refs) if ref not in reused]
        if kept:
            groups.append(Group(group.query, [group.items[k] for k in kept]))
            refs.append([g_refs[k] for k in kept])
    return WindowGroups(groups, refs)


def output_columns(
    rows: list[InputRow],
    grouped: WindowGroups,
    results: list[GroupResult] | None,
    contract: OutputContract,
    keys: list[list[str | None]],
    reused: dict[tuple[int, int], dict] | None = None,
) -> dict[str, list | pa.Array]:
    """Output columns (one row per item, input order); failed items get null scores and an error.

    A null id stays null when the input has an id column; without one, the row index is the query id. Under
    --truncate chunk each item also has its chunk count. keys: each pair's score key (job/reuse.pair_keys);
    reused: the values of pairs copied from earlier (grouped and results leave them out). The score, scores
    and pooled columns are Arrow arrays built from numpy (no Python object per number)."""
    keep, dim = contract.keep, contract.pooled_dim
    starts = list(itertools.accumulate((len(row.item_ids) for row in rows), initial=0))
    n = starts[-1]
    width = _scores_width(results, reused)
    score = np.full(n, np.nan, np.float32)  # [items]
    scores = np.full((n, width), np.nan, np.float32)  # [items, num_scores]
    pooled = None if dim is None else np.full((n, dim), np.nan, np.float32)  # [items, hidden]
    has_value = np.zeros(n, bool)  # [items]: scored or copied (an error still nulls it)
    has_vector = np.zeros(n, bool)  # [items]
    errors: list[str | None] = [None] * n
    chunks: list[int | None] = [None] * n
    for (row_pos, item_pos), values in (reused or {}).items():
        at = starts[row_pos] + item_pos
        score[at], scores[at], has_value[at] = values[SCORE], values[SCORES], True
        if pooled is not None and values.get(POOLED) is not None:
            pooled[at], has_vector[at] = values[POOLED], True
        chunks[at] = values.get(CHUNKS)
    for g_refs, result in zip(grouped.refs, results or ()):
        at = np.fromiter((starts[r] + i for r, i in g_refs), np.int64, len(g_refs))  # [group items]
        score[at], scores[at], has_value[at] = result.score, result.scores, True
        if pooled is not None and result.pooled is not None:
            pooled[at], has_vector[at] = result.pooled, True
        for k, error in enumerate(result.failures):  # per item: why it has no score, else None
            errors[at[k]] = error
        if result.chunks is not None:
            for k, count in enumerate(result.chunks.tolist()):
                chunks[at[k]] = count
    columns: dict[str, list | pa.Array] = {
        name: [] for name in (ROW_INDEX, QUERY_ID, ITEM_ID, *keep, SCORE_KEY, QUERY_KEY)
    }  # by name: OutputContract.part_table puts them in the schema's order
    for row_pos, row in enumerate(rows):
        query_id = row.query_id if contract.query_ids_given else row.index
        key = query_key(row, contract) if contract.ranked else None
        count = len(row.item_ids)
        start = starts[row_pos]
        if row.error is not None:
            errors[start : start + count] = [row.error] * count
        columns[ROW_INDEX].extend([row.index] * count)
        columns[QUERY_ID].extend([query_id] * count)
        columns[ITEM_ID].extend(row.item_ids)
        for name in keep:
            columns[name].extend([row.kept.get(name)] * count)
        row_errors = errors[start : start + count]
        columns[SCORE_KEY].extend(
            None if error is not None else k for error, k in zip(row_errors, keys[row_pos])
        )
        columns[QUERY_KEY].extend([key] * count)
        for item_pos, error in enumerate(row_errors):
            if error is not None:
                errors[start + item_pos] = f"row {row.index}: {error}{_ids(query_id, row.item_ids[item_pos])}"
    failed = np.fromiter((error is not None for error in errors), bool, n)  # [items]
    null = failed | ~has_value
    columns[SCORE] = pa.array(score, mask=null)
    columns[SCORES] = pa.ListArray.from_arrays(
        pa.array(np.arange(n + 1, dtype=np.int32) * width), pa.array(scores.reshape(-1)), mask=pa.array(null)
    )
    if contract.chunked:  # else a kept column may take the name
        columns[CHUNKS] = [None if failed[k] else count for k, count in enumerate(chunks)]
    if pooled is not None:
        columns[POOLED] = pa.FixedSizeListArray.from_arrays(
            pa.array(pooled.reshape(-1)), dim, mask=pa.array(failed | ~has_vector)
        )
    columns[ERROR] = errors
    return columns


def _scores_width(results: list[GroupResult] | None, reused: dict | None) -> int:
    """How many numbers each item's scores list holds (0 when nothing in the window has any)."""
    for result in results or ():
        return result.scores.shape[1]  # [items, num_scores]
    for values in (reused or {}).values():
        return len(values[SCORES])
    return 0


def _ids(query_id: Any, item_id: Any) -> str:
    """The ids of a failed row, for its message (empty when the input has none)."""
    ids = {"query_id": query_id, "item_id": item_id}
    named = [f"{name}={value!r}" for name, value in ids.items() if value is not None]
    return f" ({', '.join(named)})" if named else ""


def window_hash(rows: list[InputRow], content=None) -> str:
    """A hash of everything read for a window, so --resume can tell that the input did not change; content
    (a hashlib object), when given, takes the same rows too: the whole input's digest, whatever the windows.

    Each row is the JSON of its fields (dataclass order) with the query replaced by the SHA-256 of its JSON:
    a query is encoded and hashed once per window however many rows repeat it. The window is one JSON list;
    content takes its rows joined by ", " (the list's own separator) and one after the last, so the stream is
    the same however the input is cut into windows."""
    digests: dict = {}

    def query_digest(query) -> str:
        key = query if isinstance(query, str) else _hashable(query)
        digest = digests.get(key)
        if digest is None:
            text = json.dumps(query, default=repr, sort_keys=True).encode()
            digest = digests[key] = hashlib.sha256(text).hexdigest()
        return digest

    values = [
        (row.index, query_digest(row.query), row.items, row.query_id, row.item_ids, row.kept, row.error)
        for row in rows
    ]
    text = json.dumps(values, default=repr, sort_keys=True).encode()
    if content is not None and values:
        content.update(text[1:-1])
        content.update(b", ")
    return hashlib.sha256(text).hexdigest()


def _hashable(value: Any) -> Any:
    """A dict key for a query that is not text: its token ids as a tuple, else its JSON."""
    if isinstance(value, list):
        try:
            return tuple(value) if all(type(v) is int for v in value) else json.dumps(value, default=repr)
        except TypeError:
            pass
    return json.dumps(value, default=repr, sort_keys=True)
