"""FlashInfer proven on the device: each kernel runs once on a tiny input against torch (engine/model/setup.py's
load_planner(prove=True) runs this at load, and falls back or fails on the cause).

`import flashinfer` succeeds without nvcc; its kernels are built by a JIT at their first call, which then
raises ("Could not find nvcc", "Ninja build failed") after the model has loaded, and FlashInfer's
functools.cache does not remember the failure. So when a resolved setup names FlashInfer (the native
layers' ops, or the attention backend), the load runs each of those kernels once on a tiny input of the
model's widths against the torch reference in the same dtype, device synchronized, before weights load."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from score_batch.engine.attention.registry import make_backend
from score_batch.engine.attention.sdpa import SdpaBackend
from score_batch.engine.native.ops import Ops, TorchOps, make_ops
from score_batch.engine.plan.batching import collate
from score_batch.engine.plan.packing import DELIMITER_SEGMENT, ItemRef, mis_pack, single_pack

log = logging.getLogger(__name__)

# Largest |kernel − torch| on the proof's inputs. Ops: two roundings of the same float32 arithmetic to the dtype
# (relative and absolute, as tests/gpu/test_native_ops.py allows for bf16). Attention: the 16-bit kernel against
# float32 sdpa on the same 16-bit inputs (tests/gpu/test_flashinfer.py's bf16 bound); a key the multi-item mask
# should hide moves an output row of the proof's ≤ 20 keys by ~0.1 or more.
OPS_BOUNDS = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
ATTENTION_BOUNDS = {torch.bfloat16: 3e-2, torch.float16: 5e-3}
EXACT = 1e-5  # any other dtype (FlashInfer refuses them at setup; CPU tests of fake kernels use it)


def prove_ops(
    name: str, device: torch.device, dtype: torch.dtype, hidden_size: int, head_dim: int
) -> str | None:
    """Run each kernel of the named ops once as the native layers call them against TorchOps (the device
    synchronized): the cause of the first exception or difference beyond OPS_BOUNDS, with the kernel's name;
    None when all agree."""
    bound = OPS_BOUNDS.get(dtype, EXACT)
    checks = _ops_checks(device, dtype, hidden_size, head_dim)
    try:
        kernels = make_ops(name, device)
    except Exception as error:  # a broken install raises more than ImportError
        return f"{name} ops: {describe(error)}"
    reference = TorchOps()
    for check, run in checks.items():
        try:
            got = run(kernels)
            _sync(device)
        except Exception as error:  # the JIT build of the kernel's module fails at its first call
            return f"{check}: {describe(error)}"
        cause = _mismatch(got, run(reference), bound, dtype, "torch's")
        if cause is not None:
            return f"{check} {cause}"
    return None


def _ops_checks(
    device: torch.device, dtype: torch.dtype, hidden_size: int, head_dim: int
) -> dict[str, Callable]:
    """Each kernel called as the native layers call it (RMSNorm of rows and of strided q/k heads, fused
    add + RMSNorm, RoPE on strided q/k views, the q/k norms + RoPE in place on them, SiLU·mul), by name."""
    generator = torch.Generator().manual_seed(0)
    tokens, heads, kv_heads = 5, 2, 1

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    weight = (torch.rand(hidden_size, generator=generator) + 0.5).to(device=device, dtype=dtype)
    x, residual = randn(tokens, hidden_size), randn(tokens, hidden_size)
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim)  # a fused projection's output
    positions = torch.tensor([0, 1, 2, 2, 3], device=device)  # restarted item positions, as packs give
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.arange(8, dtype=torch.float32)[:, None] * inv_freq  # [positions, head_dim // 2]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)  # [positions, head_dim] float32

    def q_heads(kernel: Ops) -> torch.Tensor:
        q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)  # strided view, as the q norm reads it
        return kernel.rms_norm(q, weight[:head_dim], 1e-6)

    def rope(kernel: Ops) -> torch.Tensor:
        q, k, _ = qkv.clone().split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        kernel.rope(kernel.rope_tables(positions, cos_sin, dtype), q, k, head_dim)
        return torch.cat([q, k], dim=-1)

    def qk_norm_rope(kernel: Ops) -> torch.Tensor:
        q, k, _ = qkv.clone().split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        norms = (weight[:head_dim], weight[head_dim : 2 * head_dim], 1e-6)  # q/k norms, in place where fused
        tables = kernel.rope_tables(positions, cos_sin, dtype)
        return torch.cat(kernel.qk_norm_rope(tables, q, k, norms, head_dim), dim=-1)

    return {
        "rms_norm": lambda kernel: kernel.rms_norm(x, weight, 1e-6),
        "rms_norm of q/k heads": q_heads,
        "add_rms_norm": lambda kernel: torch.cat(
            kernel.add_rms_norm(x.clone(), residual.clone(), weight, 1e-6)
        ),
        "rope": rope,
        "q/k norms + rope on strided views": qk_norm_rope,
        "silu_mul": lambda kernel: kernel.silu_mul(torch.cat([x, residual], dim=-1)),
    }


def prove_attention(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Run the named backend once on a tiny batch (a multi-item pack of three items and a plain pack, GQA) against
    float32 sdpa on the same inputs; the device is synchronized. The cause of an exception or of a difference
    beyond ATTENTION_BOUNDS on the rows that are read (delimiter rows are not), or None."""
    bound = ATTENTION_BOUNDS.get(dtype, EXACT)
    query, items = list(range(1, 8)), [[11, 12, 13], [14], [15, 16, 17, 18, 19]]
    packed = mis_pack(query, items, [ItemRef(0, i) for i in range(len(items))], 99)
    batch = collate([packed, single_pack(list(range(20, 26)), ItemRef(1, 0))])
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, heads, batch.num_tokens, head_dim, generator=generator).to(device=device, dtype=dtype)
        for heads in (4, 2, 2)
    )  # [1, heads, tokens, head_dim]
    scaling = head_dim**-0.5
    try:
        got = make_backend(name, device).plan(batch, device).attend(q, k, v, scaling, None)
        _sync(device)
    except Exception as error:  # the JIT build of the prefill module fails at the first plan or run
        return f"{name} attention: {describe(error)}"
    want = SdpaBackend(device).plan(batch, device).attend(q.float(), k.float(), v.float(), scaling, None)
    rows = torch.from_numpy(batch.segments != DELIMITER_SEGMENT).to(device)
    cause = _mismatch(got[:, rows], want[:, rows], bound, dtype, "float32 sdpa's", relative=False)
    return None if cause is None else f"{name} attention {cause}"


def faster(
    names: list[str], device: torch.device, dtype: torch.dtype, head_dim: int, repeats: int = 5
) -> tuple[str, dict[str, float]]:
    """The fastest of proven backends on one goal-shape pack (a 1,500-token query and 100 items of 40 tokens,
    16 query and 8 K/V heads): (its name, each one's seconds per layer call, CUDA events, after a warm-up)."""
    items = [[11] * 40 for _ in range(100)]
    batch = collate([mis_pack(list(range(1, 1501)), items, [ItemRef(0, i) for i in range(100)], 99)])
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, heads, batch.num_tokens, head_dim, generator=generator).to(device=device, dtype=dtype)
        for heads in (16, 8, 8)
    )  # [1, heads, tokens, head_dim]
    seconds = {}
    for name in names:
        plan = make_backend(name, device).plan(batch, device)
        plan.attend(q, k, v, head_dim**-0.5, None)  # plans the kernels
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for layer in range(repeats):
            plan.attend(q, k, v, head_dim**-0.5, None, layer=layer)
        end.record()
        end.synchronize()
        seconds[name] = start.elapsed_time(end) / 1e3 / repeats
    return min(seconds, key=seconds.get), seconds


def _mismatch(
    got: torch.Tensor,
    want: torch.Tensor,
    bound: float,
    dtype: torch.dtype,
    against: str,
    relative: bool = True,
) -> str | None:
    """How got differs from want beyond bound (absolute, plus relative to |want| when relative), or None."""
    if not torch.isfinite(got).all():
        return f"gives non-finite values where {against} are finite"
    difference = (got.float() - want.float()).abs()
    allowed = bound * (1 + want.float().abs()) if relative else bound
    if (difference > allowed).any():
        name = str(dtype).removeprefix("torch.")
        return f"differs from {against} by up to {difference.max().item():.3g} (bound {bound:g} in {name})"
    return None


def describe(error: BaseException, limit: int = 400) -> str:
    """An error's type, first line and last line (a compiler's output runs to pages; its error comes last)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = type(error).__name__ + (f": {lines[0]}" if lines else "")
    if len(lines) > 1:
        text += f" … {lines[-1]}"
    return text if len(text) <= limit else text[: limit // 2] + " … " + text[-limit // 2 :]


def _sync(device: torch.device) -> None:
    """Wait for the device: a kernel's launch error surfaces here, not in a later batch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
