"""The score-batch Typer app: `score` (the default command), `run-batch` and `models` (cli/main.py runs it)."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

from score_batch import __version__
from score_batch.cli.command import ReportingCommand, help_params, report_stop
from score_batch.cli.error_messages import exit_code_for, usage_error
from score_batch.cli.models import models
from score_batch.cli.options import ENV_PREFIX, OPTIONS, RUN_BATCH_FIXED, RUN_BATCH_OPTIONS, command_from
from score_batch.cli.score import HELP, RUN_BATCH_HELP, score
from score_batch.signals import Stopped

ARGS = "score_batch.args"  # ctx.meta: the command line as given
GROUP_OPTIONS = ("-h", "--help", "--version", "--install-completion", "--show-completion")


class ScoreByDefault(TyperGroup):
    """`score-batch INPUT …` means `score-batch score INPUT …`; subcommand names always win."""

    def get_params(self, ctx) -> list:
        return help_params(super().get_params(ctx))  # --version and --help shown as flags: no <bool>

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        ctx.meta[ARGS] = list(args)  # for a stop's report (report_stop), whatever parsing reaches
        first = args[0] if args else None
        if first not in self.commands and first not in GROUP_OPTIONS:
            args = ["score", *args]
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        """Run the command; every exception it raises goes through cli.error_messages' table to an exit code."""
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException, SystemExit):
            raise
        except Stopped as error:
            code = exit_code_for(error)
            # A stop before the run wrote its report: the command line (flags or environment) names it.
            report_stop(error, ctx.meta.get(ARGS, []), os.environ)
            raise typer.Exit(code) from None
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
    "4 more items failed than --max-failed-rate allows (the output is written); 1 a bug; "
    "130/143 stopped by Ctrl-C/SIGTERM (rerun with --resume).",
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
app.command("score", cls=ReportingCommand, help=HELP, context_settings=ENV)(command_from(OPTIONS, score))
app.command("run-batch", cls=ReportingCommand, help=RUN_BATCH_HELP, context_settings=ENV)(
    command_from(RUN_BATCH_OPTIONS, score, RUN_BATCH_FIXED)
)
app.command(
    "models", help="Show the supported model families, the packing each allows, and the built-in profiles."
)(models)


def run_app() -> int:
    """Run the app on sys.argv; its exit code (every exception goes through cli.error_messages' table; a stop outside
    the command, while the app's own flags are parsed, is left to cli/main.run)."""
    try:
        code = app(standalone_mode=False)  # returns the exit code of typer.Exit when not standalone
    except typer.Exit as done:
        code = done.exit_code
    except typer.Abort:
        code = 130
    except TyperException as error:  # usage errors: bad flag value, unknown flag, missing argument
        code = usage_error(error)
    return code if isinstance(code, int) else 0
