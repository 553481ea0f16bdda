"""Errors the engine raises for caller mistakes (bad model dir, bad labels, bad settings)."""

from score_batch.errors import ConfigError, UserError


class ScoringInputError(UserError):
    """A user-facing problem with the model, the settings or the input; the message says what to fix."""


class SettingError(ConfigError, ScoringInputError):
    """An EngineConfig / ScoringConfig field is invalid for this model or machine; names the field and value."""
