"""Where a run writes: one interface over the local file system and object stores.

A Target names one file or directory (an object or a key prefix). Both implementations give the same
guarantees, each in its own way:

| operation | LocalTarget | ObjectTarget (s3://, gs://) |
|---|---|---|
| write_bytes (readers see old or new) | exclusive temp file, fsync, rename | one PUT |
| publish_file (a finished local file) | durable rename | upload under a hidden key, server-side copy |
| create_exclusive (the lock) | O_CREAT / O_EXCL | conditional PUT (If-None-Match), see remote.py |
| temp_sibling | `.NAME.tmp-…` created exclusively | `.NAME.tmp-…` random key |
| remove_leftovers | `.NAME.tmp-*` beside it | the same keys and prefixes |
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from score_batch.io_formats import remote
from score_batch.io_formats.locations import Location, parse_location
from score_batch.io_formats.writers import (
    SUCCESS,
    AtomicTableWriter,
    durable_replace,
    exclusive_temp,
    fsync_directory,
    local_temp_file,
)


class Target(ABC):
    """One file or directory a run writes (or a key prefix on an object store)."""

    uri: str  # how messages name it (never holds a secret)
    # A directory appears file by file (object stores): a cut-off publish can remain.
    publishes_in_steps = False

    @abstractmethod
    def missing_container(self) -> str | None:
        """Why this target cannot be created where it is (its directory or bucket is missing), else None."""

    @property
    @abstractmethod
    def fs(self) -> pafs.FileSystem:
        """Its pyarrow filesystem (for writers that take one)."""

    @property
    @abstractmethod
    def path(self) -> str:
        """Its path on fs: an absolute local path, or bucket/key."""

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def local_path(self) -> Path | None:
        """The local path (None on an object store)."""
        return None

    @abstractmethod
    def key(self) -> str:
        """A normalized URI: two spellings of one file compare equal."""

    @abstractmethod
    def sibling(self, suffix: str) -> Target:
        """NAME + suffix beside this one (OUTPUT.parts, OUTPUT.lock, OUTPUT.errors.jsonl)."""

    @abstractmethod
    def child(self, name: str) -> Target:
        """A name inside this directory."""

    @property
    @abstractmethod
    def parent(self) -> Target:
        """The directory holding this one."""

    def info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self.info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def read_bytes(self) -> bytes | None:
        """Its bytes, or None when it does not exist."""
        try:
            with self.fs.open_input_stream(self.path, compression=None) as stream:
                return stream.read()
        except (FileNotFoundError, IsADirectoryError):
            return None

    @abstractmethod
    def write_bytes(self, data: bytes) -> None:
        """Replace it with data in one step: readers see the old bytes or the new, never a part."""

    @abstractmethod
    def publish_file(self, local: Path) -> None:
        """Make a finished local file this target in one step (the local file is consumed)."""

    @abstractmethod
    def create_exclusive(self, data: bytes) -> bool:
        """Create it holding data only if it does not exist; False when it does."""

    @abstractmethod
    def delete(self) -> None:
        """Delete the file (already gone is fine)."""

    @abstractmethod
    def delete_tree(self) -> None:
        """Delete the directory and everything under it (already gone is fine)."""

    def list_names(self) -> list[str]:
        """Names of the files directly in this directory (none when it does not exist)."""
        return [info.base_name for info in self._listing() if info.type == pafs.FileType.File]

    def list_directories(self) -> list[str]:
        """Names of the directories directly in this directory."""
        return [info.base_name for info in self._listing() if info.type == pafs.FileType.Directory]

    def _listing(self) -> list[pafs.FileInfo]:
        try:
            return self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError):
            return []

    @abstractmethod
    def temp_sibling(self, directory: bool = False) -> Target:
        """A hidden, randomly named `.NAME.tmp-…` beside this one (locally created exclusively)."""

    def age_seconds(self) -> float | None:
        """Seconds since it was last written; None where the store does not say it reliably."""
        return None

    @abstractmethod
    def make_dirs(self) -> None:
        """Make this directory exist (object stores have no directories: nothing to do)."""

    @abstractmethod
    def staging_file(self) -> Path:
        """A new local file to write this target's bytes into, then publish_file() it."""

    @abstractmethod
    def staging_directory(self) -> Path:
        """A new local directory to write this (directory) target into, then publish_directory() it."""

    @abstractmethod
    def publish_directory(self, local: Path, check: Callable[[], None] = lambda: None) -> None:
        """Make a finished local directory this target (replacing an old one): `_SUCCESS` marks it complete.
        check() may raise to stop while nothing is replaced yet (an object store's upload)."""

    @abstractmethod
    def replace_with(self, staging: Target) -> None:
        """Make a finished staging directory on the same store (temp_sibling) this target, `_SUCCESS` last."""

    def atomic_writer(self, schema: pa.Schema, fmt: str) -> AtomicTableWriter:
        """A Parquet or JSONL writer whose commit() publishes the whole file here in one step."""
        return AtomicTableWriter(self.uri, schema, fmt, publish=lambda tmp, _: self.publish_file(tmp))

    def remove_leftovers(self) -> list[str]:
        """Delete the `.NAME.tmp-…` files and directories an interrupted run left beside it; their names."""
        prefix = f".{self.name}.tmp-"
        parent = self.parent
        removed = []
        for info in parent._listing():
            if info.base_name.startswith(prefix):
                leftover = parent.child(info.base_name)
                if info.type == pafs.FileType.Directory:
                    leftover.delete_tree()
                else:
                    leftover.delete()
                removed.append(leftover.uri)
        return removed

    def __str__(self) -> str:
        return self.uri


class LocalTarget(Target):
    """A path on this machine."""

    def __init__(self, path: str | Path, uri: str | None = None) -> None:
        self._path = Path(os.path.abspath(path))
        self.uri = uri if uri is not None else str(path)

    @property
    def fs(self) -> pafs.FileSystem:
        return pafs.LocalFileSystem()

    @property
    def path(self) -> str:
        return str(self._path)

    @property
    def local_path(self) -> Path:
        return self._path

    def key(self) -> str:
        return "file://" + os.path.realpath(self._path)

    def missing_container(self) -> str | None:
        parent = Path(self.uri).parent if "://" not in self.uri else self._path.parent
        return None if self._path.parent.is_dir() else f"output directory {str(parent)!r} does not exist"

    def sibling(self, suffix: str) -> LocalTarget:
        return LocalTarget(self._path.with_name(self._path.name + suffix), self.uri.rstrip("/") + suffix)

    def child(self, name: str) -> LocalTarget:
        return LocalTarget(self._path / name, f"{self.uri.rstrip('/')}/{name}")

    @property
    def parent(self) -> LocalTarget:
        return LocalTarget(self._path.parent, str(Path(self.uri).parent))

    def __fspath__(self) -> str:
        return str(self._path)  # a local target is path-like: os and pathlib functions take it

    def read_bytes(self) -> bytes | None:
        try:
            return self._path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def write_bytes(self, data: bytes) -> None:
        tmp = exclusive_temp(self._path)
        try:
            tmp.write_bytes(data)
            durable_replace(tmp, self._path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def publish_file(self, local: Path) -> None:
        durable_replace(local, self._path)

    def create_exclusive(self, data: bytes) -> bool:
        try:
            handle = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
        except BaseException:  # a half-written file would stand for a whole one
            self._path.unlink(missing_ok=True)
            raise
        return True

    def delete(self) -> None:
        self._path.unlink(missing_ok=True)

    def delete_tree(self) -> None:
        shutil.rmtree(self._path, ignore_errors=True)

    def temp_sibling(self, directory: bool = False) -> LocalTarget:
        return LocalTarget(exclusive_temp(self._path, directory=directory))

    def age_seconds(self) -> float | None:
        try:
            return time.time() - self._path.stat().st_mtime
        except OSError:
            return None

    def make_dirs(self) -> None:
        self._path.mkdir(parents=True, exist_ok=True)

    def staging_file(self) -> Path:
        return exclusive_temp(self._path)  # beside it: published by a rename on the same file system

    def staging_directory(self) -> Path:
        return exclusive_temp(self._path, directory=True)

    def publish_directory(self, local: Path, check: Callable[[], None] = lambda: None) -> None:
        (local / SUCCESS).touch()
        if self._path.exists():
            old = exclusive_temp(self._path, directory=True)
            os.rmdir(old)
            self._path.rename(old)
            local.rename(self._path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            local.rename(self._path)
        fsync_directory(self._path.parent)

    def replace_with(self, staging: Target) -> None:
        self.publish_directory(Path(staging.path))

    def atomic_writer(self, schema: pa.Schema, fmt: str) -> AtomicTableWriter:
        return AtomicTableWriter(self._path, schema, fmt)


class ObjectTarget(Target):
    """An object or key prefix on an object store (s3://, gs://)."""

    def __init__(self, location: Location, options: tuple[tuple[str, str], ...] = ()) -> None:
        self.location = location
        self.options = options
        self.uri = location.uri

    @property
    def fs(self) -> pafs.FileSystem:
        return self.location.fs

    @property
    def path(self) -> str:
        return self.location.path

    publishes_in_steps = True

    def key(self) -> str:
        return self.location.key()

    def missing_container(self) -> str | None:
        bucket = self.path.split("/", 1)[0]
        if "/" not in self.path.strip("/"):
            return f"output {self.uri!r}: give a path inside the bucket ({self.location.scheme}://BUCKET/KEY)"
        if self.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            return f"output bucket {bucket!r} of {self.uri!r} does not exist"
        return None

    def _wrap(self, location: Location) -> ObjectTarget:
        return ObjectTarget(location, self.options)

    def sibling(self, suffix: str) -> ObjectTarget:
        return self._wrap(self.location.sibling(suffix))

    def child(self, name: str) -> ObjectTarget:
        return self._wrap(self.location.child(name))

    @property
    def parent(self) -> ObjectTarget:
        return self._wrap(self.location.parent())

    def write_bytes(self, data: bytes) -> None:
        remote.write_object(self.location, data)

    def publish_file(self, local: Path) -> None:
        try:
            remote.upload(local, self.location, self.options)
        finally:
            local.unlink(missing_ok=True)

    def create_exclusive(self, data: bytes) -> bool:
        return remote.create_exclusive(self.location, data, self.options)

    def delete(self) -> None:
        remote.delete(self.location)

    def delete_tree(self) -> None:
        remote.delete_dir(self.location)

    def temp_sibling(self, directory: bool = False) -> ObjectTarget:
        return self._wrap(remote.temp_sibling(self.location))

    def staging_file(self) -> Path:
        return local_temp_file()  # uploaded by publish_file (TMPDIR needs room for one output)

    def staging_directory(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="score-batch-output-"))

    def publish_directory(self, local: Path, check: Callable[[], None] = lambda: None) -> None:
        remote.upload_directory(local, self.location, check)

    def replace_with(self, staging: ObjectTarget) -> None:
        remote.move_into_place(staging.location, self.location)

    def make_dirs(self) -> None:
        pass  # a key prefix exists once an object is under it


def target(text: str, storage_options: tuple[tuple[str, str], ...] = ()) -> Target:
    """A written path or URI as a Target (InputError for a read-only scheme or an unknown one)."""
    location = parse_location(text, storage_options, write=True)
    if location.local:
        return LocalTarget(location.path, text)
    return ObjectTarget(location, storage_options)
