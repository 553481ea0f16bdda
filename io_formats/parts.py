"""Checkpointed result parts beside the destination: what makes a killed run resumable.

The manifest is the only record of finished work: a part counts only when the manifest lists it with
the checksum of its file and the hash of the input window it was scored from. Anything else in the
directory (a part written just before a kill, a truncated file, a stray file) is never merged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from score_batch.io_formats import remote
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.locations import Location
from score_batch.io_formats.writers import durable_replace, exclusive_temp

MANIFEST = "manifest.json"
log = logging.getLogger(__name__)


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class PartStore:
    """One Parquet part per input window in `<destination>.parts/`, listed in a manifest once durable."""

    def __init__(self, destination: str | Path) -> None:
        destination = Path(destination)
        self.dir = destination.with_name(destination.name + ".parts")
        self._manifest: dict = {"fingerprint": None, "parts": {}}

    def exists(self) -> bool:
        """True when a previous run left parts here."""
        return self.dir.exists()

    def _manifest_text(self) -> str:
        return (self.dir / MANIFEST).read_text()

    def load(self) -> str | None:
        """Read the manifest of an earlier run; its fingerprint, or None when there is no valid manifest."""
        try:
            manifest = json.loads(self._manifest_text())
        except (OSError, ValueError):
            return None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), dict):
            return None
        self._manifest = manifest
        return manifest.get("fingerprint")

    def start(self, fingerprint: str, keep: bool) -> None:
        """Begin this run's manifest: keep the earlier run's listed parts (resume) or start empty."""
        if self.dir.exists():
            for leftover in self.dir.glob(".*.tmp-*"):
                leftover.unlink(missing_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        parts = self._manifest["parts"] if keep else {}
        self._manifest = {"fingerprint": fingerprint, "parts": parts}
        self._save()

    def part_path(self, window: int) -> Path:
        """Where window k's part lives."""
        return self.dir / f"part-{window:08d}.parquet"

    def verified(self, window: int, input_hash: str) -> bool:
        """True when window k's part is listed, its file is intact, and it was scored from this same input.

        Raises InputError when the part was scored from different input (the input changed since).
        """
        entry = self._manifest["parts"].get(str(window))
        if entry is None:
            return False
        if entry.get("input_sha256") != input_hash:
            raise InputError(
                f"cannot --resume: the input changed since the checkpointed parts in {str(self.dir)!r} were "
                f"written (window {window} differs); pass --overwrite (without --resume) to start over"
            )
        path = self.part_path(window)
        if self._part_sha256(window) != entry.get("sha256"):
            log.warning("checkpointed part %s is missing or damaged; scoring its window again", path)
            del self._manifest["parts"][str(window)]
            return False
        return True

    def _part_sha256(self, window: int) -> str | None:
        """The checksum of window k's part file, or None when it is missing."""
        path = self.part_path(window)
        return file_sha256(path) if path.is_file() else None

    def write(self, window: int, table: pa.Table, input_hash: str) -> None:
        """Write window k's results: temporary file, listed in the manifest with its checksum, then renamed.

        Listing before the rename means a kill at any point leaves either an unlisted temporary file
        (removed by the next run) or a listed part whose file is missing or whole (checked on resume).
        """
        path = self.part_path(window)
        tmp = exclusive_temp(path)
        try:
            pq.write_table(table, tmp)
            self._manifest["parts"][str(window)] = {"sha256": file_sha256(tmp), "input_sha256": input_hash}
            self._save()
            durable_replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def read(self, window: int) -> pa.Table:
        """Window k's results."""
        return pq.read_table(self.part_path(window))

    def windows(self) -> list[int]:
        """Listed window numbers in order."""
        return sorted(int(window) for window in self._manifest["parts"])

    def clear(self) -> None:
        """Delete every part and the manifest."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self._manifest = {"fingerprint": None, "parts": {}}

    def _save(self) -> None:
        """Replace the manifest atomically."""
        manifest = self.dir / MANIFEST
        tmp = exclusive_temp(manifest)
        tmp.write_text(json.dumps(self._manifest))
        durable_replace(tmp, manifest)


class RemotePartStore(PartStore):
    """PartStore on an object store: `<destination>.parts/` as a key prefix, objects written in one request.

    No rename exists there, so a part is written whole at its own key first and listed in the manifest
    (one object, replaced in one request) after: a kill in between leaves an unlisted part that the
    next run overwrites. Checksums guard against anything else.
    """

    def __init__(self, destination: Location) -> None:
        self.location = destination.sibling(".parts")
        self.dir = self.location.uri
        self._manifest = {"fingerprint": None, "parts": {}}

    def exists(self) -> bool:
        return bool(remote.list_names(self.location))

    def _manifest_text(self) -> str:
        data = remote.read_object(self.location.child(MANIFEST))
        if data is None:
            raise OSError("no manifest")
        return data.decode("utf-8")

    def start(self, fingerprint: str, keep: bool) -> None:
        parts = self._manifest["parts"] if keep else {}
        self._manifest = {"fingerprint": fingerprint, "parts": parts}
        self._save()

    def part_path(self, window: int) -> str:
        return f"{self.dir}/part-{window:08d}.parquet"

    def _part(self, window: int) -> Location:
        return self.location.child(f"part-{window:08d}.parquet")

    def _part_sha256(self, window: int) -> str | None:
        data = remote.read_object(self._part(window))
        return None if data is None else hashlib.sha256(data).hexdigest()

    def write(self, window: int, table: pa.Table, input_hash: str) -> None:
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer)
        data = buffer.getvalue().to_pybytes()
        remote.write_object(self._part(window), data)
        self._manifest["parts"][str(window)] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "input_sha256": input_hash,
        }
        self._save()

    def read(self, window: int) -> pa.Table:
        return pq.read_table(pa.BufferReader(remote.read_object(self._part(window))))

    def clear(self) -> None:
        remote.delete_dir(self.location)
        self._manifest = {"fingerprint": None, "parts": {}}

    def _save(self) -> None:
        remote.write_object(self.location.child(MANIFEST), json.dumps(self._manifest).encode())
