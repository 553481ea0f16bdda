"""One window of input rows → groups for the engine → output columns in input row order."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from score_batch.engine import Group, GroupResult
from score_batch.io_formats.readers import InputRow
from score_batch.job.contract import CHUNKS, ERROR, QUERY_KEY, ROW_INDEX, SCORE_KEY, OutputContract
from score_batch.job.ranking import query_key


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
) -> dict[str, list]:
    """Output columns (one row per item, input order); failed items get null scores and an error.

    A null id stays null when the input has an id column; without one, the row index is the query id. Under
    --truncate chunk (contract.chunked) each item's row also has its window count (GroupResult.chunks).
    keys: each pair's score key (job/reuse.pair_keys); reused: the values of pairs copied from an earlier
    output (job/reuse.EarlierScores.take), which grouped and results leave out.
    """
    keep, pooled = contract.keep, contract.pooled_dim is not None
    by_item: dict[tuple[int, int], tuple] = {}
    for ref, values in (reused or {}).items():
        vector = values.get("pooled_hidden_state") if pooled else None
        by_item[ref] = (values["score"], values["scores"], vector, values.get("chunks"), None)
    if results is not None:
        for g_refs, result in zip(grouped.refs, results):
            errors = result.failures  # per item: why it has no score, else None
            for k, ref in enumerate(g_refs):
                vector = result.pooled[k].tolist() if pooled and errors[k] is None else None
                chunks = None if result.chunks is None else int(result.chunks[k])
                by_item[ref] = (result.score[k], result.scores[k].tolist(), vector, chunks, errors[k])
    names = [
        ROW_INDEX,
        "query_id",
        "item_id",
        "score",
        "scores",
        *([CHUNKS] if contract.chunked else []),  # a kept column may take the name otherwise
        "pooled_hidden_state",
        *keep,
        SCORE_KEY,
        QUERY_KEY,
        ERROR,
    ]
    columns: dict[str, list] = {name: [] for name in names}
    for row_pos, row in enumerate(rows):
        query_id = row.query_id if contract.query_ids_given else row.index
        key = query_key(row, contract) if contract.ranked else None
        for item_pos, item_id in enumerate(row.item_ids):
            score, scores, vector, chunks, error = by_item.get(
                (row_pos, item_pos), (None, None, None, None, row.error)
            )
            if error is not None:
                score, scores, vector, chunks = None, None, None, None
            columns[ROW_INDEX].append(row.index)
            columns["query_id"].append(query_id)
            columns["item_id"].append(item_id)
            columns["score"].append(None if score is None else float(score))
            columns["scores"].append(scores)
            if contract.chunked:
                columns[CHUNKS].append(chunks)
            columns["pooled_hidden_state"].append(vector)
            for name in keep:
                columns[name].append(row.kept.get(name))
            columns[SCORE_KEY].append(None if error is not None else keys[row_pos][item_pos])
            columns[QUERY_KEY].append(key)
            columns[ERROR].append(
                error if error is None else f"row {row.index}: {error}{_ids(query_id, item_id)}"
            )
    return columns


def _ids(query_id: Any, item_id: Any) -> str:
    """The ids of a failed row, for its message (empty when the input has none)."""
    named = [
        f"{name}={value!r}"
        for name, value in (("query_id", query_id), ("item_id", item_id))
        if value is not None
    ]
    return f" ({', '.join(named)})" if named else ""


ROW_FIELDS = tuple(f.name for f in dataclasses.fields(InputRow))


def window_hash(rows: list[InputRow], content=None) -> str:
    """A hash of everything read for a window, so --resume can tell that the input did not change; content
    (a hashlib object), when given, takes the same rows too: the whole input's digest, whatever the windows.

    Each row is the JSON of its fields' values in order: the same text dataclasses.astuple gave (its deep
    copies serialize alike) at a quarter of the cost, so parts checkpointed by earlier versions still verify.
    """
    digest = hashlib.sha256()
    for row in rows:
        values = tuple(getattr(row, name) for name in ROW_FIELDS)
        text = json.dumps(values, default=repr, sort_keys=True).encode()
        digest.update(text)
        if content is not None:
            content.update(text)
    return digest.hexdigest()
