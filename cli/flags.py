"""Flag text helpers: comma lists, and the one table from config fields to the flags that set them."""

from __future__ import annotations

import re

import typer

CONFIG_OWNERS = ("ScoringConfig", "EngineConfig", "RunConfig", "RayOptions", "ColumnOverrides")
FIELD_FLAGS = {  # fields whose flag is not --field-name
    "RunConfig.input": "INPUT",
    "RunConfig.output": "-o/--output",
    "RunConfig.model_dir": "--model",
    "RayOptions.address": "--ray-address",
    "ColumnOverrides.keep_columns": "--keep-columns",
}
SETTING = re.compile(rf"\b({'|'.join(CONFIG_OWNERS)})\.(\w+)")


def flag_of(setting: str) -> str:
    """The flag that sets a config field named Owner.field."""
    return FIELD_FLAGS.get(setting) or "--" + setting.split(".", 1)[1].replace("_", "-")


def in_flag_words(message: str) -> str:
    """A library message with every Owner.field=value spelled as the flag that sets it."""
    return SETTING.sub(lambda match: flag_of(match.group(0)), message)


def comma_list(value: str | None) -> tuple[str, ...]:
    """'a, b,c' → ('a', 'b', 'c'); None → ()."""
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def comma_ints(value: str | None, flag: str) -> tuple[int, ...] | None:
    """'1,2,3' → (1, 2, 3), with a usage error naming the flag."""
    if value is None:
        return None
    try:
        return tuple(int(v) for v in comma_list(value))
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not a comma-separated list of integers", param_hint=flag
        ) from None
