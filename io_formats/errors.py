"""Errors for bad input files, columns or values; the message names the file, column or row."""

from score_batch.errors import UserError


class InputError(UserError):
    """A problem with the user's input or output paths that the user must fix (exit code 2)."""
