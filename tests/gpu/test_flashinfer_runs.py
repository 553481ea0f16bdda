"""FlashInfer on CUDA: --compile (HF and native layers) scores as eager and as fp32 plain HF; a poisoned embedding row leaves every
other item's score alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.gpu.need import need_gpu

pytestmark = pytest.mark.gpu
need_gpu("flashinfer")


from tests.gpu.common import (  # noqa: E402
    BF16_VS_FP32,
    COMPILED_VS_EAGER,
    MODEL,
    hf_reference,
    max_diff,
    scorer,
    token_groups,
)


@pytest.fixture(scope="module")
def model_dir(zoo):
    return zoo.get("qwen3", "causal", **MODEL)


def test_a_poisoned_embedding_row_changes_no_other_items_score(model_dir):
    poison = 4  # a token id no other item uses (token_groups draws 5..199)
    groups = token_groups(5, groups=3, query=(150, 250), items=6, item=(60, 140))
    groups[1].items[2] = [*groups[1].items[2][:30], poison, *groups[1].items[2][30:]]
    run = scorer(model_dir, "flashinfer", layers="transformers")  # the HF model's embedding table below
    clean = run.score(groups)
    embeddings = run.model.model.get_input_embeddings().weight
    with torch.no_grad():
        saved = embeddings[poison].clone()
        embeddings[poison] = float("nan")
    try:
        poisoned = run.score(groups)
    finally:
        with torch.no_grad():
            embeddings[poison] = saved
    for g, (a, b) in enumerate(zip(clean, poisoned)):
        keep = [i for i in range(len(groups[g].items)) if (g, i) != (1, 2)]
        assert np.isfinite(b.scores[keep]).all(), g
        # A leak through a masked tile gives NaN or a large change; a re-run in another layout, bf16 noise.
        assert np.abs(a.scores[keep] - b.scores[keep]).max() <= COMPILED_VS_EAGER, g


@pytest.mark.usefixtures("compiling")
@pytest.mark.parametrize("layers", ["transformers", "native"])
def test_compiled_flashinfer_scores_equal_eager_and_plain_hf(model_dir, layers):
    groups = token_groups(2, groups=3, query=(100, 300), items=5, item=(1, 130))
    layer_ops = dict(
        layers=layers, ops="torch" if layers == "native" else "auto"
    )  # compile compiles torch ops
    eager = scorer(model_dir, "flashinfer", **layer_ops).score(groups)  # a refusal fails: both run on a GPU
    compiled = scorer(model_dir, "flashinfer", compile=True, **layer_ops).score(groups)
    assert max_diff(compiled, eager) <= COMPILED_VS_EAGER
    assert max_diff(compiled, hf_reference(model_dir, groups)) <= BF16_VS_FP32
