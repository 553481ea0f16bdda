"""Errors the engine raises for caller mistakes (bad model dir, bad labels, bad settings)."""


class ScoringInputError(ValueError):
    """A user-facing problem with the model, the settings or the input; the message says what to fix."""
