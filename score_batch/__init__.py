"""score-batch's own namespace: the version and the error classes shared by engine, io_formats and job."""

from importlib import metadata

try:
    __version__ = metadata.version("score-batch")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
