"""Object stores' filesystems and clients, set by --storage-option: pyarrow's S3FileSystem and GcsFileSystem,
fsspec's HTTPFileSystem (read-only) and the boto3 S3 client of the lock and the uploads.

Credentials come from each store's standard chain (environment, profile files, instance metadata), never from
a URI or --storage-option, so no message or report can contain one; `--storage-option key=value` passes
endpoint and region settings.
"""

from __future__ import annotations

import logging
import os
import re

import pyarrow.fs as pafs

from score_batch.io_formats.errors import InputError

log = logging.getLogger(__name__)
LOCAL, S3, GCS, HTTP, HF = "file", "s3", "gs", "https", "hf"
SCHEMES = {"file": LOCAL, "s3": S3, "s3a": S3, "gs": GCS, "gcs": GCS, "https": HTTP, "http": HTTP, "hf": HF}
_SECRET_OPTIONS = ("access_key", "secret_key", "session_token", "access_token", "credentials", "password")
_FILESYSTEMS: dict[tuple, pafs.FileSystem] = {}


def filesystem(scheme: str, options: tuple[tuple[str, str], ...] = ()) -> pafs.FileSystem:
    """The pyarrow filesystem of a scheme with --storage-option settings (one instance per settings)."""
    if scheme == S3:
        options = s3_options(options)
    cache_key = (scheme, tuple(sorted(options)))
    if cache_key in _FILESYSTEMS:
        return _FILESYSTEMS[cache_key]
    kwargs = storage_kwargs(options)
    try:
        if scheme == S3:
            fs = pafs.S3FileSystem(**kwargs)
        elif scheme == GCS:
            fs = pafs.GcsFileSystem(**kwargs)
        else:
            raise InputError(f"--storage-option does not apply to {scheme}://")
    except TypeError as error:
        raise InputError(f"--storage-option: {error} (see pyarrow.fs.S3FileSystem / GcsFileSystem)") from None
    except ImportError as error:
        raise InputError(f"{scheme}:// needs pyarrow built with it ({error})") from None
    _FILESYSTEMS[cache_key] = fs
    return fs


S3_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # as boto3 and the AWS CLI read them


def s3_options(options: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """--storage-option pairs for S3 with the endpoint resolved once, for every client (pyarrow's filesystem
    and the boto3 client of the lock): `endpoint_override` given wins, else AWS_ENDPOINT_URL_S3, else
    AWS_ENDPOINT_URL (pyarrow's S3FileSystem does not read these variables itself; boto3 does)."""
    if any(key == "endpoint_override" for key, _ in options):
        return options
    for name in S3_ENDPOINT_VARIABLES:
        value = os.environ.get(name, "").strip().rstrip("/")
        if value:
            return (*options, ("endpoint_override", value))
    return options


def s3_client_kwargs(options: tuple[tuple[str, str], ...]) -> dict:
    """boto3.client("s3", **kwargs) settings matching filesystem(S3, options): endpoint URL and region."""
    kwargs = storage_kwargs(s3_options(options))
    client: dict = {}
    if kwargs.get("endpoint_override"):
        client["endpoint_url"] = f"{kwargs.get('scheme', 'https')}://{kwargs['endpoint_override']}"
    if kwargs.get("region"):
        client["region_name"] = kwargs["region"]
    return client


def s3_client(options: tuple[tuple[str, str], ...], without: str):
    """A boto3 S3 client with the same endpoint and region, or None without boto3 (logged: `without`)."""
    try:
        import boto3
    except ImportError:
        log.warning("boto3 is not installed: %s", without)
        return None
    return boto3.client("s3", **s3_client_kwargs(options))  # the endpoint resolved as for the data path


def storage_kwargs(options: tuple[tuple[str, str], ...]) -> dict:
    """--storage-option key=value pairs as keyword arguments (true/false → bool, numbers → float)."""
    kwargs: dict = {}
    for key, value in options:
        if any(secret in key.lower() for secret in _SECRET_OPTIONS):
            raise InputError(
                f"--storage-option {key}: credentials are not passed as options; they come from the "
                "standard chain (AWS_ACCESS_KEY_ID / AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, …)"
            )
        if key == "endpoint_override" and "://" in value:
            scheme, _, value = value.partition("://")
            kwargs.setdefault("scheme", scheme)
        lowered = value.lower()
        if lowered in ("true", "false"):
            kwargs[key] = lowered == "true"
        elif re.fullmatch(r"\d+(\.\d+)?", value) and key not in ("region", "endpoint_override"):
            kwargs[key] = float(value)
        else:
            kwargs[key] = value
    return kwargs


def parse_storage_options(pairs: list[str] | tuple[str, ...] | None) -> tuple[tuple[str, str], ...]:
    """['key=value', …] → (('key', 'value'), …); InputError for a pair without '='."""
    parsed = []
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--storage-option {pair!r}: give key=value (e.g. endpoint_override=host:9000)")
        parsed.append((key.strip(), value.strip()))
    return tuple(parsed)


def http_filesystem() -> pafs.FileSystem:
    """fsspec's HTTPFileSystem behind pyarrow's PyFileSystem (read-only)."""
    try:
        import fsspec
    except ImportError:
        raise InputError("https:// inputs need fsspec (pip install 'score-batch[cloud]')") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("https")))
