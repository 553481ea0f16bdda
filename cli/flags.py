"""A setting spelled as the command line that gives it: a config field Owner.field is named by the flag of
the option that sets it (cli/options.py's OPTIONS, the one declaration), in error messages too, so the flags
and the messages cannot disagree."""

from __future__ import annotations

import ast
import re
import shlex

from score_batch.cli.options import BY_SETTING, FLAGLESS

OWNERS = "|".join(sorted({setting.partition(".")[0] for setting in (*BY_SETTING, *FLAGLESS)}))
# A setting named inside a message, with or without a Python literal value: ScoringConfig.apply_softmax=False.
SETTING = re.compile(
    rf"\b((?:{OWNERS})\.[a-z_]+)" r"(?:=(True|False|None|'[^']*'|-?\d+(?:\.\d+)?|\((?:'[^']*'|[^()'])*\)))?"
)


def flag_of(setting: str) -> str:
    """The flag that sets a config field (`ScoringConfig.score_index` → `--score-index`); the setting itself
    when no flag sets it (a Python-only setting)."""
    return BY_SETTING[setting].flag if setting in BY_SETTING else setting


def as_flags(setting: str, value: object) -> str:
    """A setting and its value as the command line that gives it: `--truncate item-tail`, `--resume`,
    `--label-tokens ' no' --label-tokens ' yes'`, `--keep-columns a,b`."""
    option = BY_SETTING.get(setting)
    if option is None:
        return f"{setting} {_word(value)}"
    if value is True or value is None or value == ():
        return option.flag
    if value is False:
        return option.off or f"{option.flag} false"
    if isinstance(value, list | tuple):
        if option.repeatable:
            words = ("=".join(v) if isinstance(v, tuple) else v for v in value)
            return " ".join(f"{option.flag} {_word(word)}" for word in words)
        return f"{option.flag} {_word(','.join(map(str, value)))}"
    return f"{option.flag} {_word(value)}"


def spell_settings(text: str) -> str:
    """A message's settings (ScoringConfig.apply_softmax=False, EngineConfig.dtype) as the flags that give
    them (--no-apply-softmax, --dtype); settings no flag gives stay as they are."""

    def spelled(match: re.Match) -> str:
        setting, value = match.group(1), match.group(2)
        if setting not in BY_SETTING:
            return match.group(0)
        return flag_of(setting) if value is None else as_flags(setting, ast.literal_eval(value))

    return SETTING.sub(spelled, text)


def _word(value: object) -> str:
    """One shell word: quoted only when the shell needs it (spaces, quotes, empty)."""
    return shlex.quote(str(value))
