"""Model names → local directories: a path, or a Hugging Face hub id found in the local cache (offline)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from engine.errors import ScoringInputError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


def hub_cache_dir() -> Path:
    """The hub cache huggingface_hub would use: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def resolve_model_dir(name: str | Path) -> Path:
    """A local model directory, or the cached snapshot of a hub id ('org/name' or 'org/name@revision')."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    text = str(name)
    if not HUB_ID.match(text) or text.startswith((".", "/", "~")):
        raise ScoringInputError(
            f"model directory {text!r} does not exist (give a local directory or a hub id)"
        )
    repo_id, _, revision = text.partition("@")
    cache = hub_cache_dir()
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
