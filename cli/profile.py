"""Scoring defaults stored beside a model (score_batch.json), merged under the user's flags."""

from __future__ import annotations

import json
from pathlib import Path

from io_formats.errors import InputError

PROFILE_FILE = "score_batch.json"
PROFILE_KEYS = {
    "label_tokens",
    "label_token_ids",
    "apply_softmax",
    "score_index",
    "query_template",
    "item_template",
    "item_first",
    "delimiter_token_id",
}


def read_profile(model_dir: Path) -> dict:
    """The model directory's scoring defaults, or {} when it has none."""
    path = model_dir / PROFILE_FILE
    if not path.is_file():
        return {}
    try:
        profile = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error.msg} at line {error.lineno})") from error
    unknown = set(profile) - PROFILE_KEYS
    if unknown:
        raise InputError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(PROFILE_KEYS)}")
    for key in ("label_tokens", "label_token_ids"):
        if key in profile:
            profile[key] = tuple(profile[key])
    return profile


def merge_profile(profile: dict, flags: dict) -> dict:
    """Flags the user gave (not None) override the profile's values."""
    merged = dict(profile)
    merged.update({k: v for k, v in flags.items() if v is not None})
    if flags.get("label_token_ids") is not None:
        merged.pop("label_tokens", None)
    if flags.get("label_tokens") is not None:
        merged.pop("label_token_ids", None)
    return merged
