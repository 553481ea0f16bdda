"""The error classes every layer raises for problems its caller can fix; the CLI maps them to exit codes."""

from __future__ import annotations

import errno
import re


class UserError(Exception):
    """A mistake in the input, the settings, the model or the paths; the message says what to fix (exit 2)."""


class ConfigError(UserError):
    """A setting of a config dataclass is invalid; `setting` names it as Owner.field (e.g.
    ScoringConfig.score_index), `conflicts` the other settings whose values make this one invalid, if any."""

    def __init__(self, setting: str, value: object, problem: str, conflicts: tuple[str, ...] = ()) -> None:
        super().__init__(f"{setting}={value!r} {problem}")
        self.setting = setting
        self.value = value
        self.problem = problem
        self.conflicts = conflicts

    def __reduce__(self):
        return type(self), (self.setting, self.value, self.problem, self.conflicts)


class TooManyFailed(Exception):
    """The run wrote its output, but more of its items failed than --max-failed-rate allows (exit 4)."""


EXIT_OK, EXIT_BUG, EXIT_USAGE, EXIT_ENVIRONMENT, EXIT_TOO_MANY_FAILED = 0, 1, 2, 3, 4
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO}
# What pyarrow's object-store filesystems (S3, GCS) and fsspec's HTTP say when the store or the network refuses.
REMOTE_FAILURE = re.compile(
    r"AWS Error|Access ?Denied|google::cloud|GCS |curlCode|Could not connect|Couldn't connect|"
    r"Connection refused|Unable to connect|timed out|ClientConnectorError|NoSuchBucket|SlowDown"
)


def is_environment_error(error: BaseException) -> bool:
    """True for refusals of the machine: disk full, quota, permission, read-only file system, I/O error,
    and an object store or network that refuses (no credentials, access denied, unreachable endpoint)."""
    if not isinstance(error, OSError):
        return False
    return error.errno in ENVIRONMENT_ERRNOS or REMOTE_FAILURE.search(str(error)) is not None


def exit_code(error: BaseException | None) -> int:
    """The exit code of a run that ended with error (None: success): 0 success (a closed stdout pipe
    included), 1 a bug, 2 a user mistake, 3 the machine refused, 4 more items failed than --max-failed-rate
    allows (the output is written), 128 + N stopped by signal N."""
    if error is None or isinstance(error, BrokenPipeError):
        return EXIT_OK
    if isinstance(getattr(error, "signum", None), int):
        return 128 + error.signum
    if isinstance(error, UserError):
        return EXIT_USAGE
    if isinstance(error, TooManyFailed):
        return EXIT_TOO_MANY_FAILED
    if is_environment_error(error):
        return EXIT_ENVIRONMENT
    return EXIT_BUG
