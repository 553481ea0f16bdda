"""Typer commands whose parameters are the fields of an options dataclass, and whose usage errors still
write --report."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from collections.abc import Callable
from typing import Any

from typer.core import TyperCommand
from typer.exceptions import TyperException

from score_batch.errors import UserError


def command_from(
    options: type,
    run: Callable[[Any], None],
    fixed: dict[str, object] | None = None,
) -> Callable[..., None]:
    """A function Typer can register: its parameters are the fields of the options dataclass (but those in
    fixed, which gives their values); calling it runs run(options(**values))."""
    hints = typing.get_type_hints(options, include_extras=True)
    fixed = fixed or {}
    parameters = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=hints[field.name],
            default=inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default,
        )
        for field in dataclasses.fields(options)
        if field.name not in fixed
    ]

    def command(**values: Any) -> None:
        run(options(**values, **fixed))

    command.__signature__ = inspect.Signature(parameters)  # what Typer reads to build the command's flags
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command


class ReportingCommand(TyperCommand):
    """A command whose bad flag values (found while parsing, before the command runs) still write --report."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list it parses
        try:
            return super().parse_args(ctx, args)
        except TyperException as error:
            report = self._raw_value(ctx, given, "report")
            if (
                report and getattr(error, "param", None) is not None
            ):  # a bad value, not a malformed command line
                failure = UserError(error.format_message())
                write_failure_report(
                    report, failure, overwrite=bool(self._raw_value(ctx, given, "overwrite"))
                )
            raise

    def _raw_value(self, ctx, args: list[str], name: str) -> object:
        """A parameter's value as given (unconverted) on a command line that failed to parse, or from its
        environment variable; None when absent or when the command line cannot be read at all."""
        try:
            values, _, _ = self.make_parser(ctx).parse_args(args=list(args))
        except TyperException:
            return None
        if values.get(name) is not None:
            return values[name]
        param = next((p for p in self.params if p.name == name), None)
        return param.resolve_envvar_value(ctx) if param is not None else None


def write_failure_report(report: str, error: BaseException, *, overwrite: bool) -> None:
    """Write --report for a run that failed before it started (through score_batch.job.report_failure, which
    refuses a bad report path with a UserError of its own)."""
    try:
        from score_batch.job import report_failure
    except ImportError:  # a job package without early-failure reports: say so rather than skip it silently
        print(
            f"score-batch: warning: --report {report} was not written (not supported here)", file=sys.stderr
        )
        return
    report_failure(report, error, overwrite=overwrite)
