"""Idempotent reruns: how a finished output records what produced it, and the check of a rerun.

Every published output carries its completion fingerprint (model, settings and a digest of the input's
rows, whatever the window size): a Parquet file in its schema metadata, a partitioned dataset in its
`_common_metadata` (trusted only with `_SUCCESS`). JSONL has no place for it, so a --resume run writing
JSONL records it in OUTPUT.done beside the output, with the output's size and time. Rerunning the same
command with --resume (a cron job, an Airflow "clear and rerun") reads the input again (no model is
loaded) and, when the fingerprints match, exits 0 "already complete" without touching the output.
Anything else (a changed input, model or setting, an output replaced since) is refused as an existing
output always was.
"""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from score_batch.engine.model_source import model_identity
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.readers import InputSource, read_windows
from score_batch.io_formats.target import Target
from score_batch.io_formats.writers import COMMON_METADATA, SUCCESS, output_format
from score_batch.job.config import FINGERPRINTED, Fingerprint, RunConfig
from score_batch.job.windows import window_hash

METADATA_KEY = b"score_batch.completion"
RECORD_KEY = b"score_batch.completion_record"  # what the fingerprint digests, to name a difference
SIDECAR = ".done"  # JSONL outputs: OUTPUT.done


def input_digest(config: RunConfig, source: InputSource) -> str:
    """Read the whole input (no model) and digest its rows the way a run does (window_hash's content)."""
    _, windows = read_windows(source, config.columns, config.window_rows)
    content = hashlib.sha256()
    for rows in windows:
        window_hash(rows, content)
    return content.hexdigest()


def completion_fingerprint(config: RunConfig, digest: str) -> Fingerprint:
    """The fingerprint a completed output is recorded with: settings, model and input content."""
    return config.fingerprint(model_identity(config.model_dir), [digest])


def stamped(schema: pa.Schema, fingerprint: Fingerprint | None) -> pa.Schema:
    """A Parquet output's schema carrying its completion fingerprint and record (unchanged when there is none)."""
    if fingerprint is None:
        return schema
    record = json.dumps(fingerprint.record, sort_keys=True).encode()
    return schema.with_metadata(
        {**(schema.metadata or {}), METADATA_KEY: fingerprint.digest.encode(), RECORD_KEY: record}
    )


class Completion:
    """The completion record of one output (a local path or an object-store URI; dataset: a --partition-by
    directory)."""

    def __init__(self, output: Target, dataset: bool) -> None:
        self.output = output
        self.dataset = dataset
        self.sidecar = not dataset and _names_jsonl(output.path)
        self.record = output.sibling(SIDECAR)

    def recorded(self) -> str | None:
        """The fingerprint the existing output was completed with (None: no completed output here)."""
        return self._stamp()[0]

    def _stamp(self) -> tuple[str | None, dict | None]:
        """(fingerprint, its record) of the existing output; (None, None) when no completed output is here."""
        try:
            if self.sidecar:
                record = json.loads(self.record.read_bytes() or b"")
                published = record.get("output") if isinstance(record, dict) else None
                if published != self._published():
                    return None, None
                return record.get("fingerprint"), record.get("record")
            if self.dataset:
                if not self.output.child(SUCCESS).is_file():
                    return None, None
                schema = _read_schema(self.output.child(COMMON_METADATA))
            else:
                schema = _read_schema(self.output)
        except (OSError, ValueError, pa.ArrowInvalid):
            return None, None
        metadata = schema.metadata or {}
        value, record = metadata.get(METADATA_KEY), metadata.get(RECORD_KEY)
        try:
            record = json.loads(record) if record else None
        except ValueError:
            record = None
        return (value.decode() if value else None), record

    def exists(self) -> bool:
        """True when an earlier run completed this output."""
        return self.recorded() is not None

    def check_rerun(self, config: RunConfig, source: InputSource) -> None:
        """Refuse a rerun on a completed output unless model, settings and input content are the same."""
        recorded, record = self._stamp()
        now = completion_fingerprint(config, input_digest(config, source))
        if recorded != now.digest:
            what = now.difference(record) if recorded is not None else ""
            differs = (
                f"differently: {what}" if what else f"with a different {FINGERPRINTED} (or replaced since)"
            )
            raise InputError(
                f"output {config.output!r} already exists, completed {differs}; pass --overwrite to replace it"
            )

    def published(self, fingerprint: Fingerprint, resume: bool) -> None:
        """After publishing: a JSONL output's record (--resume runs write it; others drop a stale one)."""
        if not self.sidecar:
            return
        if not resume:
            self.record.delete()
            return
        record = {
            "fingerprint": fingerprint.digest,
            "record": fingerprint.record,
            "output": self._published(),
        }
        self.record.write_bytes(json.dumps(record).encode())

    def _published(self) -> list | None:
        """Size and modification time of the output file."""
        info = self.output.info()
        return [info.size, info.mtime_ns] if info.type == pafs.FileType.File else None


def _names_jsonl(path: str) -> bool:
    """True when an output path names a JSONL file (a directory, as a Ray run writes, names none)."""
    try:
        return output_format(path) == "jsonl"
    except InputError:
        return False


def _read_schema(where: Target) -> pa.Schema:
    with where.fs.open_input_file(where.path) as handle:
        return pq.read_schema(handle)
