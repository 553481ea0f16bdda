"""Errors for bad input files, columns or values; the message names the file, column or row."""

import pyarrow as pa

from score_batch.errors import UserError, is_environment_error

READ_ERRORS = (pa.ArrowException, OSError)  # what pyarrow raises for unreadable or corrupt files


class InputError(UserError):
    """A problem with the user's input or output paths that the user must fix (exit code 2)."""


def is_environment(error: BaseException) -> bool:
    """True for a refusal of the machine or the network (not a damaged file): it propagates as OSError."""
    return isinstance(error, PermissionError) or is_environment_error(error)
