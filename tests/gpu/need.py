"""Skip a GPU test module without CUDA or a package, or fail instead when SCORE_BATCH_REQUIRE_GPU=1."""

from __future__ import annotations

import os

import pytest
import torch

from score_batch.engine.attention.registry import import_failure

REQUIRE_GPU = "SCORE_BATCH_REQUIRE_GPU"


def need_gpu(*modules: str) -> None:
    """At module level: skip when CUDA or a module is missing; under SCORE_BATCH_REQUIRE_GPU=1 fail instead."""
    problems = [] if torch.cuda.is_available() else ["CUDA is not available"]
    problems += [f"{m} is not importable ({failure})" for m in modules if (failure := import_failure(m))]
    if not problems:
        return
    if os.environ.get(REQUIRE_GPU) == "1":
        pytest.fail(f"{REQUIRE_GPU}=1 but " + "; ".join(problems), pytrace=False)
    pytest.skip("; ".join(problems), allow_module_level=True)
