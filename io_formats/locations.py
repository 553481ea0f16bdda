"""INPUT/OUTPUT strings → Location: one file or directory on one filesystem, local or an object store, with a
name safe to log and the same operations on every store.

Schemes: a local path or `file://` (LocalFileSystem), `s3://` (pyarrow's S3FileSystem), `gs://` /
`gcs://` (pyarrow's GcsFileSystem), `https://` / `http://` (read-only, fsspec's HTTPFileSystem through
PyFileSystem when fsspec is installed) and `hf://datasets/ORG/NAME[@REV]/PATH` (a dataset already in the
local Hugging Face cache; nothing is downloaded); their filesystems, settings and credentials: remote.py.

Each operation keeps its guarantee on every store, each in its own way (object stores have no rename):

| operation | local path | object store (s3://, gs://) |
|---|---|---|
| write_bytes: readers see old or new | exclusive temp file, fsync, rename | one PUT |
| publish_file: a finished local file | durable rename | S3 with boto3: one upload, multipart above 8 MB (S3 shows it only once complete, up to 5 TB); else a hidden key copied server-side (GCS rewrite; S3 CopyObject: at most 5 GB) |
| create_exclusive: the lock | O_CREAT / O_EXCL | S3 with boto3: put_object(IfNoneMatch="*"); else check, then write (the single-writer rule, README) |
| publish_directory: a partitioned output | renames, fsync | a hidden prefix moved into place object by object, `_SUCCESS` removed first and written last, as Hadoop/Spark committers do |
| temp_sibling, remove_leftovers | `.NAME.tmp-…` created exclusively | `.NAME.tmp-…` random keys and prefixes |
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import re
import secrets
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from score_batch.io_formats import remote
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.remote import HF, HTTP, LOCAL, S3, SCHEMES, filesystem, http_filesystem
from score_batch.io_formats.writers import (
    SUCCESS,
    AtomicTableWriter,
    durable_replace,
    exclusive_temp,
    fsync_path,
    local_temp_file,
)

_GLOB = re.compile(r"[*?\[]")
CHUNK = 8 << 20  # bytes copied at a time into an object


@dataclass(frozen=True)
class Location:
    """One file or directory (an object or key prefix) on one filesystem; `uri` is how messages name it (never
    holds a query string or secret); `options`: its store's --storage-option settings."""

    fs: pafs.FileSystem = field(compare=False, repr=False)
    path: str  # the filesystem's own path: absolute local path, bucket/key, or a URL for https
    uri: str
    scheme: str
    options: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def on_disk(cls, path: str | Path, uri: str | None = None) -> Location:
        """A path on this machine as written (no scheme read from it); uri: how messages name it."""
        return cls(pafs.LocalFileSystem(), os.path.abspath(path), str(path) if uri is None else uri, LOCAL)

    @property
    def local(self) -> bool:
        """True when the path is on this machine (a local path, file:// or the HF cache)."""
        return self.scheme in (LOCAL, HF)

    @property
    def publishes_in_steps(self) -> bool:
        """A directory appears file by file (object stores): a cut-off publish can remain."""
        return not self.local

    @property
    def name(self) -> str:
        """The last path segment (a URL's without its query: a presigned URL is named by its path)."""
        path = urllib.parse.urlsplit(self.path).path if self.scheme == HTTP else self.path
        return posixpath.basename(path.rstrip("/"))

    def _at(self, path: str, uri: str) -> Location:
        return dataclasses.replace(self, path=path, uri=uri)

    def sibling(self, suffix: str) -> Location:
        """NAME + suffix beside this one (OUTPUT.parts, OUTPUT.lock, OUTPUT.errors.jsonl)."""
        return self._at(self.path.rstrip("/") + suffix, self.uri.rstrip("/") + suffix)

    def child(self, name: str) -> Location:
        """A name inside this directory."""
        return self._at(f"{self.path.rstrip('/')}/{name}", f"{self.uri.rstrip('/')}/{name}")

    @property
    def parent(self) -> Location:
        """The directory holding this one."""
        uri = str(Path(self.uri).parent) if self.local else self.uri.rstrip("/").rsplit("/", 1)[0]
        return self._at(posixpath.dirname(self.path.rstrip("/")), uri)

    def key(self) -> str:
        """A normalized URI: two spellings of one file compare equal (local: `..` and symlinks resolved)."""
        if self.local:
            return "file://" + os.path.realpath(os.path.abspath(self.path))
        path = posixpath.normpath("/" + self.path.split("?", 1)[0]).lstrip("/")
        return f"{self.scheme}://{path}"

    def info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self.info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def age_seconds(self) -> float | None:
        """Seconds since it was last written; None where the store does not say it reliably."""
        try:
            return time.time() - os.stat(self.path).st_mtime if self.local else None
        except OSError:
            return None

    def missing_container(self) -> str | None:
        """Why an object cannot be created where it is (no key, no bucket), else None (local: job.preflight.paths checks)."""
        if self.local:
            return None
        bucket = self.path.split("/", 1)[0]
        if "/" not in self.path.strip("/"):
            return f"output {self.uri!r}: give a path inside the bucket ({self.scheme}://BUCKET/KEY)"
        if self.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            return f"output bucket {bucket!r} of {self.uri!r} does not exist"
        return None

    def list_names(self) -> list[str]:
        """Names of the files directly in this directory (none when it does not exist)."""
        return [info.base_name for info in self._listing() if info.type == pafs.FileType.File]

    def list_directories(self) -> list[str]:
        """Names of the directories directly in this directory."""
        return [info.base_name for info in self._listing() if info.type == pafs.FileType.Directory]

    def _listing(self) -> list[pafs.FileInfo]:
        """The entries directly in this directory whose names are UTF-8 (those score-batch writes: another's,
        a Latin-1 file name beside an output, pyarrow cannot decode)."""
        try:
            listed = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [info for info in listed if _decodable(info)]

    def read_bytes(self) -> bytes | None:
        """Its bytes, or None when it does not exist."""
        try:
            if self.local:
                return Path(self.path).read_bytes()
            with self.fs.open_input_stream(self.path, compression=None) as stream:
                return stream.read()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def write_bytes(self, data: bytes) -> None:
        """Replace it with data in one step: readers see the old bytes or the new, never a part."""
        if not self.local:
            with self.fs.open_output_stream(self.path, compression=None) as out:
                out.write(data)
            return
        tmp = exclusive_temp(Path(self.path))
        try:
            tmp.write_bytes(data)
            durable_replace(tmp, Path(self.path))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def create_exclusive(self, data: bytes) -> bool:
        """Create it holding data only if it does not exist; False when it does."""
        if self.local:
            try:
                handle = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
            except BaseException:  # a half-written file would stand for a whole one
                self.delete()
                raise
            return True
        client = self._s3_client("the S3 output lock is check-then-write (single-writer rule)")
        if client is not None:
            from botocore.exceptions import ClientError

            bucket, _, key = self.path.partition("/")
            try:
                client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code", "")
                if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                    return False
                raise OSError(f"{self.uri}: AWS Error {code}: {error}") from None
            return True
        if self.exists():
            return False
        self.write_bytes(data)  # single-writer rule: no conditional create on this store
        return True

    def delete(self) -> None:
        """Delete the file (already gone is fine)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.path)

    def delete_tree(self) -> None:
        """Delete the directory and everything under it (already gone is fine)."""
        if self.local:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self.path)

    def make_dirs(self) -> None:
        """Make this directory exist (an object store's key prefix exists once an object is under it)."""
        if self.local:
            Path(self.path).mkdir(parents=True, exist_ok=True)

    def temp_sibling(self, directory: bool = False) -> Location:
        """A hidden, randomly named `.NAME.tmp-…` beside this one (locally created exclusively)."""
        if self.local:
            return Location.on_disk(exclusive_temp(Path(self.path), directory=directory))
        return self.parent.child(f".{self.name}.tmp-{secrets.token_hex(8)}")

    def remove_leftovers(self) -> list[str]:
        """Delete the `.NAME.tmp-…` files and directories an interrupted run left beside it; their names."""
        prefix = f".{self.name}.tmp-"
        parent = self.parent
        removed = []
        for info in parent._listing():
            if info.base_name.startswith(prefix):
                leftover = parent.child(info.base_name)
                (leftover.delete_tree if info.type == pafs.FileType.Directory else leftover.delete)()
                removed.append(leftover.uri)
        return removed

    def staging_file(self) -> Path:
        """A new local file to write this one's bytes into, then publish_file() it: beside it (published by a
        rename on the same file system), or for an object store in TMPDIR (which needs room for one output)."""
        return exclusive_temp(Path(self.path)) if self.local else local_temp_file()

    def staging_directory(self) -> Path:
        """A new local directory to write this (directory) one into, then publish_directory() it."""
        if self.local:
            return exclusive_temp(Path(self.path), directory=True)
        return Path(tempfile.mkdtemp(prefix="score-batch-output-"))

    def atomic_writer(self, schema: pa.Schema, fmt: str) -> AtomicTableWriter:
        """A Parquet or JSONL writer whose commit() publishes the whole file here in one step."""
        return AtomicTableWriter(self.staging_file(), schema, fmt, self.path, self.publish_file)

    def publish_file(self, local: Path) -> None:
        """Make a finished local file this one in one step (the local file is consumed)."""
        if self.local:
            durable_replace(local, Path(self.path))
            return
        try:
            client = self._s3_client("S3 outputs are copied into place (at most 5 GB)")
            if client is None:
                self._copy_into_place(local)
                return
            from boto3.exceptions import S3UploadFailedError
            from botocore.exceptions import BotoCoreError, ClientError

            bucket, _, key = self.path.partition("/")
            try:
                client.upload_file(str(local), bucket, key)  # s3transfer aborts a multipart upload that fails
            except (S3UploadFailedError, BotoCoreError, ClientError) as error:
                raise OSError(f"{self.uri}: the upload failed: {error}") from None
        finally:
            local.unlink(missing_ok=True)

    def _copy_into_place(self, local: Path) -> None:
        """Upload under a hidden key beside this object, then copy it here server-side."""
        tmp = self.temp_sibling()
        try:
            tmp._upload(local)
            tmp.fs.move(tmp.path, self.path)
        except BaseException:
            tmp.delete()
            raise

    def _upload(self, local: Path) -> None:
        with open(local, "rb") as source, self.fs.open_output_stream(self.path, compression=None) as out:
            shutil.copyfileobj(source, out, CHUNK)

    def _s3_client(self, without: str):
        """The boto3 client of this object's S3 store; None elsewhere, or without boto3 (logged: `without`)."""
        return remote.s3_client(self.options, without) if self.scheme == S3 else None

    def publish_directory(self, local: Path, check: Callable[[], None] = lambda: None) -> None:
        """Make a finished local directory this one (replacing an old one): `_SUCCESS` marks it complete. On an
        object store check() runs before each file's upload and may raise to stop (nothing replaced yet)."""
        if not self.local:
            files = Location.on_disk(local)._files_below()
            staging = self.temp_sibling()
            try:
                for name in files:
                    check()
                    staging.child(name)._upload(local / name)
                check()
                self._replace(staging, files)
            finally:
                staging.delete_tree()
            return
        (local / SUCCESS).touch()
        path = Path(self.path)
        if path.exists():
            old = exclusive_temp(path, directory=True)
            os.rmdir(old)
            path.rename(old)
            local.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            local.rename(path)
        fsync_path(path.parent)

    def replace_with(self, staging: Location) -> None:
        """Make a finished staging directory on the same store (temp_sibling) this one, `_SUCCESS` last."""
        if self.local:
            self.publish_directory(Path(staging.path))
            return
        self._replace(staging, staging._files_below())

    def _files_below(self) -> list[str]:
        """The files below this directory by their path relative to it, sorted; its `_SUCCESS` left out."""
        base = self.path.rstrip("/")
        names = sorted(
            info.path[len(base) :].lstrip("/")
            for info in self.fs.get_file_info(pafs.FileSelector(base, recursive=True))
            if info.type == pafs.FileType.File and not info.path.endswith("/")
        )
        return [name for name in names if name != SUCCESS]

    def _replace(self, staging: Location, names: list[str]) -> None:
        """The staged objects moved here (server-side copies), replacing what was there (--overwrite, already
        checked): `_SUCCESS` removed first (readers that wait for it stop trusting the old data), written last."""
        self.child(SUCCESS).delete()
        self.delete_tree()
        for name in names:
            staging.fs.move(staging.child(name).path, self.child(name).path)
        self.child(SUCCESS).write_bytes(b"")

    def __str__(self) -> str:
        return self.uri


def has_glob(text: str) -> bool:
    return _GLOB.search(text) is not None


def _decodable(info: pafs.FileInfo) -> bool:
    """Whether pyarrow can read a listed entry's name (it decodes names as UTF-8 when asked)."""
    try:
        return isinstance(info.path, str)
    except UnicodeDecodeError:
        return False


def parse_location(text: str, options: tuple[tuple[str, str], ...] = (), write: bool = False) -> Location:
    """An INPUT or OUTPUT (write: refused for a read-only scheme) as a Location; InputError when refused."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a name's bytes that are not UTF-8, as Python's argv holds them
            shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise InputError(
                f"'{shown}': the name is not valid UTF-8 (its bytes as \\x..); rename it"
            ) from None
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) is None:  # no scheme: a local path
        return Location.on_disk(text)
    split = urllib.parse.urlsplit(text)
    scheme = SCHEMES.get(split.scheme.lower())
    host = split.netloc.rpartition("@")[2]  # credentials are never shown (and are refused below)
    shown = urllib.parse.urlunsplit((split.scheme, host, split.path, "", "")) + ("?…" if split.query else "")
    if scheme is None:
        raise InputError(
            f"{shown!r}: unknown scheme {split.scheme!r}; use a local path, file://, s3://, gs://, https:// or hf://"
        )
    if split.username or split.password:
        raise InputError(
            f"{shown!r}: credentials in a URI are refused; they come from the filesystem's standard chain "
            "(environment variables, profile files, instance metadata)"
        )
    if scheme == LOCAL:
        return Location.on_disk(urllib.parse.unquote(split.path), text)
    if write and scheme in (HTTP, HF):
        raise InputError(f"{shown!r}: {split.scheme}:// is read-only; write to a local path, s3:// or gs://")
    if scheme == HF:
        return _hf_location(text, split)
    if scheme == HTTP:
        return Location(http_filesystem(), urllib.parse.urlunsplit(split), shown, HTTP)
    if not split.netloc:
        raise InputError(f"{shown!r}: name a bucket ({split.scheme}://BUCKET/PATH)")
    # bucket/key with the spellings of one object folded: `//`, `./`, `..` and a trailing `/`
    path = posixpath.normpath("/" + split.netloc + urllib.parse.unquote(split.path)).lstrip("/")
    return Location(filesystem(scheme, options), path, shown, scheme, options)


def split_inputs(arguments: list[str] | tuple[str, ...] | str) -> tuple[str, ...]:
    """INPUT arguments → inputs: an argument naming an existing local path is one input; otherwise a
    comma-separated argument lists several (`a.parquet,s3://b/c/`)."""
    if isinstance(arguments, str):
        arguments = [arguments]
    inputs: list[str] = []
    for argument in arguments:
        if "," in argument and not os.path.exists(argument):
            inputs.extend(part.strip() for part in argument.split(",") if part.strip())
        else:
            inputs.append(argument)
    return tuple(inputs)


def _hf_location(text: str, split: urllib.parse.SplitResult) -> Location:
    """hf://datasets/ORG/NAME[@REV]/PATH in the local Hugging Face cache (never downloads)."""
    parts = [split.netloc, *split.path.strip("/").split("/")]
    if len(parts) < 3 or parts[0] != "datasets":
        raise InputError(f"{text!r}: give hf://datasets/ORG/NAME[@REVISION]/PATH")
    name, _, revision = parts[2].partition("@")
    repo_id = f"{parts[1]}/{name}"
    try:
        from huggingface_hub import snapshot_download

        root = snapshot_download(
            repo_id, repo_type="dataset", revision=revision or None, local_files_only=True
        )
    except ImportError:
        raise InputError("hf:// inputs need huggingface_hub") from None
    except Exception as error:  # LocalEntryNotFoundError and friends: not in the cache
        raise InputError(
            f"{text!r}: dataset {repo_id} is not in the local Hugging Face cache (score-batch never downloads; "
            f"fetch it first with `hf download {repo_id} --repo-type dataset`): {type(error).__name__}"
        ) from None
    path = os.path.join(root, *parts[3:])
    return Location(pafs.LocalFileSystem(), path, text, HF)
