"""Logging for the command: one handler on stderr for the project's loggers, quiet libraries; the lines the
CLI writes itself (errors, the summary) in the same format."""

from __future__ import annotations

import json
import logging
import os
import sys

from score_batch.choices import LogFormat

ROOT_LOGGER = "score_batch"  # every module logs under score_batch.*
FORMAT_VARIABLE = "SCORE_BATCH_LOG_FORMAT"  # --log-format's environment variable (cli/main.py's prefix)
_format: list[LogFormat] = ["text"]  # this process's stderr format, set by setup_logging


class JsonLines(logging.Formatter):
    """One JSON object per log record: time, level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def requested_format(args: list[str], environ) -> LogFormat:
    """--log-format as the command line (or its environment variable) gives it, read before click parses the
    options, so that lines written before then (a usage error) take the format too; text unless json."""
    value = flag_value(args, "--log-format")
    if value is None:
        value = environ.get(FORMAT_VARIABLE)
    return "json" if value == "json" else "text"


def flag_value(args: list[str], flag: str) -> str | None:
    """The value given to a flag (`--report r.json` or `--report=r.json`; the last wins), or None."""
    value = None
    for number, arg in enumerate(args):
        if arg == "--":
            break
        if arg == flag and number + 1 < len(args):
            value = args[number + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def say(message: str, level: str | None = "error") -> None:
    """A line the CLI writes itself: 'score-batch: error: message' (no level: 'score-batch: message'), or
    under --log-format json one JSON object as the log lines are."""
    if _format[0] == "json":
        levelno = logging.getLevelName((level or "info").upper())
        record = logging.LogRecord("score_batch.cli", levelno, "", 0, message, None, None)
        line = JsonLines().format(record)
    else:
        line = f"score-batch: {level}: {message}" if level else f"score-batch: {message}"
    print(line, file=sys.stderr, flush=True)


def setup_logging(quiet: bool, log_format: LogFormat = "text") -> None:
    """Log to stderr: rich on a terminal, else 'score-batch: LEVEL: message' lines or JSON lines.

    quiet drops progress and summaries (INFO) only: warnings, such as the count of skipped or failed
    rows, and errors still show. Under json, Python warnings (torch's, …) become JSON lines too.
    """
    _format[0] = log_format
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLines())
        logging.getLogger("py.warnings").handlers = [handler]
        logging.getLogger("py.warnings").propagate = False
    elif sys.stderr.isatty():
        from rich.logging import RichHandler

        handler = RichHandler(show_path=False, show_time=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("score-batch: %(levelname)s: %(message)s"))
    logging.captureWarnings(log_format == "json")
    logger = logging.getLogger(ROOT_LOGGER)
    logger.handlers = [handler]
    logger.setLevel(logging.WARNING if quiet else logging.INFO)


def quiet_libraries() -> None:
    """Silence transformers' own warnings and progress bars; where it is not imported yet (a native decoder's
    run never imports it), through the environment variables it and huggingface_hub read when they are."""
    if "transformers" in sys.modules:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        return
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    if "huggingface_hub" in sys.modules:  # its settings were read at its import
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    else:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
