"""Checkpointed result parts beside the destination, what makes a killed run resumable: a part counts only when
the manifest lists it with its bytes' checksum and its input window's hash; nothing else is ever merged."""

from __future__ import annotations

import hashlib
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq

from score_batch.io_formats.digest import InputDigest
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location
from score_batch.io_formats.writers import dictionary_columns

MANIFEST = "manifest.json"
log = logging.getLogger(__name__)


def sha256(data: bytes) -> str:
    """The SHA-256 of some bytes."""
    return hashlib.sha256(data).hexdigest()


class PartStore:
    """One Parquet part per input window in a checkpoint directory (OUTPUT.parts/), listed in a manifest."""

    def __init__(self, directory: Location) -> None:
        self.dir = directory
        self._manifest: dict = {"fingerprint": None, "parts": {}}

    def exists(self) -> bool:
        """True when a previous run left parts (or a manifest) here."""
        return bool(self.dir.list_names())

    def load(self) -> str | None:
        """Read the manifest of an earlier run; its fingerprint, or None when there is no valid manifest."""
        try:
            manifest = json.loads(self.dir.child(MANIFEST).read_bytes() or b"")
        except ValueError:
            return None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), dict):
            return None
        self._manifest = manifest
        return manifest.get("fingerprint")

    def record(self) -> dict | None:
        """What the earlier run's fingerprint digests (to name a difference), when its manifest holds it."""
        return self._manifest.get("record")

    def start(self, fingerprint: str, keep: bool, record: dict | None = None) -> None:
        """Begin this run's manifest: keep the earlier run's listed parts (resume) or start empty; InputError
        when they were checked with another input digest (io_formats/digest)."""
        digest, earlier = InputDigest.VERSION.decode(), self._manifest.get("input_digest")
        if keep and self._manifest["parts"] and earlier != digest:
            raise InputError(
                f"cannot --resume: the parts in {self.dir.uri!r} were checked with "
                f"{earlier or 'an older input digest'} (this score-batch: {digest}); pass --overwrite "
                "(without --resume) to start over"
            )
        for name in self.dir.list_names():
            if name.startswith(".") and ".tmp-" in name:  # a part cut off while written
                self.dir.child(name).delete()
        self.dir.make_dirs()
        parts = self._manifest["parts"] if keep else {}
        self._manifest = dict(fingerprint=fingerprint, record=record, input_digest=digest, parts=parts)
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
        if data is None or sha256(data) != entry.get("sha256"):
            log.warning(
                "checkpointed part %s is missing or damaged; scoring its window again", self.part(window)
            )
            del self._manifest["parts"][str(window)]
            return False
        return True

    def write(self, window: int, table: pa.Table, input_hash: str) -> None:
        """Write window k's results: a staging file, listed in the manifest with its checksum, then published (a
        kill leaves an unlisted staging file, removed next run, or a listed part missing or whole)."""
        part = self.part(window)
        tmp = part.staging_file()
        try:
            pq.write_table(table, tmp, use_dictionary=dictionary_columns(table.schema))
            self._manifest["parts"][str(window)] = {
                "sha256": sha256(tmp.read_bytes()),
                "input_sha256": input_hash,
            }
            self._save()
            part.publish_file(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def read(self, window: int) -> pa.Table:
        """Window k's results."""
        return pq.read_table(pa.BufferReader(self.part(window).read_bytes()))

    def windows(self) -> list[int]:
        """Listed window numbers in order."""
        return sorted(int(window) for window in self._manifest["parts"])

    def clear(self) -> None:
        """Delete every part and the manifest."""
        self.dir.delete_tree()
        self._manifest = {"fingerprint": None, "parts": {}}

    def _save(self) -> None:
        """Replace the manifest in one step."""
        self.dir.child(MANIFEST).write_bytes(json.dumps(self._manifest).encode())
