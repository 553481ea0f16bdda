"""Typer commands whose usage errors still write --report, and how --help shows their parameters."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from typer._click.exceptions import BadParameter
from typer.core import TyperArgument, TyperCommand, TyperOption
from typer.exceptions import TyperException

from score_batch.cli.logs import flag_value, say
from score_batch.cli.options import OPTION, PANELS
from score_batch.errors import UserError
from score_batch.signals import Stopped

TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")  # click's spellings of a true boolean


TYPE_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "list[str]": "TEXT"}


class HelpOption(TyperOption):
    """An option as --help shows it: a flag without a type, choices as [a|b], a value as TEXT, INTEGER, FLOAT
    (or its metavar); cli/help.py shows a default given in words (show_default="…") as any other default."""

    def display_type_rich(self, ctx) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return self.metavar
        if self.type_descriptor.is_choice:
            return "[" + "|".join(str(choice) for choice in self.type_descriptor.choices) + "]"
        shown = self.display_type(ctx).strip("<>")
        return TYPE_WORDS.get(shown, shown.upper())


class HelpArgument(TyperArgument):
    """An argument as --help shows it: its metavar (INPUT...) in the usage line and its panel, no type."""

    def display_type_rich(self, ctx) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        return self.display_name_raw if self.required else f"[{self.display_name_raw}]"

    def get_error_hint(self) -> str:
        return repr(self.display_name_raw.removesuffix("..."))  # Missing argument 'INPUT'


def help_params(params: list) -> list:
    """params, each shown by HelpOption's or HelpArgument's rules (their parsing is Typer's, unchanged)."""
    for param in params:
        if type(param) is TyperOption:
            param.__class__ = HelpOption
        elif type(param) is TyperArgument:
            param.__class__ = HelpArgument
    return params


class ReportingCommand(TyperCommand):
    """A command whose bad flag values (found while parsing, before the command runs) still write --report.

    Its repeatable options also take a JSON list from their environment variable
    (SCORE_BATCH_LABEL_TOKENS='[" no", " yes"]'), which whitespace splitting could not carry.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if getattr(param, "multiple", False):
                param.value_from_envvar = _json_list_or(param, param.value_from_envvar)

    def get_params(self, ctx) -> list:
        return help_params(super().get_params(ctx))

    def format_help(self, ctx, formatter) -> None:
        """The options in titled panels at any width, in the top-level help's style (cli/help.py)."""
        from score_batch.cli.help import print_help  # rich only when help is shown

        print_help(self, ctx, PANELS)

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list it parses
        try:
            return super().parse_args(ctx, args)
        except TyperException as error:
            report = self._given(ctx, given, "report")
            if report and getattr(error, "param", None) is not None:  # a bad value, not an unknown flag
                overwrite = bool(self._given(ctx, given, "overwrite"))
                write_failure_report(report, UserError(error.format_message()), overwrite=overwrite)
            raise

    def _given(self, ctx, args: list[str], name: str) -> object:
        """A parameter's value on a command line that failed to parse (else from its environment variable),
        converted to its type; None when absent, unreadable or itself bad."""
        param = next((p for p in self.params if p.name == name), None)
        try:
            values, _, _ = self.make_parser(ctx).parse_args(args=list(args))
            value = values.get(name)
            if value is None and param is not None:
                value = param.resolve_envvar_value(ctx)
            return None if value is None or param is None else param.process_value(ctx, value)
        except TyperException:
            return None


def _json_list_or(param, split: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A repeatable option's environment value: a JSON list (`[" no", " yes"]`) as given, or one word without
    whitespace; anything else is refused (whitespace-separated words lose the leading spaces tokens carry)."""

    def value_from_envvar(ctx):
        raw = param.resolve_envvar_value(ctx)
        if not raw:
            return split(ctx)

        def refused(problem: str) -> BadParameter:
            return BadParameter(f"its environment value {problem}", ctx=ctx, param=param)

        if not raw.lstrip().startswith("["):
            if raw.split() == [raw]:
                return [raw]
            name = param.envvar or f"{ctx.auto_envvar_prefix}_{param.name.upper()}"
            example = '\'[" no", " yes"]\'' if param.name == "label_tokens" else '\'["a", "b"]\''
            spaces = "whitespace-separated words would lose their spaces"
            raise refused(f"{raw!r} must be a JSON list ({name}={example}): {spaces}")
        try:
            values = json.loads(raw)
        except ValueError as error:
            raise refused(f"is not a JSON list ({error})") from None
        if not isinstance(values, list) or not all(isinstance(v, (str, int, float)) for v in values):
            raise refused("must be a JSON list of strings or numbers")
        return [str(v) for v in values]

    return value_from_envvar


def write_failure_report(report: str, error: BaseException, *, overwrite: bool) -> None:
    """Write --report for a run that failed before it started (through score_batch.job.report_failure, which
    refuses a bad report path with a UserError of its own)."""
    try:
        from score_batch.job import report_failure
    except ImportError:  # a job package without early-failure reports: say so rather than skip it silently
        say(f"--report {report} was not written (not supported here)", "warning")
        return
    report_failure(report, error, overwrite=overwrite)
    if isinstance(error, Stopped):
        error.reported = True


def report_stop(stopped: Stopped, args: list[str], environ) -> None:
    """Write --report (from the command line, else SCORE_BATCH_REPORT) for a run stopped before any part of it
    wrote one: while the command line was imported or parsed."""
    if stopped.reported:
        return
    report = flag_value(args, OPTION["report"].flag) or environ.get(OPTION["report"].env)
    if not report:
        return
    given = OPTION["overwrite"]
    overwrite = given.flag in args or environ.get(given.env, "").lower() in TRUE_WORDS
    try:
        write_failure_report(report, stopped, overwrite=overwrite)
    except UserError as refused:  # a bad report path: the stop is what to show
        say(f"--report {report} was not written: {refused}", "warning")
