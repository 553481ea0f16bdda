"""The process-wide settings a test may change (tests/conftest.py checks each test leaves them as it found them;
an in-process command run, tests/test_cli.run_cli, puts back what the command sets for its process)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Iterator

# pytest names the test and phase running; ray.init sets RAY_CLIENT_MODE for the process (later inits read it);
# torch's inductor sets its cache directory on first use, once per process; so do polars (its allocator's
# _RJEM_MALLOC_CONF) and sentence-transformers (Intel OpenMP's KMP_*) at their first import
UNCHECKED_ENVIRONMENT = (
    "PYTEST_CURRENT_TEST",
    "RAY_CLIENT_MODE",
    "TORCHINDUCTOR_CACHE_DIR",
    "_RJEM_MALLOC_CONF",
    "KMP_INIT_AT_FORK",
    "KMP_DUPLICATE_LIB_OK",
)


def _handlers() -> dict[int, object]:
    """Every signal's Python-level handler (None: one installed outside Python, which cannot be put back)."""
    handlers = {}
    for signum in signal.valid_signals():
        try:
            handlers[signum] = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
    return handlers


def settings() -> dict[str, object]:
    """The settings now, by name."""
    log = logging.getLogger("score_batch")
    environment = {key: value for key, value in os.environ.items() if key not in UNCHECKED_ENVIRONMENT}
    return {
        "recursion limit": sys.getrecursionlimit(),
        "switch interval": sys.getswitchinterval(),
        "gc thresholds": gc.get_threshold(),
        "gc enabled": gc.isenabled(),
        "gc frozen objects": gc.get_freeze_count() > 0,
        "signal handlers": _handlers(),
        "unraisable hook": sys.unraisablehook,
        "environment": environment,
        "working directory": os.getcwd(),
        "score_batch logger": (log.level, tuple(log.handlers), log.propagate, log.disabled),
    }


def changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """The settings that differ, each with what changed."""
    said = []
    for name, value in before.items():
        now = after[name]
        if now == value:
            continue
        if isinstance(value, dict):
            keys = sorted({*value, *now}, key=str)
            value = {key: value.get(key) for key in keys if value.get(key) != now.get(key)}
            now = {key: now.get(key) for key in value}
        said.append(f"{name}: {value!r} -> {now!r}")
    return said


def restore(saved: dict[str, object]) -> None:
    """Put every setting back as saved."""
    sys.setrecursionlimit(saved["recursion limit"])
    sys.setswitchinterval(saved["switch interval"])
    gc.set_threshold(*saved["gc thresholds"])
    (gc.enable if saved["gc enabled"] else gc.disable)()
    if not saved["gc frozen objects"]:
        gc.unfreeze()
    for signum, handler in saved["signal handlers"].items():
        if handler is not None and signal.getsignal(signum) != handler:
            signal.signal(signum, handler)
    sys.unraisablehook = saved["unraisable hook"]
    environment = saved["environment"]
    for key in [key for key in os.environ if key not in environment and key not in UNCHECKED_ENVIRONMENT]:
        del os.environ[key]
    os.environ.update(environment)
    os.chdir(saved["working directory"])
    log = logging.getLogger("score_batch")
    log.level, handlers, log.propagate, log.disabled = saved["score_batch logger"]
    log.handlers[:] = handlers
    logging.Logger.manager._clear_cache()  # levels are cached per logger


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Run a block, then put every setting back as it was (what an in-process command sets for its process)."""
    saved = settings()
    try:
        yield
    finally:
        restore(saved)
