"""--reuse: the score key every output row carries, and earlier outputs' scores joined to this run's pairs.

A pair's score key is a 128-bit BLAKE2b digest of its query and item (text or token ids, as read), keyed with
the run identity's score key (job/checkpoint/identity.RunIdentity.score_key: the model's content, every engine
setting that can change a score, the engine as resolved on the scoring machine, the versions of score-batch,
torch, transformers, tokenizers and flashinfer). Equal keys mean the same pair scored the same way.

The join is streamed and bounded in memory: this run's keys go to a temporary Parquet file in one pass over
the input, and DuckDB joins them to the earlier outputs, scanned in record batches (io_formats/earlier,
spilling to disk past its memory limit), into a file of (row_index, item position, values) in input order,
which the run reads window by window. Only an earlier row holding every value this run writes (non-null, its
scores finite: io_formats/earlier.complete_rows) is copied; a pair found only in rows missing one is scored
again and counted (the report's reuse_incomplete).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from itertools import repeat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from score_batch.io_formats.columns import CHUNKS, ERROR, POOLED, ROW_INDEX, SCORE, SCORE_KEY, SCORES
from score_batch.io_formats.earlier import complete_rows, join_earlier, missing_columns, open_earlier
from score_batch.io_formats.readers import InputSource, read_windows
from score_batch.io_formats.window import Window
from score_batch.job.preflight.paths import process_gone
from score_batch.job.run_config import RunConfig
from score_batch.job.windows import pair_keys
from score_batch.machine import available_cpus

log = logging.getLogger(__name__)
REUSED = (SCORE, SCORES, CHUNKS, POOLED)  # the values a reused row copies
KEY_ROWS = 65_536  # keys per written batch
TEMP_PREFIX = "score-batch-reuse-"  # + pid: the key and join files of one run, in the system's temp dir
PAIRS_MEMORY = 256 << 20  # bytes of scored values a run keeps for later repeats (ScoredPairs)
KEY_BYTES = 200  # a held key: its 32-character string and its dict entry
KEY_SCHEMA = pa.schema([(ROW_INDEX, pa.int64()), ("item_pos", pa.int32()), (SCORE_KEY, pa.string())])


class EarlierScores:
    """The earlier outputs' values for this run's pairs, in input order: `take` hands out one window's."""

    def __init__(self, directory: Path, joined: Path, matched: int, incomplete: int = 0) -> None:
        self.directory = directory
        self.joined = joined  # (row_index, item_pos, score_key, values…) sorted by row_index, item_pos
        self.matched = matched  # pairs of this run found in an earlier output with every value
        self.incomplete = incomplete  # pairs found only in rows missing a value: scored again
        file = pq.ParquetFile(joined)
        self._batches = file.iter_batches(batch_size=KEY_ROWS)
        self._held = file.schema_arrow.empty_table()  # joined rows read, not yet taken

    @classmethod
    def join(cls, config: RunConfig, source: InputSource, key: bytes, values: pa.Schema) -> EarlierScores:
        """Key every pair of the input, join the keys to config.reuse's outputs; values: the reused columns'
        types in this run's output (score, scores, and chunks / pooled_hidden_state when the run writes them)."""
        _remove_stale_directories()
        directory = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
        try:
            joined = directory / "reused.parquet"
            outputs = open_earlier(config.reuse, config.storage_options, config.reuse_missing_ok, warn=False)
            if not outputs:  # every one missing (preflight warned): nothing to join, no key pass
                pq.write_table(pa.schema([*KEY_SCHEMA, *values]).empty_table(), joined)
                return cls(directory, joined, 0)
            for output in outputs:
                missing = missing_columns(output, values)
                if missing:
                    log.warning(
                        "--reuse %s has no %s column, which this run writes: its pairs are scored again",
                        output.uri,
                        " or ".join(missing),
                    )
            keys = directory / "keys.parquet"
            _write_keys(config, source, key, keys)
            matched, incomplete = join_earlier(outputs, keys, values, directory, joined, available_cpus())
            # --top-k outputs: some pairs only
            partial = any(output.top_k() is not None for output in outputs)
            (log.warning if partial or incomplete else log.info)(
                "--reuse: %d pairs of this run found in %d earlier output file(s)%s%s",
                matched,
                len(outputs),
                " (a --top-k output among them holds only each query's best pairs)" if partial else "",
                f"; {incomplete} more found without every value this run writes, scored again"
                if incomplete
                else "",
            )
            return cls(directory, joined, matched, incomplete)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise

    def take(self, window: Window, keys: list[str | None]) -> tuple[dict[int, dict], int]:
        """The reused values of a window's pairs, and how many were found incomplete (matched_values). Windows
        are taken in input order; joined rows before this window's (windows a resumed run skipped) are passed
        over."""
        if not window.num_rows:
            return {}, 0
        pieces = []
        while True:
            rows = self._held[ROW_INDEX].to_numpy()  # [held] sorted
            start, end = np.searchsorted(rows, [window.first, window.last + 1]).tolist()
            pieces.append(self._held.slice(start, end - start))
            self._held = self._held.slice(end)
            batch = None if self._held.num_rows else next(self._batches, None)
            if batch is None:
                break
            self._held = pa.Table.from_batches([batch])
        return matched_values(window, keys, pa.concat_tables(pieces))

    def close(self) -> None:
        """Remove the temporary files."""
        self._batches.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def reused_schema(part_schema: pa.Schema) -> pa.Schema:
    """The reused columns (REUSED) a run's output has, with their types there."""
    return pa.schema([part_schema.field(name) for name in REUSED if name in part_schema.names])


class JoinedScores:
    """Joined earlier values (EarlierScores' rows) that a Ray actor's batch carries: `take` as EarlierScores'."""

    def __init__(self, joined: pa.Table | None) -> None:
        self.joined = joined

    def take(self, window: Window, keys: list[str | None]) -> tuple[dict[int, dict], int]:
        return matched_values(window, keys, self.joined)


def matched_values(
    window: Window, keys: list[str | None], joined: pa.Table | None
) -> tuple[dict[int, dict], int]:
    """Window item index → reused values ({score, scores, …}) of the joined rows (row_index, item_pos, score_key,
    values) whose pair's key (keys: job/windows.pair_keys of the window) is still the joined one (an input
    rewritten since the key pass is scored, never given another pair's value) and that hold every value (a row
    missing one is scored again); and how many such pairs were left out for a missing value."""
    if joined is None or not joined.num_rows or not window.num_rows:
        return {}, 0
    rows = joined[ROW_INDEX].to_numpy()  # [joined]
    order = np.argsort(window.index, kind="stable")
    at = order[np.minimum(np.searchsorted(window.index, rows, sorter=order), len(order) - 1)]  # [joined]
    item = window.offsets[at] + joined["item_pos"].to_numpy()  # [joined] window item index
    ok = (window.index[at] == rows) & (item < window.offsets[at + 1])
    ok[ok] = np.asarray(keys, object)[item[ok]] == joined[SCORE_KEY].to_numpy()[ok]
    names = [name for name in REUSED if name in joined.schema.names]  # the values this run writes
    complete = ok & complete_rows(joined, names)
    values = joined.filter(pa.array(complete)).select(names)
    return dict(zip(item[complete].tolist(), values.to_pylist())), int(ok.sum() - complete.sum())


class ScoredPairs:
    """The values of the pairs this run has written (in their Arrow columns), by score key, so a later repeat is
    copied; past `budget` bytes the oldest are forgotten (scored again). Thread-safe (the prefetch worker's)."""

    def __init__(self, budget: int = PAIRS_MEMORY) -> None:
        self.budget = budget
        self._where: dict[str, tuple[int, int]] = {}  # key → (window serial, row in its table)
        self._windows: OrderedDict[int, _HeldWindow] = OrderedDict()  # oldest first
        self._bytes = 0
        self._serial = 0
        self._lock = threading.Lock()

    def add(self, part: pa.Table) -> None:
        """Remember a written window's scored pairs (part schema: rows with a key and no error)."""
        kept = part.filter(pc.and_(pc.is_valid(part[SCORE_KEY]), pc.is_null(part[ERROR])))
        if kept.num_rows == 0:
            return
        values = kept.select([name for name in REUSED if name in kept.schema.names])
        row_bytes = values.nbytes / kept.num_rows + KEY_BYTES
        fits = int(self.budget // row_bytes)
        start = max(0, kept.num_rows - fits)  # only the newest that fit are held
        keys = kept[SCORE_KEY].slice(start).to_pylist()
        if not keys:  # not one pair fits the budget
            return
        with self._lock:
            self._serial += 1
            held = _HeldWindow(values.slice(start), keys, row_bytes)
            fresh = dict(zip(reversed(keys), zip(repeat(self._serial), range(len(keys) - 1, -1, -1))))
            for key in fresh.keys() & self._where.keys():  # a pair held already keeps its first place
                del fresh[key]
            self._where.update(fresh)  # a key repeated within the window: its first row (reversed above)
            self._windows[self._serial] = held
            self._bytes += row_bytes * len(keys)
            while self._bytes > self.budget and self._windows:
                serial, oldest = next(iter(self._windows.items()))
                key = oldest.keys[oldest.start]
                if self._where.get(key) == (serial, oldest.start):
                    del self._where[key]
                oldest.start += 1
                self._bytes -= oldest.row_bytes
                if oldest.start == len(oldest.keys):
                    del self._windows[serial]

    def take(self, grouped, keys: list[str | None]) -> dict[int, dict]:
        """The remembered values of a window's pairs still to score: window item index → values."""
        wanted: dict[int, list[tuple[int, int]]] = {}  # window serial → (item index, row)
        with self._lock:
            held = self._where.keys() & set(keys)  # the common case: none, found without a lookup per pair
            if not held:
                return {}
            for refs in grouped.refs:
                for ref in refs.tolist():
                    if keys[ref] in held:
                        where = self._where[keys[ref]]
                        wanted.setdefault(where[0], []).append((ref, where[1]))
            tables = {serial: self._windows[serial].values for serial in wanted}
        found = {}
        for serial, refs in wanted.items():
            rows = tables[serial].take([row for _, row in refs]).to_pylist()
            found.update((ref, values) for (ref, _), values in zip(refs, rows))
        return found


@dataclasses.dataclass
class _HeldWindow:
    """One written window's values that ScoredPairs holds: its rows from `start` on are still remembered."""

    values: pa.Table  # REUSED columns
    keys: list[str]  # the score key of each row
    row_bytes: float  # what one row costs: its Arrow values and its key in the dict
    start: int = 0


def _write_keys(config: RunConfig, source: InputSource, key: bytes, path: Path) -> None:
    """One pass over the input: (row_index, item_pos, score_key) of every readable pair, to a Parquet file."""
    _, windows = read_windows(source, config.columns, config.window_rows)
    with pq.ParquetWriter(path, KEY_SCHEMA) as writer:
        for window in windows:
            keys = pa.array(pair_keys(window, key), pa.string())
            table = pa.table(
                [window.index[window.item_rows()], window.item_positions().astype(np.int32), keys],
                schema=KEY_SCHEMA,
            )
            writer.write_table(table.filter(pc.is_valid(keys)))


def _remove_stale_directories() -> None:
    """Remove the temporary directories of --reuse runs whose process is gone (killed with -9)."""
    for path in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*"):
        pid = path.name[len(TEMP_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and process_gone(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
