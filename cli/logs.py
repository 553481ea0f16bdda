"""Logging for the command: one handler on stderr for the project's loggers, quiet libraries."""

from __future__ import annotations

import json
import logging
import sys

from score_batch.cli.options import LogFormat

ROOT_LOGGER = "score_batch"  # every module logs under score_batch.*


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


def setup_logging(quiet: bool, log_format: LogFormat = "text") -> None:
    """Log to stderr: rich on a terminal, else 'score-batch: LEVEL: message' lines or JSON lines.

    quiet drops progress and summaries (INFO) only: warnings, such as the count of skipped or failed
    rows, and errors still show.
    """
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
    logger = logging.getLogger(ROOT_LOGGER)
    logger.handlers = [handler]
    logger.setLevel(logging.WARNING if quiet else logging.INFO)


def quiet_libraries() -> None:
    """Silence transformers' own warnings and progress bars (imported here: only a run needs it)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
