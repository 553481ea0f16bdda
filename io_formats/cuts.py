"""Where windows are cut: between query groups (consecutive rows of one query id and query), so that a group
is never split across two windows and no query's prefix runs twice; a group of more rows than a window is a
window of its own, cut only past LONGEST_WINDOW windows' rows (one query over a whole corpus stays bounded)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from score_batch.io_formats.window import Window, appearance_codes, first_appearance_codes

LONGEST_WINDOW = 8  # a window holds at most this many times --window-rows rows (a longer group is cut there)


def group_starts(window: Window, final: bool = True) -> np.ndarray:
    """[starts] the rows (from 1 on, ascending) where a window may begin: the readable rows around it differ in
    query id or query (rows that cannot be read belong to no group: the readable rows before and after them
    decide; without final, a row after readable ones with none readable from it on is no start yet)."""
    n = window.num_rows
    if n < 2:
        return np.zeros(0, np.int64)
    readable = np.fromiter((error is None for error in window.errors), bool, n)  # [rows]
    ids = _id_codes(window)  # [rows]
    keys = window.query_codes * (int(ids.max(initial=0)) + 1) + ids  # [rows] one per (query, query id)
    rows = np.arange(n)
    before = np.maximum.accumulate(np.where(readable, rows, -1))  # [rows] the last readable row up to each
    # [rows] the next readable row from each on
    after = np.minimum.accumulate(np.where(readable, rows, n)[::-1])[::-1]
    left = np.where(before >= 0, keys[np.maximum(before, 0)], -2)[:-1]  # [rows - 1] before each boundary
    right = np.where(after < n, keys[np.minimum(after, n - 1)], -3)[1:]  # [rows - 1] after it
    starts = np.flatnonzero(left != right) + 1
    # without final, a cut needs the group on either side known: no readable row before it, or one after it
    return starts if final else starts[(before[starts - 1] < 0) | (after[starts] < n)]


def _id_codes(window: Window) -> np.ndarray:
    """[rows] a code per distinct query id (null one more value), compared as job/windows groups them: Arrow
    integers and text by value, anything else by its Python value's repr."""
    ids = window.query_ids
    if ids is None:
        return np.zeros(window.num_rows, np.int64)
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if isinstance(ids, pa.Array):
        plain = ids.type.value_type if pa.types.is_dictionary(ids.type) else ids.type
        if pa.types.is_integer(plain) or pa.types.is_string(plain) or pa.types.is_large_string(plain):
            if pa.types.is_dictionary(ids.type):
                ids = ids.dictionary_decode()
            encoded = ids.dictionary_encode(null_encoding="encode")
            return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    codes, _ = first_appearance_codes(map(repr, window.query_id_values()), window.num_rows)
    return codes


def cuts(window: Window, window_rows: int, final: bool) -> list[int]:
    """The ends of the windows that can be cut from the front of these rows (the next rows unknown unless
    final): each at most window_rows rows of whole groups, or one group longer than that (up to LONGEST_WINDOW
    windows' rows). A cut needs the row after it: without final, the last window_rows rows are left."""
    starts, n = group_starts(window, final), window.num_rows
    longest = LONGEST_WINDOW * window_rows
    ends: list[int] = []
    start = 0
    while n - start > window_rows:
        k = int(np.searchsorted(starts, start + window_rows, side="right")) - 1
        if k >= 0 and starts[k] > start:  # the last group that begins within the window's rows
            end = int(starts[k])
        else:  # the group at start is longer than a window: it ends at the next start (if seen)
            k = int(np.searchsorted(starts, start, side="right"))
            seen = int(starts[k]) if k < len(starts) else (n if final else None)
            if seen is None and n - start < longest:
                return ends  # its end is in rows not read yet
            end = start + longest if seen is None else min(seen, start + longest)
        ends.append(end)
        start = end
    if final and start < n:
        ends.append(n)
    return ends


def compact(window: Window) -> Window:
    """The window with only the distinct queries its rows use (rows left over for the next window: else every
    query read so far would travel on with them)."""
    codes = window.query_codes  # [rows]
    held = codes >= 0
    if len(np.unique(codes[held])) == len(window.query_values):
        return window
    renumbered, first = appearance_codes(codes[held])  # the used queries in order of first appearance
    values = [window.query_values[code] for code in codes[held][first].tolist()]
    kept = codes.copy()
    kept[held] = renumbered
    return replace(window, query_codes=kept, query_values=values)
