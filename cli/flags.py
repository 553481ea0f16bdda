"""The one table from config fields to the flags that set them, and a setting spelled as a command line.

A config field Owner.field (ScoringConfig.truncate, RunConfig.window_rows, …) is set by the ScoreOptions
field of the same name, except where OPTION_OF names another one. Error messages name the flag through
the same table (ConfigError.setting → flag_of), so the mapping and the messages cannot disagree.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
import typing

import typer

from score_batch.cli.options import ScoreOptions
from score_batch.errors import ConfigError

OPTION_OF = {  # config fields set by an option of another name (or built from it)
    "RunConfig.model_dir": "model",
    "RunConfig.storage_options": "storage_option",
    "RunConfig.ray": "ray",
    "RayOptions.address": "ray_address",
}
# Nested configs, built from their own fields' flags.
NESTED = ("RunConfig.columns", "RunConfig.engine", "EngineConfig.scoring")
FLAGLESS = ("RayOptions.groups_per_batch",)  # Python API only: the command keeps the default
OPTION_NAMES = tuple(field.name for field in dataclasses.fields(ScoreOptions))
_HINTS = typing.get_type_hints(ScoreOptions, include_extras=True)
# A setting named inside a message, with or without a Python literal value: ScoringConfig.apply_softmax=False.
SETTING = re.compile(
    r"\b((?:ScoringConfig|EngineConfig|RunConfig|RayOptions|ColumnOverrides)\.[a-z_]+)"
    r"(?:=(True|False|None|'[^']*'|-?\d+(?:\.\d+)?|\((?:'[^']*'|[^()'])*\)))?"
)


def option_of(setting: str) -> str | None:
    """The ScoreOptions field that sets config field Owner.field, or None when no flag sets it."""
    if setting in OPTION_OF:
        return OPTION_OF[setting]
    name = setting.rpartition(".")[2]
    return name if name in OPTION_NAMES and setting not in NESTED + FLAGLESS else None


def flag_of(setting: str) -> str:
    """The flag that sets a config field (`ScoringConfig.score_index` → `--score-index`); the setting itself
    when no flag sets it (a Python-only setting)."""
    option = option_of(setting)
    return _names(option)[0] if option else setting


def as_flags(setting: str, value: object) -> str:
    """A setting and its value as the command line that gives it: `--truncate item-tail`, `--resume`,
    `--label-tokens ' no' --label-tokens ' yes'`, `--keep-columns a,b`."""
    option = option_of(setting)
    if option is None:
        return f"{setting} {_word(value)}"
    flag, off = _names(option)
    if value is True or value is None or value == ():
        return flag
    if value is False:
        return off or f"{flag} false"
    if isinstance(value, list | tuple):
        if _repeatable(option):
            return " ".join(f"{flag} {_word('='.join(v) if isinstance(v, tuple) else v)}" for v in value)
        return f"{flag} {_word(','.join(map(str, value)))}"
    return f"{flag} {_word(value)}"


def spell_settings(text: str) -> str:
    """A message's settings (ScoringConfig.apply_softmax=False, EngineConfig.dtype) as the flags that give them
    (--no-apply-softmax, --dtype); settings no flag gives stay as they are."""

    def spelled(match: re.Match) -> str:
        setting, value = match.group(1), match.group(2)
        if option_of(setting) is None:
            return match.group(0)
        return flag_of(setting) if value is None else as_flags(setting, ast.literal_eval(value))

    return SETTING.sub(spelled, text)


def _declared(option: str) -> typer.models.ParameterInfo:
    """The typer.Option / typer.Argument declared for a ScoreOptions field."""
    return next(m for m in typing.get_args(_HINTS[option]) if isinstance(m, typer.models.ParameterInfo))


def _names(option: str) -> tuple[str, str | None]:
    """An option's long flag (INPUT for the argument) and its --no- form, if declared."""
    info = _declared(option)
    if isinstance(info, typer.models.ArgumentInfo):
        return option.upper(), None
    # In Annotated form, typer.Option's first positional argument (stored as `default`) is a flag name.
    decls = [info.default] if isinstance(info.default, str) else []
    names = [name for decl in (*decls, *(info.param_decls or ())) for name in decl.split("/")]
    long = [name for name in names if name.startswith("--") and not name.startswith("--no-")]
    off = [name for name in names if name.startswith("--no-")]
    return (long[0] if long else "--" + option.replace("_", "-")), (off[0] if off else None)


def _repeatable(option: str) -> bool:
    """True for a flag given once per value (a list option): --label-tokens ' no' --label-tokens ' yes'."""
    value_type = typing.get_args(_HINTS[option])[0]
    return any(typing.get_origin(t) is list for t in (value_type, *typing.get_args(value_type)))


def _word(value: object) -> str:
    """One shell word: quoted only when the shell needs it (spaces, quotes, empty)."""
    return shlex.quote(str(value))


def comma_list(value: str | None) -> tuple[str, ...]:
    """'a, b,c' → ('a', 'b', 'c'); None → ()."""
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def comma_ints(value: str | None, setting: str) -> tuple[int, ...] | None:
    """'1,2,3' → (1, 2, 3); a ConfigError naming the setting (so its flag) for anything else."""
    if value is None:
        return None
    try:
        return tuple(int(v) for v in comma_list(value))
    except ValueError:
        raise ConfigError(setting, value, "is not a comma-separated list of integers") from None
