"""score-batch's public namespace: the version, the error classes, and the Python API (`Scorer`, `Group`,
`GroupResult`, `demo_model_path`).

The checkout's cli/, engine/, io_formats/ and job/ are its subpackages (score_batch.engine, ...), so a user's
own `engine/` or `job/` folder beside their script cannot shadow them.
"""

from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(_HERE)
_IN_CHECKOUT = not os.path.isdir(os.path.join(_HERE, "engine")) and os.path.isfile(
    os.path.join(_CHECKOUT, "engine", "__init__.py")
)
if _IN_CHECKOUT:  # a source checkout or an editable install: the subpackages sit beside this folder
    __path__.append(_CHECKOUT)  # noqa: F821 - a package's __path__ is defined by the import system


def _version() -> str:
    """A checkout's pyproject.toml version (an editable install's metadata keeps its install's), else the
    installed package's: the version is in every score key and run identity."""
    import re

    try:
        with open(os.path.join(_CHECKOUT, "pyproject.toml"), encoding="utf-8") as handle:
            text = handle.read() if _IN_CHECKOUT else ""
    except OSError:
        text = ""
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[)", text + "\n[", re.M | re.S)
    version = project and re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.M)
    if version:
        return version.group(1)
    from importlib import metadata  # imported here: it costs 50 ms (email, socket)

    try:
        return metadata.version("score-batch")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+source"


__all__ = ["Group", "GroupResult", "Scorer", "__version__", "demo_model_path"]


def demo_model_path() -> str:
    """The bundled demo model's directory (package data of score_batch.cli): a tiny Qwen3 yes/no product-search
    scorer trained by scripts/."""
    from importlib import resources

    return str(resources.files("score_batch.cli") / "demo_model")


def __getattr__(name: str):
    """The version and the Python API on first use: importing score_batch costs nothing."""
    if name == "__version__":
        globals()["__version__"] = version = _version()
        return version
    if name == "Scorer":
        from score_batch.engine.scorer import Scorer

        return Scorer
    if name in ("Group", "GroupResult"):  # Scorer.score's argument and result (engine/types.py, torch-free)
        from score_batch.engine import types

        return getattr(types, name)
    raise AttributeError(f"module 'score_batch' has no attribute {name!r}")
