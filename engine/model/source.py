"""Model names → local directories: a path, or a Hugging Face hub id found in the local cache (offline)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from score_batch.engine.errors import ScoringInputError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


def hub_cache_dir() -> Path:
    """The hub cache huggingface_hub would use: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def resolve_model_dir(
    name: str | Path, cache_dir: str | Path | None = None, revision: str | None = None
) -> Path:
    """A local model directory, or the cached snapshot of a hub id ('org/name' or 'org/name@revision').

    Its weight files are checked too (see check_weight_files), so a missing or damaged file is refused
    before any tokenizer or weight load. cache_dir: the hub cache to look in (default: hub_cache_dir());
    revision: the revision of a hub id given without '@revision'.
    """
    path = _find_model_dir(name, cache_dir, revision)
    if (path / "config.json").is_file():  # without it, read_model_info says what is wrong
        check_weight_files(path)
    return path


def hub_id_of(path: str | Path) -> str | None:
    """The hub id of a snapshot directory in a Hugging Face cache, or None.

    `…/models--Qwen--Qwen3-Reranker-0.6B/snapshots/<hash>` → "Qwen/Qwen3-Reranker-0.6B" (the cache names a
    repository folder `models--` + its id with "/" written "--"; hub ids never contain "--").
    """
    path = Path(path).expanduser().absolute()
    repo, snapshots = path.parent.parent.name, path.parent.name
    if snapshots != "snapshots" or not repo.startswith("models--"):
        return None
    org, _, name = repo.removeprefix("models--").partition("--")
    return f"{org}/{name}" if org and name else None


def _find_model_dir(name: str | Path, cache_dir: str | Path | None, revision: str | None) -> Path:
    """A local model directory, or the cached snapshot of a hub id (see resolve_model_dir)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    text = str(name)
    if not HUB_ID.match(text) or text.startswith((".", "/", "~")):
        raise ScoringInputError(
            f"model directory {text!r} does not exist (give a local directory or a hub id)"
        )
    repo_id, _, pinned = text.partition("@")
    revision = pinned or revision
    cache = Path(cache_dir).expanduser() if cache_dir is not None else hub_cache_dir()
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot = snapshot_download(
            repo_id, revision=revision or None, cache_dir=cache, local_files_only=True
        )
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        raise ScoringInputError(
            f"model {text!r} is neither a local directory nor in the Hugging Face cache at {str(cache)!r} "
            f"(set HF_HUB_CACHE or HF_HOME to look elsewhere). score-batch never downloads: fetch it where there "
            f"is network with `hf download {repo_id}` and copy the cache here, or give a local model directory"
        ) from None
    return Path(snapshot)


SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = "model.safetensors, model-*.safetensors + model.safetensors.index.json, pytorch_model*.bin"


def check_weight_files(path: str | Path) -> str:
    """Check the weight files transformers would load from a model directory, before any load.

    Returns "safetensors" or "pickle" (pytorch_model*.bin). Raises ScoringInputError naming the file
    when weights are missing, unreadable, truncated or not weight files at all. Reads headers only:
    safetensors headers through safe_open, the zip directory of torch.save files.
    """
    path = Path(path)
    kind, files = weight_files(path)
    check = _check_safetensors if kind == "safetensors" else _check_pickle
    for file in files:
        check(file, path)
    return kind


def weight_files(path: Path) -> tuple[str, list[Path]]:
    """("safetensors" or "pickle", the weight files) transformers would load from a model directory, in its
    order: the single file wins over an index beside it; ScoringInputError when there are none."""
    for kind, index_name, single in (
        ("safetensors", SAFETENSORS_INDEX, "model.safetensors"),
        ("pickle", PICKLE_INDEX, "pytorch_model.bin"),
    ):
        if os.path.lexists(path / single):  # a broken link counts: the check names it
            return kind, [path / single]
        if os.path.lexists(path / index_name):
            return kind, [path / shard for shard in _index_shards(path / index_name)]
    stray = sorted(p.name for p in path.glob("*.safetensors")) + sorted(p.name for p in path.glob("*.bin"))
    found = (
        f"; it has {', '.join(stray[:5])}{' …' if len(stray) > 5 else ''}, but sharded weights need their "
        "index file and other names are not loaded as the model's weights"
        if stray
        else ""
    )
    raise ScoringInputError(f"no weight files ({WEIGHT_FILES}) in {str(path)!r}{found}")


def _check_readable(file: Path, directory: Path) -> None:
    """Refuse a weight file that is missing, a broken link, not a regular file, or whose first byte cannot be read."""
    where = f"{file.name} in {str(directory)!r}"
    if not os.path.lexists(file):
        raise ScoringInputError(f"{file.name} is missing from {str(directory)!r}")
    if file.is_symlink() and not file.exists():
        raise ScoringInputError(
            f"{where} is a broken link (to {os.readlink(file)!r}); "
            "the file it points to is gone (an incomplete download or a cleaned cache?)"
        )
    if not file.is_file():
        raise ScoringInputError(f"{where} is not a regular file")
    try:
        with open(file, "rb") as handle:
            handle.read(1)
    except OSError as error:
        raise ScoringInputError(f"{where} cannot be read: {error.strerror or error}") from None


def _index_shards(index: Path) -> list[str]:
    """The shard file names listed in a sharded checkpoint's index."""
    _check_readable(index, index.parent)
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ScoringInputError(
            f"{index.name} in {str(index.parent)!r} is truncated or not a weight index "
            f"(a JSON object with a 'weight_map'): {error}"
        ) from None
    if not shards or not all(isinstance(shard, str) and "/" not in shard for shard in shards):
        raise ScoringInputError(f"{index.name} in {str(index.parent)!r} lists no usable shard files")
    return shards


def _check_safetensors(file: Path, directory: Path) -> None:
    """Refuse a safetensors file that is missing, unreadable, truncated or not safetensors (header only)."""
    _check_readable(file, directory)
    from safetensors import SafetensorError, safe_open

    try:
        # numpy, not pt: "pt" makes safetensors import torch from inside its Rust frames, and a stop raised
        # during that import aborted the process ("Rust cannot catch foreign exceptions"); numpy is loaded.
        with safe_open(str(file), framework="numpy") as handle:
            handle.keys()
    except (SafetensorError, OSError) as error:
        size = file.stat().st_size
        raise ScoringInputError(
            f"{file.name} in {str(directory)!r} is truncated or not a safetensors file ({size} bytes): {error}"
        ) from None


def _check_pickle(file: Path, directory: Path) -> None:
    """Refuse a torch.save file that is missing, unreadable, empty or a truncated zip (no unpickling)."""
    import zipfile

    _check_readable(file, directory)
    with open(file, "rb") as handle:
        magic = handle.read(4)
    what = f"{file.name} in {str(directory)!r} is truncated or not a PyTorch weight file"
    if magic.startswith(b"\x80"):  # the legacy (non-zip) torch.save format starts with a pickle
        return
    if magic != b"PK\x03\x04":
        raise ScoringInputError(f"{what} ({file.stat().st_size} bytes)")
    try:
        with zipfile.ZipFile(file):
            pass
    except (zipfile.BadZipFile, OSError) as error:
        raise ScoringInputError(f"{what}: {error}") from None
