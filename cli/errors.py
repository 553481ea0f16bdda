"""The one table from exception types to exit codes and messages; the command's only error handling."""

from __future__ import annotations

import errno
import logging
import os
import sys

from cli.flags import in_flag_words
from job import Stopped
from score_batch.errors import EnvironmentFault, UserError

EXIT_OK = 0
EXIT_BUG = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO}
log = logging.getLogger(__name__)


def exit_code_for(error: BaseException) -> int:
    """Print what the user needs to know about error on stderr and return the process exit code."""
    if isinstance(error, BrokenPipeError):
        # The reader went away (`score-batch … -o - | head`): the normal end of a pipe, not a failure.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    if isinstance(error, Stopped):
        log.error("stopped by %s; completed windows are checkpointed: rerun with --resume to continue", error)
        return 128 + error.signum
    if isinstance(error, UserError):
        _say(in_flag_words(str(error)))
        return EXIT_USAGE
    if isinstance(error, EnvironmentFault) or (
        isinstance(error, OSError) and error.errno in ENVIRONMENT_ERRNOS
    ):
        _say(f"{error} (the machine refused; fix it and rerun, with --resume where parts were checkpointed)")
        return EXIT_ENVIRONMENT
    log.error("unexpected failure (a bug: please report it)", exc_info=error)
    return EXIT_BUG


def _say(message: str) -> None:
    """One error paragraph on stderr."""
    print(f"score-batch: error: {message}", file=sys.stderr)
