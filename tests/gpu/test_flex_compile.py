"""flex on CUDA: compiled decoder layers (--compile) score as eager and as fp32 plain HF; bounded recompiles."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.need import need_gpu

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiling")]
need_gpu()

from torch._dynamo.utils import counters  # noqa: E402

from score_batch.engine.attention.flex import bucket_tokens  # noqa: E402
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


def test_compiled_flex_scores_equal_eager_and_plain_hf(model_dir):
    groups = token_groups(1, groups=3, query=(100, 200), items=5, item=(1, 90))
    eager = scorer(model_dir, "flex").score(groups)
    compiled = scorer(model_dir, "flex", compile=True).score(groups)
    assert max_diff(compiled, eager) <= COMPILED_VS_EAGER
    assert max_diff(compiled, hf_reference(model_dir, groups)) <= BF16_VS_FP32


@pytest.mark.parametrize("compile", [False, True])
def test_flex_compiles_at_most_once_per_bucket_over_many_batch_sizes(model_dir, compile):
    torch._dynamo.reset()  # a clean count, and no earlier test's graphs near dynamo's recompile limit
    run = scorer(model_dir, "flex", compile=compile)
    sizes, buckets = set(), set()
    before = counters["stats"]["unique_graphs"]
    for k in range(6):
        groups = token_groups(
            10 + k, groups=1 + k % 3, query=(20 + 40 * k, 30 + 40 * k), items=2 + k, item=(3, 30)
        )
        plan = run.plan(groups)
        assert len(plan.batches) == 1
        sizes.add(plan.batches[0].num_tokens)
        buckets.add(bucket_tokens(plan.batches[0].num_tokens))
        run.run(plan)
    graphs = counters["stats"]["unique_graphs"] - before
    assert len(sizes) == 6 and len(buckets) >= 3
    # flex: block-mask construction and attention, each at most once per bucket; --compile adds the decoder
    # pieces (RMSNorm, MLP, attention before and after the kernel: 4, the resume graph once more when dynamic).
    assert graphs <= 2 * len(buckets) + (5 if compile else 0), (graphs, sorted(buckets))
