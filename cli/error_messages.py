"""The one table from exception types to messages on stderr; exit codes come from score_batch.errors."""

from __future__ import annotations

import difflib
import logging
import os
import sys

from typer._click.exceptions import NoSuchOption

from score_batch.cli.flags import as_flags, spell_settings
from score_batch.cli.logs import say
from score_batch.errors import (
    EXIT_USAGE,
    ConfigError,
    TooManyFailed,
    UserError,
    exit_code,
    is_environment_error,
)

log = logging.getLogger(__name__)


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
