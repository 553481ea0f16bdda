"""INPUT/OUTPUT strings → locations: a pyarrow filesystem and a path on it, with a name safe to log.

Schemes: a local path or `file://` (LocalFileSystem), `s3://` (pyarrow's S3FileSystem), `gs://` /
`gcs://` (pyarrow's GcsFileSystem), `https://` / `http://` (read-only, fsspec's HTTPFileSystem through
PyFileSystem when fsspec is installed) and `hf://datasets/ORG/NAME[@REV]/PATH` (a dataset already in the
local Hugging Face cache; nothing is downloaded). Credentials come from each filesystem's standard
chain (environment, profile files, instance metadata), never from a URI or --storage-option, so no
message or report can contain one; `--storage-option key=value` passes endpoint and region settings.
"""

from __future__ import annotations

import os
import posixpath
import re
import urllib.parse
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from score_batch.io_formats.errors import InputError

LOCAL, S3, GCS, HTTP, HF = "file", "s3", "gs", "https", "hf"
_SCHEMES = {"file": LOCAL, "s3": S3, "s3a": S3, "gs": GCS, "gcs": GCS, "https": HTTP, "http": HTTP, "hf": HF}
_SECRET_OPTIONS = ("access_key", "secret_key", "session_token", "access_token", "credentials", "password")
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class Location:
    """One path on one filesystem; `uri` is how messages name it (never holds a query string or secret)."""

    fs: pafs.FileSystem = field(compare=False, repr=False)
    path: str  # the filesystem's own path: absolute local path, bucket/key, or a URL for https
    uri: str
    scheme: str

    @property
    def local(self) -> bool:
        """True when the path is on this machine (a local path, file:// or the HF cache)."""
        return self.scheme in (LOCAL, HF)

    @property
    def name(self) -> str:
        """The last path segment (a URL's without its query: a presigned URL is named by its path)."""
        path = urllib.parse.urlsplit(self.path).path if self.scheme == HTTP else self.path
        return posixpath.basename(path.rstrip("/"))

    def sibling(self, suffix: str) -> Location:
        """OUTPUT + suffix on the same filesystem (OUTPUT.parts, OUTPUT.lock, OUTPUT.errors.jsonl)."""
        return Location(self.fs, self.path + suffix, self.uri + suffix, self.scheme)

    def child(self, name: str) -> Location:
        """A name inside this directory."""
        return Location(
            self.fs, f"{self.path.rstrip('/')}/{name}", f"{self.uri.rstrip('/')}/{name}", self.scheme
        )

    def parent(self) -> Location:
        parent_path = posixpath.dirname(self.path.rstrip("/"))
        parent_uri = self.uri.rstrip("/").rsplit("/", 1)[0]
        return Location(self.fs, parent_path, parent_uri, self.scheme)

    def info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def key(self) -> str:
        """A normalized URI for comparing locations (local paths with `..` and symlinks resolved)."""
        if self.local:
            return "file://" + os.path.realpath(os.path.abspath(self.path))
        path = posixpath.normpath("/" + self.path.split("?", 1)[0]).lstrip("/")
        return f"{self.scheme}://{path}"

    def __str__(self) -> str:
        return self.uri


def is_uri(text: str) -> bool:
    """True when text names a scheme (s3://, file://, …) rather than a local path."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) is not None


def has_glob(text: str) -> bool:
    return _GLOB.search(text) is not None


def parse_location(text: str, options: tuple[tuple[str, str], ...] = (), write: bool = False) -> Location:
    """An INPUT or OUTPUT string as a Location; InputError for an unknown scheme or a refused option."""
    if not is_uri(text):
        return Location(pafs.LocalFileSystem(), os.path.abspath(text), text, LOCAL)
    split = urllib.parse.urlsplit(text)
    scheme = _SCHEMES.get(split.scheme.lower())
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
        path = urllib.parse.unquote(split.path)
        return Location(pafs.LocalFileSystem(), os.path.abspath(path), text, LOCAL)
    if write and scheme in (HTTP, HF):
        raise InputError(f"{shown!r}: {split.scheme}:// is read-only; write to a local path, s3:// or gs://")
    if scheme == HF:
        return _hf_location(text, split)
    if scheme == HTTP:
        return Location(_http_filesystem(), urllib.parse.urlunsplit(split), shown, HTTP)
    if not split.netloc:
        raise InputError(f"{shown!r}: name a bucket ({split.scheme}://BUCKET/PATH)")
    path = object_key(split.netloc + urllib.parse.unquote(split.path))
    return Location(filesystem(scheme, options), path, shown, scheme)


def object_key(path: str) -> str:
    """bucket/key with the spellings of one object folded: `//`, `./`, `..` and a trailing `/`."""
    return posixpath.normpath("/" + path).lstrip("/")


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


def _http_filesystem() -> pafs.FileSystem:
    """fsspec's HTTPFileSystem behind pyarrow's PyFileSystem (read-only)."""
    try:
        import fsspec
    except ImportError:
        raise InputError("https:// inputs need fsspec (pip install 'score-batch[cloud]')") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("https")))


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
