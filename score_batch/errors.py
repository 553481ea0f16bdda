"""The error classes every layer raises for problems its caller can fix; the CLI maps them to exit codes."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the input, the settings, the model or the paths; the message says what to fix (exit 2)."""


class ConfigError(UserError):
    """A setting of a config dataclass is invalid; `setting` names it as Owner.field, e.g. ScoringConfig.score_index."""

    def __init__(self, setting: str, value: object, problem: str) -> None:
        super().__init__(f"{setting}={value!r} {problem}")
        self.setting = setting
        self.value = value
        self.problem = problem

    def __reduce__(self):
        return type(self), (self.setting, self.value, self.problem)


class EnvironmentFault(Exception):
    """The machine refused: disk full, permission denied, read-only file system (exit 3, retry after fixing)."""
