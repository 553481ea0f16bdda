"""Writing to object stores, which have no rename: one-step publishing, conditional create, leftovers.

- A finished local file is published in one step: readers see either the old object or the whole new
  one, never a partial upload, even when the upload itself is cut off. On S3 with boto3 it is one managed
  upload to the key itself (a multipart upload above 8 MB, which S3 makes visible only when it completes;
  any size up to S3's 5 TB); elsewhere, or without boto3, it is uploaded under a hidden temporary key
  beside the destination (`.NAME.tmp-…`) and copied server-side onto it (GCS rewrite; S3 CopyObject,
  which copies at most 5 GB).
- `create_exclusive` writes an object only if none exists: on S3 with boto3's `put_object(IfNoneMatch="*")`
  (a conditional write every current S3 API honours); elsewhere, or without boto3, it checks then
  writes, which holds only under a single-writer rule (documented in the README).
- A finished local directory (a partitioned output) is uploaded under a hidden temporary prefix beside
  the destination, moved into place object by object (server-side copies), and committed by writing
  `_SUCCESS` last, as Hadoop/Spark committers do: a reader that waits for the marker sees the whole
  dataset; one that lists the prefix earlier may see part of it. An old dataset being replaced loses
  its marker first.
- The next run on an output removes the hidden temporary keys and prefixes an interrupted run left
  beside it.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs

from score_batch.io_formats.locations import S3, Location, s3_client_kwargs
from score_batch.io_formats.writers import SUCCESS

log = logging.getLogger(__name__)
CHUNK = 8 << 20


def temp_sibling(destination: Location) -> Location:
    """A hidden, randomly named key beside destination."""
    parent = destination.parent()
    return parent.child(f".{destination.name}.tmp-{secrets.token_hex(8)}")


def upload(local: Path, destination: Location, options: tuple[tuple[str, str], ...] = ()) -> None:
    """Publish a finished local file at destination in one step (see the module docstring)."""
    client = None
    if destination.scheme == S3:
        client = _s3_client(options, "S3 outputs are copied into place (at most 5 GB)")
    if client is not None:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, key = destination.path.partition("/")
        try:
            client.upload_file(str(local), bucket, key)  # s3transfer aborts a multipart upload that fails
        except (S3UploadFailedError, BotoCoreError, ClientError) as error:
            raise OSError(f"{destination.uri}: the upload failed: {error}") from None
        return
    tmp = temp_sibling(destination)
    try:
        with open(local, "rb") as source, tmp.fs.open_output_stream(tmp.path, compression=None) as out:
            shutil.copyfileobj(source, out, CHUNK)
        tmp.fs.move(tmp.path, destination.path)
    except BaseException:
        delete(tmp)
        raise


def upload_directory(local: Path, destination: Location, check: Callable[[], None] = lambda: None) -> None:
    """Publish a finished local directory at destination: staged under a hidden prefix, `_SUCCESS` last.

    Replaces an existing dataset there (the caller checked --overwrite): its `_SUCCESS` goes first. check()
    runs before each file's upload and may raise to stop (the staged objects are deleted, nothing replaced).
    """
    files = sorted(
        path.relative_to(local).as_posix()
        for path in local.rglob("*")
        if path.is_file() and path.relative_to(local).as_posix() != SUCCESS
    )
    staging = temp_sibling(destination)
    try:
        for name in files:
            check()
            target = staging.child(name)
            with (
                open(local / name, "rb") as source,
                target.fs.open_output_stream(target.path, compression=None) as out,
            ):
                shutil.copyfileobj(source, out, CHUNK)
        check()
        _replace(staging, destination, files)
    finally:
        delete_dir(staging)


def move_into_place(staging: Location, destination: Location) -> None:
    """Objects written under a staging prefix moved under destination (server-side copies), replacing an old
    dataset there (--overwrite, already checked) as _replace does: `_SUCCESS` removed first, written last."""
    base = staging.path.rstrip("/")
    selector = pafs.FileSelector(base, recursive=True)
    names = sorted(
        info.path[len(base) :].lstrip("/")
        for info in staging.fs.get_file_info(selector)
        if info.type == pafs.FileType.File and not info.path.endswith("/")
    )
    _replace(staging, destination, [name for name in names if name != SUCCESS])


def _replace(staging: Location, destination: Location, names: list[str]) -> None:
    """The staged objects moved under destination, replacing what was there; `_SUCCESS` removed first
    (readers that wait for the marker stop trusting the old data) and written last."""
    delete(destination.child(SUCCESS))
    delete_dir(destination)
    for name in names:
        staging.fs.move(staging.child(name).path, destination.child(name).path)
    write_object(destination.child(SUCCESS), b"")


def write_object(location: Location, data: bytes) -> None:
    """Write one object in a single request (replacing any object of that name)."""
    with location.fs.open_output_stream(location.path, compression=None) as out:
        out.write(data)


def delete(location: Location) -> None:
    """Delete an object (already gone is fine)."""
    with contextlib.suppress(FileNotFoundError):
        location.fs.delete_file(location.path)


def delete_dir(location: Location) -> None:
    """Delete a directory prefix and everything under it (already gone is fine)."""
    with contextlib.suppress(FileNotFoundError):
        location.fs.delete_dir(location.path)


def create_exclusive(location: Location, data: bytes, options: tuple[tuple[str, str], ...]) -> bool:
    """Create the object only if it does not exist; False when it does. See the module docstring."""
    if location.scheme == S3:
        client = _s3_client(options, "the S3 output lock is check-then-write (single-writer rule)")
        if client is not None:
            from botocore.exceptions import ClientError

            bucket, _, key = location.path.partition("/")
            try:
                client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code", "")
                if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                    return False
                raise OSError(f"{location.uri}: AWS Error {code}: {error}") from None
            return True
    if location.exists():
        return False
    write_object(location, data)  # single-writer rule: no conditional create on this store
    return True


def _s3_client(options: tuple[tuple[str, str], ...], without: str):
    """A boto3 S3 client with the same endpoint and region (credentials: boto3's standard chain), or None
    (logged with `without`: what a run does without boto3)."""
    try:
        import boto3
    except ImportError:
        log.warning("boto3 is not installed: %s", without)
        return None
    return boto3.client("s3", **s3_client_kwargs(options))  # the endpoint resolved as for the data path
