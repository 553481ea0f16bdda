"""The fused q/k-norm + RoPE Triton kernel (engine/native/fused_qk.py), run by Triton's interpreter on the CPU
(TRITON_INTERPRET=1, set before triton is imported: the test runs in a child process): equal to TorchOps' norms
and RoPE, in place in the QKV output (q, k stay its views, v untouched), with restarted item positions."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = r"""
import torch
from score_batch.engine.native import fused_qk
from score_batch.engine.native.ops import TorchOps

torch.manual_seed(0)
d, heads, kv_heads = 64, 4, 2
positions = torch.tensor([0, 1, 2, 3, 4, 2, 3, 4, 2, 3])  # a query, then items restarting after it
tokens = positions.shape[0]
inv_freq = 1.0 / (1e4 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
angles = torch.arange(8, dtype=torch.float32)[:, None] * inv_freq
cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)  # [positions, d] float32
worst = {}
# float32: the same arithmetic (sums in another order); bfloat16: TorchOps rounds after each step, the kernel once
for dtype, bound in ((torch.float32, dict(rtol=1e-6, atol=2e-6)), (torch.bfloat16, dict(rtol=2e-2, atol=2e-2))):
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d).to(dtype)
    weights = (torch.rand(2, d) + 0.5).to(dtype)
    for norms in ((weights[0], weights[1], 1e-6), None):
        reference = TorchOps()
        q, k, v = qkv.clone().split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        want = reference.qk_norm_rope(reference.rope_tables(positions, cos_sin, dtype), q, k, norms, d)
        buffer = qkv.clone()
        q, k, v = buffer.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        assert fused_qk.fusable(q, k, d) and not fused_qk.fusable(k, q, d)
        fused_qk.qk_norm_rope(q, k, positions, cos_sin, norms, d)
        assert torch.equal(v, qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)[2])  # v untouched
        for a, b in zip((q, k), want):
            torch.testing.assert_close(a, b, **bound)
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip((q, k), want))
        worst[(str(dtype), norms is not None)] = diff
print(worst)

# FlashInferOps takes the fused kernel (its other kernels stood in for by tests/flashinfer_stub.py): the load-time
# proof passes on it, and a native Qwen3 forward equals TorchOps' in bf16
import pytest
from score_batch.engine.model.proof import prove_ops
from score_batch.engine.native.ops import FlashInferOps
from tests.flashinfer_stub import FlashInferStub

patch = pytest.MonkeyPatch()
stub = FlashInferStub().install(patch)
assert FlashInferOps()._fused is fused_qk
assert prove_ops("flashinfer", torch.device("cpu"), torch.bfloat16, hidden_size=128, head_dim=64) is None
# the proof's own check of RMSNorm on q heads only: qk_norm_rope's q and k norms ran in the fused kernel
assert [s for _, s, _ in stub.norm_inputs if len(s) == 3] == [(5, 2, 64)]
patch.undo()
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="needs triton (its interpreter runs on the CPU)"
)
def test_the_fused_kernel_equals_torch_norms_and_rope_in_place():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    print(done.stdout)
