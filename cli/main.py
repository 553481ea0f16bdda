"""The score-batch console entry point: stop signals are handled from its first instruction, then the Typer
app (cli/app.py, imported here, where a stop is already handled) runs."""

from __future__ import annotations

import _signal

from score_batch import EARLY_STOPS as _EARLY

# From the first instruction: a stop that lands while the modules below import is remembered, then raised as
# Stopped once run() can report it (score_batch/__init__.py records one from the command's first line; the
# window before is the interpreter's own start-up). The C module installs them: signal.py's own import
# builds its enums in Python, where a stop was a KeyboardInterrupt.
for _signum in (_signal.SIGINT, _signal.SIGTERM):
    _signal.signal(_signum, lambda signum, frame: _EARLY.append(signum))

import os  # noqa: E402
import sys  # noqa: E402

from score_batch.signals import Stopped, StopSignals, exit_on_signals  # noqa: E402


def run() -> None:
    """Console entry point: the app's exit code, or 130/143 when SIGINT/SIGTERM stop it at any instant.

    From the first instruction, a signal raises Stopped (imports, flag parsing and the model load included),
    so even a run stopped in its first second ends with its --report and exit code 130/143, never a
    traceback; around that (a second signal while the stop is reported, the exit) it exits 130/143 at once.
    Lines written before the options are read (usage errors, warnings) take --log-format's format already.
    """
    exit_on_signals()  # what StopSignals restores when it ends
    try:
        with StopSignals(immediate=True) as stop:
            if _EARLY:  # a stop while this module imported
                raise Stopped(_EARLY[0])
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
