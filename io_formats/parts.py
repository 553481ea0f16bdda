"""Checkpointed result parts beside the destination: what makes a killed run resumable."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from io_formats.writers import durable_replace, exclusive_temp

MANIFEST = "manifest.json"


class PartStore:
    """One Parquet part per input window in `<destination>.parts/`, each written atomically."""

    def __init__(self, destination: str | Path) -> None:
        destination = Path(destination)
        self.dir = destination.with_name(destination.name + ".parts")

    def exists(self) -> bool:
        """True when a previous run left parts here."""
        return self.dir.exists()

    def fingerprint(self) -> str | None:
        """The fingerprint the parts were written under, or None."""
        manifest = self.dir / MANIFEST
        if not manifest.is_file():
            return None
        return json.loads(manifest.read_text()).get("fingerprint")

    def start(self, fingerprint: str) -> None:
        """Create the directory and record the run's fingerprint."""
        self.dir.mkdir(parents=True, exist_ok=True)
        manifest = self.dir / MANIFEST
        tmp = exclusive_temp(manifest)
        tmp.write_text(json.dumps({"fingerprint": fingerprint}))
        durable_replace(tmp, manifest)

    def part_path(self, window: int) -> Path:
        """Where window k's part lives."""
        return self.dir / f"part-{window:08d}.parquet"

    def has(self, window: int) -> bool:
        """True when window k was completed by an earlier run."""
        return self.part_path(window).is_file()

    def write(self, window: int, table: pa.Table) -> None:
        """Write window k's results: a temporary file, fsync'ed, then renamed."""
        path = self.part_path(window)
        tmp = exclusive_temp(path)
        pq.write_table(table, tmp)
        durable_replace(tmp, path)

    def read(self, window: int) -> pa.Table:
        """Window k's results."""
        return pq.read_table(self.part_path(window))

    def windows(self) -> Iterator[int]:
        """Completed window numbers in order."""
        for path in sorted(self.dir.glob("part-*.parquet")):
            yield int(path.stem.split("-")[1])

    def clear(self) -> None:
        """Delete every part and the manifest."""
        shutil.rmtree(self.dir, ignore_errors=True)
