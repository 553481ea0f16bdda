"""FP8 GEMMs on CUDA (engine/native/fp8.py): torch._scaled_mm with rowwise scales matches the CPU emulation
(the same scales and float8 values; the kernel rounds its output to bf16 once)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.need import need_gpu

pytestmark = pytest.mark.gpu
need_gpu()

from score_batch.engine.native.fp8 import Fp8Linear  # noqa: E402


def test_scaled_mm_matches_the_emulation():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("rowwise-scaled FP8 GEMMs need Hopper or later")
    generator = torch.Generator().manual_seed(2)
    w, x = torch.randn(256, 128, generator=generator) * 0.02, torch.randn(64, 128, generator=generator)
    x = x.to("cuda", torch.bfloat16)
    emulated = Fp8Linear(w.cuda(), None, emulate=True)(x).float()
    kernel = Fp8Linear(w.cuda(), None, emulate=False)(x).float()
    assert (kernel - emulated).abs().max() <= 2.0**-7 * emulated.abs().max()  # bf16 output rounding
