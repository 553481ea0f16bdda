"""One window (io_formats/window.Window, columns) → groups for the engine → output columns in input row order."""

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
from score_batch.io_formats.window import (
    Window,
    appearance_codes,
    first_appearance_codes,
    pick,
    python,
    token_key,
)
from score_batch.job.checkpoint.input_digest import query_digest
from score_batch.job.preflight.contract import OutputContract


@dataclass
class WindowGroups:
    """The groups of a window and, per group, the window item index (Window.items) of each of its items."""

    groups: list[Group]
    refs: list[np.ndarray]  # per group: [group items] int64


def group_codes(window: Window) -> tuple[np.ndarray, list[int]]:
    """[rows] each readable row's query group (same query id and query), numbered in order of first
    appearance, -1 for a row that cannot be read; and each group's first row."""
    readable = readable_rows(window)
    id_codes = _id_codes(window.query_ids, window.num_rows)
    if id_codes is not None and (window.query_codes[readable] >= 0).all():  # with numpy: no key per row
        keys = id_codes * (len(window.query_values) + 1) + window.query_codes  # [rows]
        rows = np.flatnonzero(readable)
        codes = np.full(window.num_rows, -1, np.int64)
        codes[rows], first = appearance_codes(keys[rows])
        return codes, rows[first].tolist()
    ids = window.query_id_values()
    keys = (
        None if error is not None else (repr(query_id), query)
        for error, query_id, query in zip(window.errors, ids, window.query_codes.tolist())
    )
    return first_appearance_codes(keys, window.num_rows)


def readable_rows(window: Window) -> np.ndarray:
    """[rows] bool: the rows that could be read (no error)."""
    return np.fromiter((error is None for error in window.errors), bool, window.num_rows)


def _id_codes(query_ids, num_rows: int) -> np.ndarray | None:
    """[rows] a code per distinct query id (a null id one more value), or None where ids are compared by their
    repr (Python values, floats, composite keys): 0 everywhere without an id column."""
    if query_ids is None:
        return np.zeros(num_rows, np.int64)
    if not isinstance(query_ids, pa.Array):
        return None
    plain = query_ids.type.value_type if pa.types.is_dictionary(query_ids.type) else query_ids.type
    if not (pa.types.is_integer(plain) or pa.types.is_string(plain) or pa.types.is_large_string(plain)):
        return None
    if pa.types.is_dictionary(query_ids.type):
        query_ids = query_ids.dictionary_decode()
    encoded = query_ids.dictionary_encode(null_encoding="encode")
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def group_window(window: Window) -> WindowGroups:
    """Gather the readable rows' items by query (same query id and query) within the window."""
    codes, firsts = group_codes(window)
    refs = members(codes[window.item_rows()], len(firsts))
    items = window.items
    groups = [Group(window.query(row), [items[i] for i in ref.tolist()]) for row, ref in zip(firsts, refs)]
    return WindowGroups(groups, refs)


def members(codes: np.ndarray, count: int) -> list[np.ndarray]:
    """Per code 0..count-1, the positions holding it, in order (code -1: in none)."""
    if not count:
        return []
    held = np.flatnonzero(codes >= 0)
    order = held[np.argsort(codes[held], kind="stable")]
    return np.split(order, np.cumsum(np.bincount(codes[held], minlength=count))[:-1])


def without(grouped: WindowGroups, taken: dict[int, dict]) -> WindowGroups:
    """The groups of a window less the items in taken (by window item index; a group left empty is dropped)."""
    if not taken:
        return grouped
    gone = np.fromiter(taken, np.int64, len(taken))
    groups, refs = [], []
    for group, g_refs in zip(grouped.groups, grouped.refs):
        kept = np.flatnonzero(~np.isin(g_refs, gone))
        if len(kept) == len(g_refs):
            groups.append(group)
            refs.append(g_refs)
        elif len(kept):
            groups.append(Group(group.query, [group.items[k] for k in kept.tolist()]))
            refs.append(g_refs[kept])
    return WindowGroups(groups, refs)


@dataclass
class _ItemValues:
    """A window's per-item values: copied from earlier outputs, then the engine's results, then row errors."""

    score: np.ndarray  # [items] float32
    scores: np.ndarray  # [items, num_scores] float32
    pooled: np.ndarray | None  # [items, hidden] float32
    has_value: np.ndarray  # [items] bool: scored or copied (an error still nulls it)
    has_vector: np.ndarray  # [items] bool
    errors: list[str | None]
    chunks: list[int | None]


def _item_values(window, grouped, results, reused, width: int, dim: int | None) -> _ItemValues:
    """Each item's score, scores, vector, chunk count and error (NaN/None where it has none)."""
    n = window.num_items
    pooled = None if dim is None else np.full((n, dim), np.nan, np.float32)
    values = _ItemValues(
        np.full(n, np.nan, np.float32), np.full((n, width), np.nan, np.float32), pooled,
        np.zeros(n, bool), np.zeros(n, bool), [None] * n, [None] * n,
    )  # fmt: skip
    for at, copied in (reused or {}).items():
        values.score[at], values.scores[at], values.has_value[at] = copied[SCORE], copied[SCORES], True
        if pooled is not None and copied.get(POOLED) is not None:
            pooled[at], values.has_vector[at] = copied[POOLED], True
        values.chunks[at] = copied.get(CHUNKS)
    for at, result in zip(grouped.refs, results or ()):
        values.score[at], values.scores[at], values.has_value[at] = result.score, result.scores, True
        if pooled is not None and result.pooled is not None:
            pooled[at], values.has_vector[at] = result.pooled, True
        failures = result.failures  # per item: why it has no score, else None
        if any(failures):
            for k, error in enumerate(failures):
                values.errors[at[k]] = error
        if result.chunks is not None:
            for k, count in zip(at.tolist(), result.chunks.tolist()):
                values.chunks[k] = count
    for row, error in enumerate(window.errors):
        if error is not None:
            start, stop = int(window.offsets[row]), int(window.offsets[row + 1])
            values.errors[start:stop] = [error] * (stop - start)
    return values


def output_columns(
    window: Window,
    grouped: WindowGroups,
    results: list[GroupResult] | None,
    contract: OutputContract,
    keys: list[str | None],
    reused: dict[int, dict] | None = None,
) -> dict[str, list | pa.Array]:
    """Output columns (one row per item, input order); failed items get null scores and an error.

    A null id stays null when the input has an id column; without one, the query id is generated (generated_ids).
    Under --truncate chunk each item also has its chunk count. keys: each item's score key (pair_keys); reused: the
    values of items copied from earlier (grouped and results leave them out), by window item index. Ids and
    kept columns are taken from the window by row; scores and vectors are built from numpy."""
    dim, n, width = contract.pooled_dim, window.num_items, _scores_width(results, reused)
    values = _item_values(window, grouped, results, reused, width, dim)
    errors = values.errors
    rows = window.item_rows()  # [items]
    row_index = window.index[rows]  # [items]
    given = contract.query_ids_given  # else query_id is a digest of the query (generated_ids)
    query_ids = pick(window.query_ids if given else generated_ids(window), rows)
    failed = np.fromiter((error is not None for error in errors), bool, n)  # [items]
    columns: dict[str, list | pa.Array] = {
        ROW_INDEX: pa.array(row_index),
        QUERY_ID: query_ids,
        ITEM_ID: window.item_ids,
        **{name: pick(kept, rows) for name, kept in window.kept.items()},
        SCORE_KEY: keys,
        QUERY_KEY: pick(row_query_keys(window, given), rows) if contract.ranked else [None] * n,
    }  # by name: OutputContract.part_table puts them in the schema's order
    if failed.any():
        columns[SCORE_KEY] = [None if bad else key for bad, key in zip(failed.tolist(), keys)]
        ids = python(query_ids) if given else [None] * n  # a digest says little
        item_ids = python(window.item_ids)
        for k in np.flatnonzero(failed).tolist():
            errors[k] = f"row {int(row_index[k])}: {errors[k]}{_ids(ids[k], item_ids[k])}"
    null = failed | ~values.has_value
    columns[SCORE] = pa.array(values.score, mask=null)
    columns[SCORES] = pa.ListArray.from_arrays(
        pa.array(np.arange(n + 1, dtype=np.int32) * width),
        pa.array(values.scores.reshape(-1)),
        mask=pa.array(null),
    )
    if contract.chunked:  # else a kept column may take the name
        columns[CHUNKS] = [None if failed[k] else count for k, count in enumerate(values.chunks)]
    if values.pooled is not None:
        columns[POOLED] = pa.FixedSizeListArray.from_arrays(
            pa.array(values.pooled.reshape(-1)), dim, mask=pa.array(failed | ~values.has_vector)
        )
    columns[ERROR] = errors
    return columns


def generated_ids(window: Window) -> pa.Array:
    """[rows] int64 the query_id of an input without id columns: the first 63 bits (big-endian) of the query's
    SHA-256 (job/checkpoint/input_digest.query_digest), the same for the same query in any run and any input
    order; null for a row without a query."""
    codes = window.query_codes  # [rows]
    used = np.unique(codes[codes >= 0])  # [distinct queries of the window]
    digests = [int.from_bytes(query_digest(window.query_values[c])[:8], "big") >> 1 for c in used.tolist()]
    ids = np.array(digests, np.int64)[np.searchsorted(used, np.maximum(codes, 0))] if len(used) else codes
    return pa.array(ids, pa.int64(), mask=codes < 0)


def _scores_width(results: list[GroupResult] | None, reused: dict | None) -> int:
    """How many numbers each item's scores list holds (0 when nothing in the window has any): the copied
    values' count where a dry run's one NaN per item stands in for the model's scores (a copied row always has
    its scores: job/reuse.matched_values copies only complete rows)."""
    scored = next((result.scores.shape[1] for result in results or ()), 0)  # [items, num_scores]
    copied = next((len(values[SCORES]) for values in (reused or {}).values() if values.get(SCORES)), 0)
    return max(scored, copied)


def _ids(query_id: Any, item_id: Any) -> str:
    """The ids of a failed row, for its message (empty when the input has none): a composite key's struct as
    JSON (as the errors file holds it), others as repr."""
    named = [
        f"{name}={json.dumps(value, default=str) if isinstance(value, dict) else repr(value)}"
        for name, value in (("query_id", query_id), ("item_id", item_id))
        if value is not None
    ]
    return f" ({', '.join(named)})" if named else ""


def pair_keys(window: Window, score_key: bytes) -> list[str | None]:
    """[items] each pair's score key (hex), None for an item of a row that cannot be read: the 128-bit BLAKE2b,
    keyed with score_key (the run identity's, job/checkpoint/identity), of the query's digest
    (job/checkpoint/input_digest's query_digest, once per distinct query) then the item (text as UTF-8 behind
    a tag byte, token ids as JSON)."""
    states: dict[int, Any] = {}
    codes = np.where(readable_rows(window), window.query_codes, -1)  # [rows]
    keys: list[str | None] = []
    append, blake2b = keys.append, hashlib.blake2b
    for code, item in zip(codes[window.item_rows()].tolist(), window.items):
        if code < 0:
            append(None)
            continue
        state = states.get(code)
        if state is None:
            state = states[code] = blake2b(
                query_digest(window.query_values[code]), digest_size=16, key=score_key
            )
        pair = state.copy()
        if isinstance(item, str):
            pair.update(b"t" + item.encode("utf-8", "surrogatepass"))
        else:
            pair.update(b"i" + json.dumps(item, default=repr).encode())
        append(pair.hexdigest())
    return keys


def query_identity(window: Window, row: int, ids_given: bool) -> tuple:
    """Which query a row belongs to over the whole run: its id when the input has id columns and the row's id
    is not null (a composite key's values, nulls among them, are never null as a whole); else its text (or token
    ids); a row that could not be read at all is a query of its own."""
    query_id = window.query_ids[row] if ids_given else None
    if isinstance(query_id, pa.Scalar):
        query_id = query_id.as_py()
    if query_id is not None:
        return ("id", repr(_equal_floats_one(query_id)))
    query = window.query(row)
    if query is not None:
        return ("text", query if isinstance(query, str) else token_key(query))
    return ("row", int(window.index[row]))


def _equal_floats_one(value: Any) -> Any:
    """An id's value with -0.0 as 0.0 (in a composite key's fields and lists too): equal ids, one query, as in
    SQL's GROUP BY and pandas."""
    if isinstance(value, float):
        return value + 0.0  # -0.0 + 0.0 == +0.0
    if isinstance(value, dict):
        return {name: _equal_floats_one(field) for name, field in value.items()}
    return [_equal_floats_one(v) for v in value] if isinstance(value, list) else value


def row_query_keys(window: Window, ids_given: bool) -> list[str]:
    """[rows] each row's ranking group (query_identity) as a short string that survives checkpoint parts."""
    cache: dict = {}
    ids = window.query_id_values() if ids_given else [None] * window.num_rows
    keys = []
    for row, (query_id, code) in enumerate(zip(ids, window.query_codes.tolist())):
        cached = ("id", repr(query_id)) if query_id is not None else ("code", code)
        key = cache.get(cached)
        if key is None:
            named = query_identity(window, row, ids_given)
            if named[0] == "row":  # a row that could not be read at all: a query of its own, never cached
                key = f"row:{named[1]}"
            else:
                key = cache[cached] = hashlib.sha256(repr(named).encode()).hexdigest()[:32]
        keys.append(key)
    return keys


def group_sizes(window: Window, grouped: WindowGroups, ids_given: bool) -> list[tuple[Any, int]]:
    """(query identity, items) per query group of the window, for the report's items per query."""
    rows = window.item_rows()
    return [(query_identity(window, int(rows[ref[0]]), ids_given), len(ref)) for ref in grouped.refs]


def empty_counts(window: Window) -> tuple[int, int]:
    """(rows with an empty query, empty items) of a window: an empty string or an empty list of token ids; a
    missing (null) one, or one of another type (a number), is the row's error, not counted here."""
    fine = readable_rows(window)  # [rows]
    empty = [code for code, query in enumerate(window.query_values) if _is_empty(query)]
    queries = int((np.isin(window.query_codes, empty) & fine).sum()) if empty else 0
    items = itertools.compress(window.items, np.repeat(fine, np.diff(window.offsets)).tolist())
    return queries, sum(map(_is_empty, items))


def _is_empty(value) -> bool:
    """Whether a query or item is an empty text or an empty list of token ids."""
    return isinstance(value, (str, list)) and not value
