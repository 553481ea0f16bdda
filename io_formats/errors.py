"""Errors for bad input files, columns or values; the message names the file, column or row."""

import pyarrow as pa

from score_batch.errors import UserError, is_environment_error

READ_ERRORS = (pa.ArrowException, OSError)  # what pyarrow raises for unreadable or corrupt files


class InputError(UserError):
    """A problem with the user's input or output paths that the user must fix (exit code 2)."""


def unreadable(error: BaseException, message: str) -> BaseException:
    """What a failed read raises: a refusal of the machine or the network (not a damaged file) as it is, an
    OSError; else InputError(message)."""
    environment = isinstance(error, PermissionError) or is_environment_error(error)
    return error if environment else InputError(message)
