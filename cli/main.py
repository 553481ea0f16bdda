"""The score-batch command line: one Typer app with `score` (the default command), `run-batch` and `models`."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from score_batch.cli.command import ReportingCommand, command_from
from score_batch.cli.errors import exit_code_for, usage_error
from score_batch.cli.logs import requested_format, setup_logging
from score_batch.cli.models import models
from score_batch.cli.options import RunBatchOptions, ScoreOptions
from score_batch.cli.score import ENV_PREFIX, HELP, RUN_BATCH_FIXED, RUN_BATCH_HELP, score
from typer.core import TyperGroup
from typer.exceptions import TyperException

from score_batch import __version__
from score_batch.signals import StopSignals

GROUP_OPTIONS = ("-h", "--help", "--version", "--install-completion", "--show-completion")


class ScoreByDefault(TyperGroup):
    """`score-batch INPUT …` means `score-batch score INPUT …`; subcommand names always win."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        first = args[0] if args else None
        if first not in self.commands and first not in GROUP_OPTIONS:
            args = ["score", *args]
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        """Run the command; every exception it raises goes through cli.errors' table to an exit code."""
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException, SystemExit):
            raise
        except Exception as error:  # noqa: BLE001 - the table decides, broken pipes and bugs included
            raise typer.Exit(exit_code_for(error)) from None


app = typer.Typer(
    cls=ScoreByDefault,
    add_completion=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Offline batch scoring of (query, item) pairs with multi-item packed transformers.\n\n"
    "[bold]score-batch INPUT -o OUTPUT[/bold] runs [bold]score[/bold] (see score-batch score --help); "
    "[bold]score-batch run-batch -i IN -o OUT[/bold] scores a vLLM-style batch file.\n\n"
    "Every option of score can also come from an environment variable SCORE_BATCH_<OPTION> "
    "(SCORE_BATCH_MODEL, SCORE_BATCH_ON_ERROR, …); flags win.\n\n"
    "Exit codes: 0 done; 2 bad input or flags; 3 the machine refused (disk full, permission); "
    "1 a bug; 130/143 stopped by Ctrl-C/SIGTERM (rerun with --resume).",
)


def _version(value: bool) -> None:
    """Print the version and stop (an eager --version callback)."""
    if value:
        typer.echo(f"score-batch {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Offline batch scoring of (query, item) pairs."""


ENV = {"auto_envvar_prefix": ENV_PREFIX}
app.command("score", cls=ReportingCommand, help=HELP, context_settings=ENV)(command_from(ScoreOptions, score))
app.command("run-batch", cls=ReportingCommand, help=RUN_BATCH_HELP, context_settings=ENV)(
    command_from(RunBatchOptions, score, RUN_BATCH_FIXED)
)
app.command(
    "models", help="Show the supported model families, the packing each allows, and the built-in profiles."
)(models)


def run() -> None:
    """Console entry point: every exception becomes an exit code through cli.errors' table.

    SIGINT/SIGTERM raise Stopped from the first instruction on (imports and model loading included), so
    even a run stopped in its first second ends with its report and exit code 130/143. Lines written before
    the options are read (usage errors, warnings) take --log-format's format already.
    """
    if requested_format(sys.argv[1:], os.environ) == "json":  # text needs no handler yet (nor rich's import)
        setup_logging(quiet=True, log_format="json")
    try:
        with StopSignals(immediate=True):
            code = app(standalone_mode=False)  # returns the exit code of typer.Exit when not standalone
    except typer.Exit as done:
        code = done.exit_code
    except typer.Abort:
        code = 130
    except TyperException as error:  # usage errors: bad flag value, unknown flag, missing argument
        code = usage_error(error)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    run()
