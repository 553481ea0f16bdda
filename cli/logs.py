"""Logging for the command: one handler on stderr for the project's packages, quiet libraries."""

from __future__ import annotations

import logging
import sys

PACKAGES = ("cli", "engine", "io_formats", "job", "score_batch")  # the loggers the command shows


def setup_logging(quiet: bool) -> None:
    """Log to stderr (rich when a terminal, 'score-batch: LEVEL: message' otherwise); silence library chatter."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler = RichHandler(show_path=False, show_time=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("score-batch: %(levelname)s: %(message)s"))
    for name in PACKAGES:
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(logging.ERROR if quiet else logging.INFO)
