"""SIGINT/SIGTERM as a Stopped exception: defined torch-free in score_batch.signals (the CLI installs it first)."""

from score_batch.signals import Stopped, StopSignals

__all__ = ["StopSignals", "Stopped"]
