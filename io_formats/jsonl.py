"""JSONL inputs (plain or compressed, local or remote, or stdin spooled to a file): a first pass learns the
columns and their types; then one record per non-blank line (an object with its file's partition values, or a
BadLine saying why not)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from score_batch.io_formats.arrow_types import MAX_DEPTH
from score_batch.io_formats.errors import READ_ERRORS, InputError, unreadable
from score_batch.io_formats.listing import JSONL, InputFile
from score_batch.io_formats.locations import Location
from score_batch.io_formats.rows import INT64_MAX, INT64_MIN, BadLine, has_surrogate, unify, value_kind

BOM = b"\xef\xbb\xbf"
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, its escapes included
_BRACKETS = np.zeros(256, np.int8)  # per byte: +1 opens an array or object, -1 closes one
_BRACKETS[[ord("["), ord("{")]], _BRACKETS[[ord("]"), ord("}")]] = 1, -1
INFER_CHUNK = 1024  # nested JSONL values per pyarrow type inference
READ_CHUNK = 1 << 20  # bytes per read from a (possibly remote, possibly compressed) JSONL stream

_FAMILIES = {"bool": "boolean", "int": "number", "float": "number"}  # the other kinds: text, list, object


class _ColumnScan:
    """What one JSONL column holds over all lines: kinds of values (with their first line), nested types."""

    def __init__(self) -> None:
        self.kinds: dict[str, tuple[int, str]] = {}  # bool / int / … → (row order, first line)
        self.nested: pa.DataType | None = None  # lists and objects: their unified Arrow type so far
        self.pending: list[Any] = []
        self.pending_lines: list[str] = []
        self.problem: str | None = None  # the first value that no type can hold

    def add(self, value: Any, line: str, order: int) -> None:
        kind = value_kind(value)
        if kind is None:
            return
        self.kinds.setdefault(kind, (order, line))
        if kind == "int" and not INT64_MIN <= value <= INT64_MAX and self.problem is None:
            self.problem = f"line {line}: the integer {value} does not fit in 64 bits"
        if kind in ("list", "object") and self.problem is None and not has_surrogate(value):
            self.pending.append(value)
            self.pending_lines.append(line)
            if len(self.pending) >= INFER_CHUNK:
                self.flush()

    def flush(self) -> None:
        """Infer the pending nested values' type and unify it with the type so far."""
        if not self.pending or self.problem is not None:
            return
        try:
            dtype = pa.array(self.pending).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
            first, last = self.pending_lines[0], self.pending_lines[-1]
            where = f"line {first}" if first == last else f"lines {first}-{last}"
            self.problem = f"{where}: values that cannot share one type ({error})"
        else:
            merged = dtype if self.nested is None else unify(self.nested, dtype)
            if merged is None:
                self.problem = (
                    f"line {self.pending_lines[0]} or later: {dtype} where earlier lines hold {self.nested}"
                )
            self.nested = merged
        self.pending, self.pending_lines = [], []

    def type_of(self, name: str, label: str) -> pa.DataType:
        """The column's Arrow type once every line was added and flushed; InputError when it has none."""
        families: dict[str, str] = {}  # family → its first line
        for kind, (_, line) in sorted(self.kinds.items(), key=lambda item: item[1][0]):
            families.setdefault(_FAMILIES.get(kind, kind), line)
        if len(families) > 1:
            shown = ", ".join(f"{family} (first on line {line})" for family, line in families.items())
            raise InputError(f"{label}: column {name!r} mixes {shown}; give every value of a column one type")
        if self.problem is not None:
            raise InputError(f"{label}: column {name!r}, {self.problem}")
        family = next(iter(families), None)  # None: only nulls
        if family == "number":
            return pa.float64() if "float" in self.kinds else pa.int64()
        flat = {None: pa.null(), "boolean": pa.bool_(), "text": pa.string()}
        if family in flat:
            return flat[family]
        return self.nested if self.nested is not None else pa.null()


class _JsonlScan:
    """The first pass over a JSONL input: its columns in order of first appearance and their values' types."""

    def __init__(self) -> None:
        self.columns: dict[str, _ColumnScan] = defaultdict(_ColumnScan)
        self.rows = 0  # lines that are rows (objects or unreadable; blank lines are not rows)
        self.rows_per_file: list[int] = []
        self.objects = 0
        self.first_bad: BadLine | None = None


class JsonlReader:
    """The JSONL files of an input, in order: their columns and types (one scan, cached) and their lines."""

    def __init__(self, files: tuple[InputFile, ...], label: str) -> None:
        self.files = files
        self.label = label
        self._scan: _JsonlScan | None = None

    def columns(self) -> list[str] | None:
        """Every line's keys in order of first appearance (None: no line at all)."""
        scan = self.scan()
        if scan.objects == 0 and scan.first_bad is not None:
            bad = scan.first_bad
            raise InputError(f"{self.label}: no line is a JSON object (line {bad.line}: {bad.message})")
        return list(scan.columns) if scan.objects else None

    def column_type(self, name: str) -> pa.DataType:
        column = self.scan().columns.get(name)
        return pa.null() if column is None else column.type_of(name, self.label)

    def total_rows(self) -> int:
        return self.scan().rows

    def all_objects(self) -> bool:
        """Whether this reader's first pass, if it made one, read every line as one JSON object (its blocks may
        then be parsed by pyarrow: io_formats/window.json_window)."""
        return self._scan is not None and self._scan.first_bad is None

    def units(self) -> list[tuple[InputFile, int | None, int]]:
        """(file, None, rows) per file: a JSONL file is read whole by one worker."""
        return [(file, None, rows) for file, rows in zip(self.files, self.scan().rows_per_file)]

    def scan(self) -> _JsonlScan:
        """Scan every line once (cached)."""
        if self._scan is None:
            scan = _JsonlScan()
            for file in self.inputs():
                before = scan.rows
                for line, raw in self._numbered(file):
                    record = parse_line(raw, line)
                    scan.rows += 1
                    if isinstance(record, BadLine):
                        scan.first_bad = scan.first_bad or record
                        continue
                    scan.objects += 1
                    for name, value in file.with_partitions(record).items():
                        scan.columns[name].add(value, line, scan.rows)
                scan.rows_per_file.append(scan.rows - before)
            for column in scan.columns.values():
                column.flush()
            self._scan = scan
        return self._scan

    def line_blocks(
        self, size: int, unit: tuple[InputFile, None] | None = None
    ) -> Iterator[tuple[InputFile, list[tuple[str, bytes]]]]:
        """(file, [(line, raw bytes)]) blocks of at most size non-blank lines, in order (unit: one file's only)."""
        for file in self.inputs():
            if unit is not None and file != unit[0]:
                continue
            block: list[tuple[str, bytes]] = []
            for line in self._numbered(file):
                block.append(line)
                if len(block) == size:
                    yield file, block
                    block = []
            if block:
                yield file, block

    def inputs(self) -> tuple[InputFile, ...]:
        """The files in order (stdin: its spool)."""
        return self.files

    def _numbered(self, file: InputFile) -> Iterator[tuple[str, bytes]]:
        """(line as messages name it, raw bytes) per non-blank line of one file."""
        several = len(self.files) > 1
        for number, raw in nonblank_lines(file_lines(file)):
            yield f"{number} of {file}" if several else str(number), raw


def nonblank_lines(lines: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) of every non-blank line (a leading byte order mark dropped)."""
    for number, raw in enumerate(lines, start=1):
        if number == 1:
            raw = raw.removeprefix(BOM)
        if raw.strip():
            yield number, raw


def file_lines(file: InputFile) -> Iterator[bytes]:
    """The raw lines of one input file, decompressed by its suffix; a damaged or vanished file is an InputError,
    the machine's refusal an OSError."""
    try:
        stream = file.open()
    except FileNotFoundError:
        raise InputError(f"{file}: the file is gone (removed while the run started?)") from None
    except OSError as error:
        raise unreadable(error, f"{file}: cannot read ({error.strerror or error})") from None
    with stream:
        rest = b""
        while True:
            try:
                chunk = stream.read(READ_CHUNK)
            except READ_ERRORS as error:
                raise unreadable(error, f"{file}: cannot read ({error})") from None
            if not chunk:
                break
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                yield line + b"\n"
        if rest:
            yield rest


class StdinReader(JsonlReader):
    """JSONL on standard input, spooled to a temporary file on first read (so it can be read twice)."""

    def __init__(self) -> None:
        super().__init__((), "stdin")
        self._spool: Path | None = None
        self._cleanup: weakref.finalize | None = None

    def spool_path(self) -> Path:
        """The spool file (stdin is copied into it on the first call)."""
        if self._spool is None:
            handle, name = tempfile.mkstemp(prefix="score-batch-stdin-", suffix=".jsonl")
            self._cleanup = weakref.finalize(self, Path(name).unlink, missing_ok=True)
            with os.fdopen(handle, "wb") as spool:
                stream = getattr(sys.stdin, "buffer", None)
                if stream is not None:
                    shutil.copyfileobj(stream, spool, 1 << 20)
                else:
                    spool.write(sys.stdin.read().encode("utf-8", "surrogateescape"))
            self._spool = Path(name)
        return self._spool

    def close(self) -> None:
        """Delete the spool, if any (reading again spools nothing: stdin is consumed)."""
        if self._cleanup is not None:
            self._cleanup()

    def units(self) -> list[tuple[InputFile, int | None, int]]:
        raise InputError("distributed runs read files, not stdin")

    def inputs(self) -> tuple[InputFile, ...]:
        return (InputFile(Location.on_disk(self.spool_path(), self.label), JSONL, None),)


def parse_line(raw: bytes, line: str) -> dict | BadLine:
    """One line as an object, or a BadLine saying why not (nested deeper than MAX_DEPTH: too_deep)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return BadLine(
            line, f"not valid UTF-8 (byte 0x{raw[error.start]:02x} at byte {error.start + 1} of the line)"
        )
    deep = too_deep(raw)
    if deep is not None:
        return BadLine(line, deep)
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        return BadLine(line, f"not valid JSON ({error.msg} at column {error.colno})")
    except RecursionError:  # a recursion limit set lower than MAX_DEPTH needs
        return BadLine(line, "not valid JSON (nested too deeply)")
    return record if isinstance(record, dict) else BadLine(line, "not a JSON object")


def too_deep(raw: bytes | str) -> str | None:
    """Why a JSON line is not read (its arrays and objects nest deeper than MAX_DEPTH: Python's json would
    recurse once a level, to the recursion limit and past it), or None; counted without recursion, brackets
    inside strings left out."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:  # the common case: two scans in C
        return None
    outside = _JSON_STRING.sub(b"", data)
    stray = outside.find(b'"')  # an unterminated string: what follows is its text (json.loads refuses it)
    codes = np.frombuffer(outside if stray < 0 else outside[:stray], np.uint8)  # [bytes outside strings]
    depth = int(np.cumsum(_BRACKETS[codes], dtype=np.int64).max(initial=0))
    if depth <= MAX_DEPTH:
        return None
    return f"nested {depth} levels deep (arrays and objects); score-batch reads at most {MAX_DEPTH} levels"
