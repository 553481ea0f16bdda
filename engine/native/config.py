"""A model directory's config, read by transformers' AutoConfig (offline)."""

from __future__ import annotations

from pathlib import Path

from score_batch.engine.errors import ScoringInputError


def model_config(path: Path, trust_remote_code: bool):
    """transformers' AutoConfig of a model directory; a config it refuses is the user's to fix (exit 2)."""
    from huggingface_hub.errors import StrictDataclassError  # transformers' strict config checks
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    # AttributeError: a value of another JSON type than transformers takes (an id2label list)
    except (ValueError, KeyError, OSError, TypeError, AttributeError, StrictDataclassError) as error:
        said = " ".join(str(error).split())  # one line (a strict check's message spans several)
        raise ScoringInputError(f"cannot read the config of {str(path)!r}: {said}") from error
