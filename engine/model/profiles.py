"""Scoring profiles: ScoringConfig values for a model (labels, templates, softmax), merged under the caller's.

Where a profile comes from, first match wins: an explicit name or JSON file; score_batch.json in the
model directory; a built-in profile (engine/model/builtin_profiles/*.json) listing the model's hub id or
directory name. A profile's keys are ScoringConfig's field names, checked against the fields' types.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from score_batch.engine.config import ScoringConfig
from score_batch.engine.errors import ScoringInputError, SettingError

PROFILE_FILE = "score_batch.json"
BUILTIN_PACKAGE = "score_batch.engine.model.builtin_profiles"
META_KEYS = ("description", "models")
FIELD_TYPES = typing.get_type_hints(ScoringConfig)
PROFILE_KEYS = tuple(f.name for f in dataclasses.fields(ScoringConfig))
# Plain types in words, for a profile's JSON and for Python keyword arguments (_describe).
_JSON_NAMES = {bool: "true/false", int: "an integer", str: "a string", type(None): "null"}
_PYTHON_NAMES = {bool: "True/False", int: "an int", str: "a str", type(None): "None"}


@dataclass(frozen=True)
class Profile:
    """Scoring defaults and where they came from."""

    name: str
    source: str  # a file path, or "built-in"
    description: str
    models: tuple[str, ...]
    settings: dict


def parse_profile(name: str, source: str, text: str) -> Profile:
    """Validate a profile's JSON text: known keys only, each value of its ScoringConfig field's type."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise ScoringInputError(
            f"profile {source}: not valid JSON ({error.msg} at line {error.lineno})"
        ) from None
    if not isinstance(raw, dict):
        raise ScoringInputError(f"profile {source}: expected a JSON object")
    unknown = set(raw) - set(PROFILE_KEYS) - set(META_KEYS)
    if unknown:
        raise ScoringInputError(
            f"profile {source}: unknown keys {sorted(unknown)}; allowed: {sorted(PROFILE_KEYS)}"
        )
    settings = {key: _typed(source, key, raw[key]) for key in PROFILE_KEYS if key in raw}
    models = raw.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ScoringInputError(f"profile {source}: 'models' must be a list of model names")
    return Profile(name, source, str(raw.get("description", "")), tuple(models), settings)


def _typed(source: str, key: str, value: Any) -> Any:
    """A profile value checked against ScoringConfig's annotation for key (lists become tuples)."""
    expected = FIELD_TYPES[key]
    if _matches(value, expected):
        return tuple(value) if isinstance(value, list) else value
    raise ScoringInputError(
        f"profile {source}: {key!r} must be {_describe(expected)}, got {json.dumps(value)}"
    )


def _matches(value: Any, expected: Any) -> bool:
    """True when a JSON value fits a type annotation (bool is never an int here)."""
    origin = typing.get_origin(expected)
    if origin is typing.Literal:
        return isinstance(value, str) and value in typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, option) for option in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if origin is tuple:
        element = typing.get_args(expected)[0]
        return isinstance(value, list) and all(_matches(v, element) for v in value)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def _describe(expected: Any, python: bool = False) -> str:
    """A type annotation in JSON words, or in Python words (where a tuple field accepts a list or a tuple)."""
    origin = typing.get_origin(expected)
    if origin is typing.Literal:
        quote = repr if python else json.dumps
        return "one of " + ", ".join(quote(choice) for choice in typing.get_args(expected))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(option, python) for option in typing.get_args(expected))
    if origin is tuple:
        element = typing.get_args(expected)[0]
        if python:
            return f"a list or tuple of {getattr(element, '__name__', str(element))}"
        return f"a list of {_describe(element)}s"
    names = _PYTHON_NAMES if python else _JSON_NAMES
    return names.get(expected, getattr(expected, "__name__", str(expected)))


def builtin_profiles() -> dict[str, Profile]:
    """The profiles shipped in engine/model/builtin_profiles/, by name."""
    found = {}
    for entry in sorted(resources.files(BUILTIN_PACKAGE).iterdir(), key=lambda e: e.name):
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
            return parse_profile(path.stem, str(path), _read(path))
        if explicit in builtins:
            return builtins[explicit]
        raise ScoringInputError(
            f"profile {explicit!r} is neither a file nor a built-in profile ({', '.join(builtins)})"
        )
    beside = Path(model_dir) / PROFILE_FILE
    if beside.is_file():
        return parse_profile(PROFILE_FILE, str(beside), _read(beside))
    names = {model_name.lower(), Path(model_dir).name.lower()}
    for profile in builtins.values():
        for model in profile.models:
            if model.lower() in names or model.lower().rsplit("/", 1)[-1] in names:
                return profile
    return None


def _read(path: Path) -> str:
    """A profile file's text, or a user error saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ScoringInputError(f"profile {path}: cannot be read ({error})") from None


def merge_profile(profile: dict, overrides: dict) -> dict:
    """The caller's values (not None) override the profile's; label ids and label tokens replace each other."""
    merged = dict(profile)
    if overrides.get("label_token_ids") is not None:
        merged.pop("label_tokens", None)
    if overrides.get("label_tokens") is not None:
        merged.pop("label_token_ids", None)
    merged.update({k: v for k, v in overrides.items() if v is not None})  # both given: ScoringConfig refuses
    return merged


def scoring_config(profile: Profile | None, overrides: dict) -> ScoringConfig:
    """The ScoringConfig of a profile under the caller's overrides (None = not given)."""
    return ScoringConfig(**merge_profile(profile.settings if profile else {}, overrides))


def checked_overrides(overrides: dict) -> dict:
    """Keyword overrides of ScoringConfig fields from Python: known names only, values of the field's type;
    None means "not given" (the profile's value stays), as an absent command-line flag; lists become tuples.
    """
    checked = {}
    for key, value in overrides.items():
        if key not in PROFILE_KEYS:
            raise ScoringInputError(
                f"unknown scoring setting {key!r}; the keyword overrides are ScoringConfig's fields: "
                f"{', '.join(PROFILE_KEYS)} (engine settings such as device go in EngineConfig)"
            )
        if value is None:
            continue
        as_json = list(value) if isinstance(value, tuple) else value
        if typing.get_origin(FIELD_TYPES[key]) is typing.Literal and isinstance(value, str):
            pass  # ScoringConfig itself names the choices
        elif not _matches(as_json, FIELD_TYPES[key]):
            raise SettingError(
                f"ScoringConfig.{key}", value, f"must be {_describe(FIELD_TYPES[key], python=True)}"
            )
        checked[key] = tuple(value) if isinstance(value, list | tuple) else value
    return checked


def resolve_scoring(
    model_name: str, model_dir: Path, explicit: ScoringConfig | None, profile: str | None, overrides: dict
) -> tuple[ScoringConfig, Profile | None]:
    """The ScoringConfig of a Python caller, resolved as the command line does, and the profile used. A
    non-default explicit ScoringConfig wins over every profile (none is looked up); otherwise the profile is
    chosen as the CLI's (choose_profile). Keyword overrides then replace single values, like flags."""
    overrides = checked_overrides(overrides)
    if explicit is not None and explicit != ScoringConfig():
        if profile:
            raise ScoringInputError(
                f"profile={profile!r} was given together with a non-default EngineConfig.scoring; give one: "
                "the profile (with keyword overrides such as apply_softmax=False), or the full ScoringConfig"
            )
        base = {key: getattr(explicit, key) for key in PROFILE_KEYS}
        return ScoringConfig(**merge_profile(base, overrides)), None
    chosen = choose_profile(profile, model_name, model_dir)
    return scoring_config(chosen, overrides), chosen
