"""A model directory's config, read by transformers' AutoConfig (offline)."""

from __future__ import annotations

from pathlib import Path

from score_batch.engine.errors import ScoringInputError


def model_config(path: Path, trust_remote_code: bool):
    """transformers' AutoConfig of a model directory; a config it refuses is the user's to fix (exit 2)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except (ValueError, KeyError, OSError, TypeError) as error:
        raise ScoringInputError(f"cannot read the config of {str(path)!r}: {error}") from error
