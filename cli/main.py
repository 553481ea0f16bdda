"""The score-batch console entry point: run() handles stop signals from its first instruction
(score_batch/signals.py), then runs the Typer app (cli/app.py, imported there). Before it, while Python imports
this package, a stop ends as Python ends it (SIGTERM the process, SIGINT a KeyboardInterrupt): 143 or 130."""

from __future__ import annotations

import os
import sys

from score_batch.signals import Stopped, StopSignals, exit_on_signals


def run() -> None:
    """Console entry point: the app's exit code, or 130/143 when SIGINT/SIGTERM stop it at any instant.

    From its first instruction a signal raises Stopped (flag parsing and the model load included; one landing
    inside an import once the import is done), so a run stopped in its first second ends with its --report
    and exit code 130/143, never a traceback; around that (a second signal while the stop is reported, the
    exit) it exits 130/143 at once.
    Lines written before the options are read (usage errors, warnings) take --log-format's format already.
    """
    exit_on_signals()  # what StopSignals restores when it ends
    try:
        with StopSignals(immediate=True) as stop:
            from score_batch.cli.logs import requested_format, setup_logging

            if requested_format(sys.argv[1:], os.environ) == "json":  # lines before the options are read too
                setup_logging(quiet=True, log_format="json")  # (text needs no handler yet, nor rich's import)
            from score_batch.cli.app import run_app

            code = run_app()
            if code == 0:
                stop.check()  # a stop Python could not raise after the run's last check: still 130/143
    except Stopped as stopped:
        code = _stopped(stopped)
    sys.exit(code)


def _stopped(stopped: Stopped) -> int:
    """Say that the run stopped, write --report when no part of the run wrote it yet; the exit code."""
    try:
        from score_batch.cli.command import report_stop
        from score_batch.cli.error_messages import exit_code_for

        code = exit_code_for(stopped)
        report_stop(stopped, sys.argv[1:], os.environ)
        return code
    except (Exception, Stopped) as error:  # noqa: BLE001 - a module the stop interrupted may not import again
        print(f"score-batch: stopped by {stopped} (no report: {error})", file=sys.stderr)
        return 128 + stopped.signum


def __getattr__(name: str):
    """`app` from cli/app.py, imported on first use."""
    if name == "app":
        from score_batch.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    run()
