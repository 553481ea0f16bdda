"""The one table from exception types to messages on stderr (exit codes come from score_batch.errors), and a
setting in a message spelled as the command line that gives it: a config field Owner.field is named by the flag
of the option that sets it (cli/options.py's OPTIONS, the one declaration), so flags and messages agree."""

from __future__ import annotations

import ast
import difflib
import logging
import os
import re
import shlex
import sys

from typer._click.exceptions import NoSuchOption

from score_batch.cli.logs import say
from score_batch.cli.options import BY_SETTING, FLAGLESS, ScoreOptions
from score_batch.errors import (
    EXIT_USAGE,
    ConfigError,
    TooManyFailed,
    UserError,
    exit_code,
    is_environment_error,
)

log = logging.getLogger(__name__)
OWNERS = "|".join(sorted({setting.partition(".")[0] for setting in (*BY_SETTING, *FLAGLESS)}))
# A setting named inside a message, with or without a Python literal value: ScoringConfig.apply_softmax=False.
SETTING = re.compile(
    rf"\b((?:{OWNERS})\.[a-z_]+)" r"(?:=(True|False|None|'[^']*'|-?\d+(?:\.\d+)?|\((?:'[^']*'|[^()'])*\)))?"
)


def exit_code_for(error: BaseException) -> int:
    """Tell the user what they need to know about error (one line, no traceback unless a bug); the exit code."""
    if isinstance(error, BrokenPipeError):
        # The reader went away (`score-batch … -o - | head`): the normal end of a pipe, not a failure.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    elif isinstance(getattr(error, "signum", None), int):  # job.Stopped, by the rule exit_code() uses
        log.error("stopped by %s; completed windows are checkpointed: rerun with --resume to continue", error)
    elif isinstance(error, UserError):
        say(user_message(error))
    elif isinstance(error, TooManyFailed):  # the run's own line: its output is written
        say(str(error))
    elif is_environment_error(error):
        say(f"{error} (the machine refused; fix it and rerun, with --resume where parts were checkpointed)")
    else:
        log.error("unexpected failure (a bug: please report it)", exc_info=error)
    return exit_code(error)


def user_message(error: UserError) -> str:
    """A user error in command-line words: a ConfigError's setting, and the settings its message names, spelled
    as the flags that give them."""
    if isinstance(error, ConfigError):
        return f"{as_flags(error.setting, error.value)} {spell_settings(error.problem)}"
    return spell_settings(str(error))


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
        return BY_SETTING[setting].flag if value is None else as_flags(setting, ast.literal_eval(value))

    return SETTING.sub(spelled, text)


def _word(value: object) -> str:
    """One shell word: quoted only when the shell needs it (spaces, quotes, empty)."""
    return shlex.quote(str(value))


def profile_noted(error: ConfigError, options: ScoreOptions, profile) -> ConfigError:
    """error, saying which of its scoring settings (the refused one and those it conflicts with) the profile
    set and no flag did: the flag to give is then the one that overrides the profile's."""
    if profile is None:
        return error
    from_profile = [
        setting
        for setting in (error.setting, *error.conflicts)
        if setting.startswith("ScoringConfig.")
        and setting.partition(".")[2] in profile.settings
        and getattr(options, BY_SETTING[setting].name, None) is None
    ]
    if not from_profile:
        return error
    spelled = " and ".join(as_flags(s, profile.settings[s.partition(".")[2]]) for s in from_profile)
    problem = f"{error.problem} (the profile {profile.name} sets {spelled})"
    return type(error)(error.setting, error.value, problem, error.conflicts)


def close_flags(given: str, params) -> list[str]:
    """The flags an unknown one most likely meant: those it begins (--pooled → --pooled-hidden-states), else
    the closest spellings (difflib's, as click's own suggestion)."""
    flags = sorted({name for p in params for name in (*p.opts, *p.secondary_opts) if name.startswith("--")})
    begun = [flag for flag in flags if flag.startswith(given) and given.startswith("--") and len(given) > 3]
    return begun[:3] or difflib.get_close_matches(given, flags, n=2)


def usage_error(error) -> int:
    """A flag or argument click refused (bad value, unknown flag, missing input): one line, exit code 2.

    Every other user mistake gets the same `score-batch: error:` line; click's usage block would bury it.
    """
    ctx = getattr(error, "ctx", None)
    if isinstance(error, NoSuchOption) and ctx is not None:
        error.possibilities = None
        close = close_flags(error.option_name, ctx.command.get_params(ctx))
        error.message += f" (did you mean {' or '.join(close)}?)" if close else ""
    message = error.format_message().replace("Value error, ", "")  # pydantic's prefix on choice values
    command = ctx.command_path if ctx is not None else "score-batch"
    say(f"{message.rstrip('.')} ({command} -h lists every option)")
    return error.exit_code or EXIT_USAGE
