"""INPUT arguments → the files they mean, in a defined order, with their hive partition values.

An INPUT is a file, a directory or a glob on any filesystem of io_formats.locations. A directory means
its data files and those of its hive partition directories (`dt=2026-11-22/country=DE/…`), recursively;
other sub-directories and names starting with `.` or `_` (`_SUCCESS`, `.part.tmp-1`) are not read. A
glob (`*`, `?`, `[…]` in any segment; `**` for any depth) means the data files it matches, hidden and
`_` names left out. Order: the INPUTs as given, each one's files sorted by path; rows follow in file
order, and row_index counts rows over all of them. Every `key=value` directory in a file's path becomes
a column `key` (a column the file itself holds wins), typed over all the files' values by rules close to those DuckDB's
hive_types_autocast and polars share (type_partitions; neither library types a list of values: DuckDB only
while reading the files, pyarrow.dataset only as int32 or text; the differences: docs/formats.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from score_batch.choices import HiveTypes
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import HTTP, Location, has_glob
from score_batch.io_formats.writers import JSONL_COMPRESSIONS

log = logging.getLogger(__name__)


class FileFormat(StrEnum):
    """What an input holds: Parquet or JSONL query/item rows, or OpenAI-style batch requests (JSONL)."""

    PARQUET = "parquet"
    JSONL = "jsonl"
    OPENAI_BATCH = "openai-batch"


PARQUET, JSONL = FileFormat.PARQUET, FileFormat.JSONL
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_PARTITION = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(.*)$")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_INTEGER = re.compile(r"[+-]?\d+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_GLOB_TOKEN = re.compile(r"\*\*/?|\[[^\]]*\]|.", re.DOTALL)  # `**/`, `**`, a closed `[…]`, or one character
_GLOB_PARTS = {"**/": "(?:[^/]*/)*", "**": ".*", "*": "[^/]*", "?": "[^/]"}
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?")


@dataclass(frozen=True)
class InputFile:
    """One data file of the input: where it is, its format and compression, and its partition values."""

    location: Location
    format: FileFormat
    compression: str | None
    partitions: tuple[tuple[str, Any], ...] = ()  # (key, value): a string, or typed by type_partitions

    def __str__(self) -> str:
        return self.location.uri

    def open(self) -> pa.NativeFile:
        """A stream of the file's bytes, decompressed by its suffix."""
        return self.location.fs.open_input_stream(self.location.path, compression=self.compression)

    def with_partitions(self, record: dict) -> dict:
        """A record with this file's partition values added (a column the file holds wins)."""
        for key, value in self.partitions:
            record.setdefault(key, value)
        return record


def _integer(text: str) -> int:
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise ValueError(text)
    return value


# Partition value types tried in DuckDB's order (DATE, TIMESTAMP, BIGINT): (pattern, parser, Arrow type); the
# patterns are disjoint, so "every value parses as T" is DuckDB's "every value's first type is T".
_HIVE_TYPES: tuple[tuple[re.Pattern, Callable[[str], Any], pa.DataType], ...] = (
    (_DATE, datetime.date.fromisoformat, pa.date32()),
    (_TIMESTAMP, datetime.datetime.fromisoformat, pa.timestamp("us")),
    (_INTEGER, _integer, pa.int64()),
)


def type_partitions(
    files: list[InputFile], hive_types: HiveTypes
) -> tuple[list[InputFile], dict[str, pa.DataType]]:
    """The files with their partition values typed over all of them, and each key's Arrow type: date32,
    timestamp[us] or int64 when every non-null value parses as one (DuckDB's order), else (or "string") strings."""
    values: dict[str, list[str]] = {}
    for file in files:
        for key, value in file.partitions:
            values.setdefault(key, [])
            if value is not None:
                values[key].append(value)
    parsers: dict[str, Callable[[str], Any]] = {}
    types: dict[str, pa.DataType] = {key: pa.string() for key in values}
    if hive_types == "infer":
        for key, texts in values.items():
            for pattern, parse, dtype in _HIVE_TYPES:
                if texts and all(pattern.fullmatch(text) and _parses(parse, text) for text in texts):
                    parsers[key], types[key] = parse, dtype
                    break
    typed = [
        dataclasses.replace(
            file,
            partitions=tuple(
                (key, parsers[key](value) if key in parsers and value is not None else value)
                for key, value in file.partitions
            ),
        )
        for file in files
    ]
    return typed, types


def _parses(parse: Callable[[str], Any], text: str) -> bool:
    try:
        parse(text)
    except ValueError:
        return False
    return True


def file_format(name: str) -> tuple[FileFormat, str | None] | None:
    """(format, compression) from a file name, or None when it is not a data file we read."""
    lowered = name.lower()
    compression = None
    for suffix, codec in JSONL_COMPRESSIONS.items():
        if lowered.endswith(suffix):
            lowered, compression = lowered[: -len(suffix)], codec
            break
    if lowered.endswith(".parquet") and compression is None:
        return PARQUET, None
    if lowered.endswith(_JSONL_SUFFIXES):
        return JSONL, compression
    return None


def partitions_of(path: str) -> tuple[tuple[str, str | None], ...]:
    """The key=value directories of a path, in order (a key repeated: the innermost wins)."""
    found: dict[str, str | None] = {}
    for segment in path.split("/")[:-1]:
        match = _PARTITION.match(segment)
        if match:
            value = urllib.parse.unquote(match.group(2))
            found[match.group(1)] = None if value == HIVE_NULL else value
    return tuple(found.items())


def expand(location: Location) -> tuple[list[InputFile], Location | None]:
    """The files an INPUT means, sorted by path, and the directory it reads from (None for one file)."""
    if has_glob(location.path) and location.scheme != HTTP:
        return _glob(location)
    info = file_info(location)
    if info.type == pafs.FileType.NotFound:
        raise InputError(f"input {location.uri!r} does not exist")
    if info.type == pafs.FileType.Directory:
        return directory_files(location), location
    known = file_format(location.name)
    if known is None:
        raise InputError(
            f"input {location.uri!r}: unknown format; give .parquet, .jsonl (.jsonl.gz, .jsonl.zst) files, "
            "a directory or a glob of them, or - for JSONL on stdin"
        )
    return [InputFile(location, *known, partitions_of(location.path))], None


def file_info(location: Location) -> pafs.FileInfo:
    """What is at a location (NotFound also where the store raises for it)."""
    try:
        return location.info()
    except FileNotFoundError:
        return pafs.FileInfo(location.path, pafs.FileType.NotFound)


def directory_files(location: Location) -> list[InputFile]:
    """A directory's data files and those of its hive partition directories (open_source refuses a format mix)."""
    # only hive partition directories are read below a directory; data files elsewhere are named in a warning
    skipped: list[str] = []
    files = _files_below(
        location, lambda relative: all(map(_PARTITION.match, relative.split("/")[:-1])), skipped
    )
    if files and skipped:
        suffix = skipped[0].rsplit("/", 1)[-1].split(".", 1)[-1]
        log.warning(
            "input directory %s: %d data file(s) in sub-directories that are not key=value partitions are not read "
            "(%s%s); name them as inputs (a glob such as '%s/**/*.%s' reads every level)",
            location.uri, len(skipped), ", ".join(skipped[:3]), ", …" if len(skipped) > 3 else "",
            location.uri.rstrip("/"), suffix,
        )  # fmt: skip
    if not files:
        raise InputError(
            f"input directory {location.uri!r} holds no .parquet files (nor .jsonl files; sub-directories other than "
            "key=value partitions, and names starting with '.' or '_', are not read)"
        )
    return files


def _glob(location: Location) -> tuple[list[InputFile], Location]:
    """The data files matching a glob, below its longest directory without wildcards."""
    segments = location.path.split("/")
    fixed = next(i for i, s in enumerate(segments) if has_glob(s))
    base_path = "/".join(segments[:fixed]) or "/"
    uri_segments = location.uri.split("/")
    base_uri = "/".join(uri_segments[: len(uri_segments) - (len(segments) - fixed)])
    base = Location(location.fs, base_path, base_uri, location.scheme)
    # a glob over '/'-separated paths: * ? […] within a segment, ** across segments
    pattern = re.compile("".join(map(_glob_part, _GLOB_TOKEN.findall("/".join(segments[fixed:])))))
    files = _files_below(base, pattern.fullmatch) if file_info(base).type == pafs.FileType.Directory else []
    if not files:
        raise InputError(f"input {location.uri!r} matches no .parquet or .jsonl files")
    return files, base


def _files_below(
    base: Location, wanted: Callable[[str], Any], skipped: list[str] | None = None
) -> list[InputFile]:
    """The data files below base whose path relative to it is wanted, sorted by path (the others' relative paths
    added to skipped); names starting with '.' or '_' (`_SUCCESS`, `.part.tmp-1`) are never read."""
    root = base.path.rstrip("/")
    files = []
    for entry in base.fs.get_file_info(pafs.FileSelector(root or "/", recursive=True)):
        path = _entry_path(entry, base)
        relative = path[len(root) :].lstrip("/")
        segments = relative.split("/")
        if entry.type != pafs.FileType.File or any(s.startswith((".", "_")) for s in segments):
            continue
        known = file_format(segments[-1])
        if known is not None and wanted(relative):
            files.append(InputFile(base.child(relative), *known, partitions_of(path)))
        elif known is not None and skipped is not None:
            skipped.append(relative)
    return sorted(files, key=lambda f: f.location.path)


def _entry_path(entry: pafs.FileInfo, base: Location) -> str:
    """A listed entry's path; InputError naming it (its bytes escaped) where the name is not UTF-8, which
    pyarrow cannot decode (a Latin-1 partition value of an old export)."""
    try:
        return entry.path
    except UnicodeDecodeError as error:
        name = error.object.decode("utf-8", "backslashreplace") if isinstance(error.object, bytes) else "?"
        raise InputError(
            f"input {base.uri!r}: the name '{name}' below it is not valid UTF-8 (its bytes as \\x..); rename it"
        ) from None


def _glob_part(token: str) -> str:
    """One token of a glob as a regular expression (a `[` never closed stands for itself)."""
    if token in _GLOB_PARTS:
        return _GLOB_PARTS[token]
    if len(token) == 1:
        return re.escape(token)
    body = token[1:-1].replace("\\", "\\\\")
    return f"[^{body[1:]}]" if body.startswith("!") else f"[{body}]"


def check_one_format(files: list[InputFile], label: str) -> FileFormat:
    """The format of all files; InputError when Parquet and JSONL are mixed."""
    formats = {f.format for f in files}
    if len(formats) > 1:
        first = {f.format: f for f in files}
        raise InputError(
            f"{label}: mixes Parquet ({first[PARQUET]}) and JSONL ({first[JSONL]}) files; "
            "give inputs of one format"
        )
    return formats.pop()
