"""Logging for the command: one handler on stderr for the project's packages, quiet libraries."""

from __future__ import annotations

import json
import logging
import sys

import typer

LOG_FORMATS = ("text", "json")
PACKAGES = ("score_batch",)  # the logger root the command shows: every module logs under score_batch.*


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


def setup_logging(quiet: bool, log_format: str = "text") -> None:
    """Log to stderr: rich on a terminal, else 'score-batch: LEVEL: message' lines or JSON lines."""
    if log_format not in LOG_FORMATS:
        raise typer.BadParameter(
            f"{log_format!r} is not one of {', '.join(LOG_FORMATS)}", param_hint="--log-format"
        )
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    handler: logging.Handler
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLines())
    elif sys.stderr.isatty():
        from rich.logging import RichHandler

        handler = RichHandler(show_path=False, show_time=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("score-batch: %(levelname)s: %(message)s"))
    for name in PACKAGES:
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(logging.ERROR if quiet else logging.INFO)
