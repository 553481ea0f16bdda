"""Scoring profiles: labels, templates and softmax settings for a model, merged under the user's flags.

Where a profile comes from, first match wins: --profile NAME|FILE; score_batch.json in the model
directory; a built-in profile (profiles/*.json) listing the model's hub id or directory name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
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
META_KEYS = {"description", "models"}


@dataclass(frozen=True)
class Profile:
    """Scoring defaults and where they came from."""

    name: str
    source: str  # a file path, or "built-in"
    description: str
    models: tuple[str, ...]
    settings: dict


def parse_profile(name: str, source: str, text: str) -> Profile:
    """Validate a profile's JSON text (unknown keys are an error, so typos never pass silently)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"profile {source}: not valid JSON ({error.msg} at line {error.lineno})") from error
    if not isinstance(raw, dict):
        raise InputError(f"profile {source}: expected a JSON object")
    unknown = set(raw) - PROFILE_KEYS - META_KEYS
    if unknown:
        raise InputError(f"profile {source}: unknown keys {sorted(unknown)}; allowed: {sorted(PROFILE_KEYS)}")
    settings = {k: v for k, v in raw.items() if k in PROFILE_KEYS}
    for key in ("label_tokens", "label_token_ids"):
        if key in settings:
            settings[key] = tuple(settings[key])
    return Profile(name, source, raw.get("description", ""), tuple(raw.get("models", ())), settings)


def builtin_profiles() -> dict[str, Profile]:
    """The profiles shipped in profiles/, by name."""
    found = {}
    for entry in sorted(resources.files("profiles").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            name = entry.name.removesuffix(".json")
            found[name] = parse_profile(name, "built-in", entry.read_text())
    return found


def choose_profile(explicit: str | None, model_name: str, model_dir: Path) -> Profile | None:
    """The profile of a run: explicit, beside the model, or a built-in one matching the model's name."""
    builtins = builtin_profiles()
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_file():
            return parse_profile(path.stem, str(path), path.read_text())
        if explicit in builtins:
            return builtins[explicit]
        raise InputError(
            f"--profile {explicit!r} is neither a file nor a built-in profile ({', '.join(builtins)})"
        )
    beside = model_dir / PROFILE_FILE
    if beside.is_file():
        return parse_profile(PROFILE_FILE, str(beside), beside.read_text())
    names = {model_name.lower(), model_dir.name.lower()}
    for profile in builtins.values():
        for model in profile.models:
            if model.lower() in names or model.lower().rsplit("/", 1)[-1] in names:
                return profile
    return None


def merge_profile(profile: dict, flags: dict) -> dict:
    """Flags the user gave (not None) override the profile's values."""
    merged = dict(profile)
    merged.update({k: v for k, v in flags.items() if v is not None})
    if flags.get("label_token_ids") is not None:
        merged.pop("label_tokens", None)
    if flags.get("label_tokens") is not None:
        merged.pop("label_token_ids", None)
    return merged
