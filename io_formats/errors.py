"""Errors for bad input files, columns or values; the message names the file, column or row."""


class InputError(ValueError):
    """A problem with the user's input or output paths that the user must fix (exit code 2)."""
