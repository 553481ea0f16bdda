"""Checkpointed result parts beside the destination, what makes a killed run resumable: a part counts only when
the manifest lists it with its bytes' checksum and its input window's hash; nothing else is ever merged."""

from __future__ import annotations

import hashlib
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq

from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location
from score_batch.io_formats.writers import dictionary_columns
from score_batch.job.checkpoint.input_digest import InputDigest

MANIFEST = "manifest.json"
STORED_AS_BYTES = b"score_batch.stored_as_bytes"  # a part column's field metadata: its Arrow type, serialized
log = logging.getLogger(__name__)


class PartStore:
    """One Parquet part per input window in a checkpoint directory (OUTPUT.parts/), listed in a manifest."""

    def __init__(self, directory: Location) -> None:
        self.dir = directory
        self._manifest: dict = {"fingerprint": None, "parts": {}}
        self._found: bytes | None = None  # the manifest as load() found it (undo restores it)
        self._created: set[int] = set()  # windows whose part this run wrote where none was listed
        self._found_parts: frozenset[str] = frozenset()  # the windows it lists
        self._swept = False  # staging files a killed run left: removed at this run's first write

    def exists(self) -> bool:
        """True when a previous run left parts (or a manifest) here."""
        return bool(self.dir.list_names())

    def load(self) -> str | None:
        """Read the manifest of an earlier run; its fingerprint, or None when there is no valid manifest."""
        found = self.dir.child(MANIFEST).read_bytes()
        try:
            manifest = json.loads(found or b"")
        except ValueError:
            return None
        if not _well_formed(manifest):
            return None
        self._manifest, self._found, self._found_parts = manifest, found, frozenset(manifest["parts"])
        return manifest.get("fingerprint")

    def record(self) -> dict | None:
        """What the earlier run's fingerprint digests (to name a difference), when its manifest holds it."""
        return self._manifest.get("record")

    def start(self, fingerprint: str, keep: bool, record: dict | None = None) -> None:
        """Begin this run's manifest: keep the earlier run's listed parts (resume) or start empty; InputError
        when they were checked with another input digest (job/checkpoint/input_digest)."""
        digest, earlier = InputDigest.VERSION.decode(), self._manifest.get("input_digest")
        if keep and self._manifest["parts"] and earlier != digest:
            raise InputError(
                f"cannot --resume: the parts in {self.dir.uri!r} were checked with "
                f"{earlier or 'an older input digest'} (this score-batch: {digest}); pass --overwrite "
                "(without --resume) to start over"
            )
        self.dir.make_dirs()
        parts = self._manifest["parts"] if keep else {}
        if not keep:
            self._found = None  # nothing found is kept: undo removes the directory
        manifest = dict(fingerprint=fingerprint, record=record, input_digest=digest, parts=parts)
        if manifest != self._manifest or self._found is None:
            self._manifest = manifest
            self._save()

    def part(self, window: int) -> Location:
        """Where window k's part lives."""
        return self.dir.child(f"part-{window:08d}.parquet")

    def verified(self, window: int, input_hash: str) -> bool:
        """True when window k's part is listed and intact; InputError when it was scored from another input."""
        entry = self._manifest["parts"].get(str(window))
        if entry is None:
            return False
        if entry.get("input_sha256") != input_hash:
            raise InputError(
                f"cannot --resume: the input changed since the checkpointed parts in {self.dir.uri!r} were "
                f"written (window {window} differs); pass --overwrite (without --resume) to start over"
            )
        data = self.part(window).read_bytes()
        if data is None or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            log.warning(
                "checkpointed part %s is missing or damaged; scoring its window again", self.part(window)
            )
            del self._manifest["parts"][str(window)]
            return False
        return True

    def write(self, window: int, table: pa.Table, input_hash: str) -> None:
        """Write window k's results: a staging file, listed in the manifest with its checksum, then published (a
        kill leaves an unlisted staging file, removed next run, or a listed part missing or whole)."""
        if not self._swept:
            for name in self.dir.list_names():
                if name.startswith(".") and ".tmp-" in name:  # a part cut off while written
                    self.dir.child(name).delete()
            self._swept = True
        if self._found is None or str(window) not in self._found_parts:
            self._created.add(window)
        part = self.part(window)
        tmp = part.staging_file()
        try:
            pq.write_table(as_stored(table), tmp, use_dictionary=dictionary_columns(table.schema))
            self._manifest["parts"][str(window)] = {
                "sha256": hashlib.sha256(tmp.read_bytes()).hexdigest(),
                "input_sha256": input_hash,
            }
            self._save()
            part.publish_file(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def read(self, window: int) -> pa.Table:
        """Window k's results."""
        return as_read(pq.read_table(pa.BufferReader(self.part(window).read_bytes())))

    def windows(self) -> list[int]:
        """Listed window numbers in order."""
        return sorted(int(window) for window in self._manifest["parts"])

    def clear(self) -> None:
        """Delete every part and the manifest."""
        self.dir.delete_tree()
        self._manifest = {"fingerprint": None, "parts": {}}
        self._found, self._created = None, set()

    def undo(self) -> None:
        """Leave the directory as this run found it (a refused run): the parts it wrote where none was listed
        removed, the manifest it found restored; with none found (nothing resumed), the whole directory."""
        if self._found is None:
            self.clear()
            return
        for window in sorted(self._created):
            self.part(window).delete()
        self.dir.child(MANIFEST).write_bytes(self._found)
        self._manifest, self._created = json.loads(self._found), set()

    def _save(self) -> None:
        """Replace the manifest in one step."""
        self.dir.child(MANIFEST).write_bytes(json.dumps(self._manifest).encode())


def _well_formed(manifest: object) -> bool:
    """A manifest as _save writes it: its fingerprint and digest version strings, its record an object, each
    listed part a window number with its checksums (anything else: no valid manifest, nothing is resumed)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), dict):
        return False
    strings = all(isinstance(manifest.get(k), (str, type(None))) for k in ("fingerprint", "input_digest"))
    parts = all(
        window.isdigit()
        and isinstance(entry, dict)
        and all(isinstance(entry.get(k), str) for k in ("sha256", "input_sha256"))
        for window, entry in manifest["parts"].items()
    )
    return strings and parts and isinstance(manifest.get("record"), (dict, type(None)))


def as_stored(table: pa.Table) -> pa.Table:
    """The table as a part stores it: a fixed-size list of numbers (pooled vectors), which Parquet writes and
    reads element by element with levels (3-4× slower each way), as fixed-size binary of the same bytes, its
    type in the field's metadata (as_read restores it); a sliced one as it is."""
    for k, field in enumerate(table.schema):
        if not pa.types.is_fixed_size_list(field.type) or not pa.types.is_primitive(field.type.value_type):
            continue
        column = table.column(k).combine_chunks()
        if column.offset or column.values.offset or column.values.null_count:
            continue
        width = field.type.list_size * field.type.value_type.bit_width // 8
        data = column.values.buffers()[1]
        stored = pa.Array.from_buffers(pa.binary(width), len(column), [column.buffers()[0], data])
        original = pa.schema([field.remove_metadata()]).serialize().to_pybytes()
        kept = pa.field(
            field.name, stored.type, field.nullable, {**(field.metadata or {}), STORED_AS_BYTES: original}
        )
        table = table.set_column(k, kept, stored)
    return table


def as_read(table: pa.Table) -> pa.Table:
    """A part as written before as_stored: each column stored as bytes back in its own type (zero-copy)."""
    for k, field in enumerate(table.schema):
        if STORED_AS_BYTES not in (field.metadata or {}):
            continue
        original = pa.ipc.read_schema(pa.py_buffer(field.metadata[STORED_AS_BYTES])).field(0)
        metadata = {key: value for key, value in field.metadata.items() if key != STORED_AS_BYTES}
        dtype = original.type
        chunks = []
        for chunk in table.column(k).chunks:
            values = pa.Array.from_buffers(
                dtype.value_type,
                len(chunk) * dtype.list_size,
                [None, chunk.buffers()[1]],
                0,
                chunk.offset * dtype.list_size,
            )
            chunks.append(
                pa.FixedSizeListArray.from_arrays(
                    values, dtype.list_size, mask=chunk.is_null() if chunk.null_count else None
                )
            )
        restored = pa.chunked_array(chunks, dtype)
        table = table.set_column(k, original.with_metadata(metadata or None), restored)
    return table
