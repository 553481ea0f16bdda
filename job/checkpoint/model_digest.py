"""A model's identity by content (model_identity): the SHA-256 of each file that decides a score, cached by
the file's (device, inode, size, mtime, ctime).

A model's identity is the content of its files, so a model rewritten in place with its size and modification
time restored (what `cp -p`, tar and reproducible deploys leave) is a new model. Hashing gigabytes on every
run would cost seconds, so each digest is kept in a small cache file; the inode change time (ctime) is in its
key because no copy or restore can set it back. The cache lives in `$SCORE_BATCH_CACHE_DIR`, else
`$XDG_CACHE_HOME/score-batch`, else `~/.cache/score-batch`: one JSON file per (device, inode), replaced
atomically, so concurrent runs never read half an entry; when it cannot be written (a read-only home) the
files are simply read again next time. Reading runs on a few threads and stops within one chunk when the
calling thread is interrupted (a SIGTERM while a run starts).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from score_batch.engine.errors import ScoringInputError
from score_batch.engine.model.source import weight_files

log = logging.getLogger(__name__)
CACHE_VARIABLE = "SCORE_BATCH_CACHE_DIR"
CHUNK_BYTES = 8 << 20
READ_THREADS = 4
_MEMO: dict[tuple[int, ...], str] = {}  # this process's digests by stat key


def cache_dir() -> Path:
    """Where digests are cached: $SCORE_BATCH_CACHE_DIR, else $XDG_CACHE_HOME/score-batch, else
    ~/.cache/score-batch (entries in its file-digests/ folder)."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "score-batch"


def file_digests(files: list[Path]) -> list[str]:
    """The SHA-256 (hex) of each file's content, read only when this process, or the cache, has no digest for
    the file's present (device, inode, size, mtime, ctime)."""
    keys = [_stat_key(os.stat(file)) for file in files]
    known = {key: _MEMO.get(key) or _cached(key) for key in keys}
    todo = [(file, key) for file, key in zip(files, keys) if known[key] is None]
    if todo:
        size = sum(key[2] for _, key in todo)
        if size > 1 << 30:
            log.info(
                "hashing %d model file(s), %.1f GB (once: cached in %s)", len(todo), size / 1e9, cache_dir()
            )
        for (file, key), digest in zip(todo, _read_all([file for file, _ in todo])):
            known[key] = digest
            if _stat_key(os.stat(file)) == key:  # unchanged while it was read: the digest is the file's
                _store(key, digest)
    for key in keys:
        _MEMO[key] = known[key]
    return [known[key] for key in keys]


def _stat_key(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _entry(key: tuple[int, ...]) -> Path:
    return cache_dir() / "file-digests" / f"{key[0]}-{key[1]}.json"


def _cached(key: tuple[int, ...]) -> str | None:
    """The cached digest of a file whose stat key is key; None when there is none (or another, or unreadable)."""
    try:
        entry = json.loads(_entry(key).read_text())
        if entry["stat"] == list(key) and isinstance(entry["sha256"], str):
            return entry["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _store(key: tuple[int, ...], digest: str) -> None:
    """Cache a digest (a temporary sibling renamed over the entry); a cache that cannot be written is skipped."""
    entry = _entry(key)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, temporary = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        try:
            with os.fdopen(handle, "w") as out:
                json.dump({"stat": list(key), "sha256": digest}, out)
            os.replace(temporary, entry)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as error:
        log.debug("model file digests are not cached in %s: %s", entry.parent, error)


def _read_all(files: list[Path]) -> list[str]:
    """Each file's SHA-256, read on a few threads; an exception in the caller (Stopped) stops them too."""
    stop = threading.Event()
    pool = ThreadPoolExecutor(min(READ_THREADS, len(files)), thread_name_prefix="score-batch-digest")
    try:
        futures = [pool.submit(_read, file, stop) for file in files]
        return [future.result() for future in futures]
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)


def _read(file: Path, stop: threading.Event) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            if stop.is_set():
                raise InterruptedError(f"reading {file} was stopped")
            digest.update(chunk)
    return digest.hexdigest()


# The files besides the weights that decide a score: configs, tokenizer files, chat templates, remote code.
MODEL_FILE_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja", ".py")


def model_identity(model_dir: Path) -> list:
    """[name, SHA-256 of its content] of every file of the model that decides a score: the weights
    transformers loads, and the configs, tokenizer files, chat templates and code beside them and in the
    folders of its sentence-transformers modules (read once, then cached by each file's inode and times:
    file_digests)."""
    model_dir = Path(model_dir)
    files = {file.relative_to(model_dir).as_posix(): file for file in _scoring_files(model_dir)}
    names = sorted(files)
    return [[name, digest] for name, digest in zip(names, file_digests([files[n] for n in names]))]


def _scoring_files(model_dir: Path) -> list[Path]:
    """The model's weight files (none when it has none: loading says why) and the other files that decide a
    score, at its top level and in the folders its modules.json names."""
    try:
        files = weight_files(model_dir)[1]
    except ScoringInputError:
        files = []
    folders = [model_dir, *_module_folders(model_dir)]
    for folder in folders:
        files.extend(p for p in sorted(folder.iterdir()) if p.suffix in MODEL_FILE_SUFFIXES and p.is_file())
    return files


def _module_folders(model_dir: Path) -> list[Path]:
    """The sub-folders a sentence-transformers modules.json names (a LogitScore module's config, …)."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text())
    except (OSError, ValueError):
        return []
    folders = []
    for module in modules if isinstance(modules, list) else []:
        name = module.get("path") if isinstance(module, dict) else None
        folder = model_dir / name if isinstance(name, str) and name.strip("./") else None
        if folder is not None and folder.resolve().is_relative_to(model_dir.resolve()) and folder.is_dir():
            folders.append(folder)
    return folders
