"""Idempotent reruns: what a finished output records about what produced it and what it published.

The record (the run's identity, job/checkpoint/identity, with the input's content digest) sits in a Parquet
output's schema metadata, beside its row count in the footer (another tool's rewrite drops it); a --resume run
writing JSONL or a --partition-by dataset writes it to OUTPUT.done with the output's size and modification
time (a dataset: every file's; trusted only with `_SUCCESS`). A --resume rerun reads the input again (no
model) and exits 0 "already complete" when the records match and the output is unchanged; else it is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location
from score_batch.io_formats.readers import InputSource, read_windows
from score_batch.io_formats.writers import ROWS_KEY, SUCCESS, output_format
from score_batch.job.checkpoint.identity import FINGERPRINTED, RunIdentity
from score_batch.job.checkpoint.input_digest import InputDigest
from score_batch.job.checkpoint.record_check import check_fingerprint, check_record, check_sidecar, parsed
from score_batch.job.run_config import RunConfig

METADATA_KEY = b"score_batch.completion"
RECORD_KEY = b"score_batch.completion_record"  # what the fingerprint digests, to name a difference
SIDECAR = ".done"  # JSONL and dataset outputs: OUTPUT.done


def input_digest(config: RunConfig, source: InputSource) -> str:
    """Read the whole input (no model) and digest its rows the way a run does
    (job/checkpoint/input_digest.InputDigest)."""
    _, windows = read_windows(source, config.columns, config.window_rows)
    content = InputDigest()
    for window in windows:
        content.add(window)
    return content.hexdigest()


def stamped(schema: pa.Schema, completed: RunIdentity | None) -> pa.Schema:
    """A Parquet output's schema carrying its completed identity's digest and record (unchanged: none)."""
    if completed is None:
        return schema
    record = json.dumps(completed.record, sort_keys=True).encode()
    return schema.with_metadata(
        {**(schema.metadata or {}), METADATA_KEY: completed.digest.encode(), RECORD_KEY: record}
    )


@dataclass(frozen=True)
class Stamp:
    """What an existing output says produced it, and how it differs from what was published."""

    fingerprint: str | None = None  # None: no completed output here
    record: dict | None = None  # what the fingerprint digests
    changed: str | None = None  # why the output is no longer what was published (None: it is)


class Completion:
    """The completion record of one output (a path or URI; dataset: a --partition-by directory)."""

    def __init__(self, output: Location, dataset: bool) -> None:
        self.output = output
        self.dataset = dataset
        self.sidecar = dataset or _names_jsonl(output.path)
        self.record = output.sibling(SIDECAR)

    def _stamp(self) -> Stamp:
        """The existing output's fingerprint, its record, and how it changed since it was published."""
        if self.sidecar:
            return self._sidecar_stamp()
        try:
            with self.output.fs.open_input_file(self.output.path) as handle:  # the footer
                metadata = pq.read_metadata(handle)
            changed = _file_changed(metadata)
        except (OSError, ValueError, pa.ArrowInvalid):
            return Stamp()
        keys = metadata.schema.to_arrow_schema().metadata or {}
        value, record = keys.get(METADATA_KEY), keys.get(RECORD_KEY)
        if value is None:  # not a completed output (or another tool's rewrite)
            return Stamp()
        where = f"in {self.output.uri!r} (its Parquet metadata)"
        fingerprint = check_fingerprint(value.decode(errors="replace"), where)
        record = None if record is None else check_record(parsed(record, where), where)
        return Stamp(fingerprint, record, changed)

    def _sidecar_stamp(self) -> Stamp:
        """The output's OUTPUT.done (none when it or the output is gone: nothing completed is here)."""
        try:
            text, now = self.record.read_bytes(), self._published()
        except (OSError, ValueError):
            return Stamp()
        if text is None or now is None:
            return Stamp()
        where = repr(self.record.uri)
        record = check_sidecar(parsed(text, where), where, self.dataset)
        changed = None
        if self.dataset:
            changed = _files_changed(record["files"], now)
        elif record["output"] != now:
            changed = f"its size or modification time is not the one {self.record.name} records"
        return Stamp(record["fingerprint"], record["record"], changed)

    def exists(self) -> bool:
        """True when an earlier run completed this output."""
        return self._stamp().fingerprint is not None

    def check_rerun(self, config: RunConfig, source: InputSource, identity: RunIdentity) -> dict:
        """Refuse a rerun on a completed output unless its identity, input and output are still the same; the
        record it was completed with."""
        stamp = self._stamp()
        now = identity.completed(input_digest(config, source))
        replace = "pass --overwrite to replace it"
        if config.overwrite:  # given already: --resume is what keeps the output
            replace = (
                "drop --resume to replace it (under --resume a completed output is kept, --overwrite or not)"
            )
        if stamp.fingerprint != now.digest:
            what = now.difference(stamp.record) if stamp.fingerprint is not None else ""
            differs = (
                f"differently: {what}" if what else f"with a different {FINGERPRINTED} (or replaced since)"
            )
            raise InputError(f"output {config.output!r} already exists, completed {differs}; {replace}")
        if stamp.changed is not None:
            raise InputError(
                f"output {config.output!r} changed since it was completed ({stamp.changed}), so it is not "
                f"what this run would publish; {replace}"
            )
        return stamp.record or {}

    def published(self, completed: RunIdentity, resume: bool) -> None:
        """After publishing: a JSONL or dataset output's OUTPUT.done (--resume writes it, others drop it)."""
        if not self.sidecar:
            return
        if not resume:
            self.record.delete()
            return
        record = {"fingerprint": completed.digest, "record": completed.record}
        record["files" if self.dataset else "output"] = self._published()
        self.record.write_bytes(json.dumps(record).encode())

    def _published(self) -> list | dict | None:
        """[size, mtime] of the output file; a dataset's {path below it: [size, mtime]} (None: no `_SUCCESS`)."""
        if not self.dataset:
            info = self.output.info()
            return [info.size, info.mtime_ns] if info.type == pafs.FileType.File else None
        if not self.output.child(SUCCESS).is_file():
            return None
        base = self.output.path.rstrip("/")
        files = {}
        for info in self.output.fs.get_file_info(pafs.FileSelector(base, recursive=True)):
            relative = info.path[len(base) :].lstrip("/")
            if info.type == pafs.FileType.File and not any(
                p.startswith(("_", ".")) for p in relative.split("/")
            ):
                files[relative] = [info.size, info.mtime_ns]
        return files


def _files_changed(published: dict[str, list], now: dict[str, list]) -> str | None:
    """How a dataset's files differ from the ones its record lists (None: they do not)."""
    gone = sorted(set(published) - set(now))
    added = sorted(set(now) - set(published))
    common = sorted(set(now) & set(published))
    resized = [path for path in common if now[path][0] != published[path][0]]
    rewritten = [path for path in common if now[path] != published[path] and path not in resized]
    for paths, what in (
        (gone, "gone"),
        (added, "not published by it"),
        (resized, "of another size"),
        (rewritten, "rewritten since (another modification time)"),
    ):
        if paths:
            more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
            return f"{paths[0]}{more} {'are' if more else 'is'} {what}"
    return None


def _file_changed(footer: pq.FileMetaData) -> str | None:
    """How a Parquet output differs from what was published: its footer's row count (None: it does not)."""
    rows = (footer.metadata or {}).get(ROWS_KEY)
    if rows is None:
        return "it was rewritten since: its footer has no score-batch row count"
    if int(rows) != footer.num_rows:
        return f"it holds {footer.num_rows} rows; {int(rows)} were published"
    return None


def _names_jsonl(path: str) -> bool:
    """True when an output path names a JSONL file (a directory, as a Ray run writes, names none)."""
    try:
        return output_format(path) == "jsonl"
    except InputError:
        return False
