"""Where the bundled demo model lives (package data of score_batch.cli)."""

from __future__ import annotations

from importlib import resources


def demo_model_path() -> str:
    """The bundled demo model's directory: a tiny Qwen3 yes/no product-search scorer trained by scripts/."""
    return str(resources.files("score_batch.cli") / "demo_model")
