"""Kernels alone at the goal shape for bench/gpu_profile.py: multi-item attention (FA2, FA3) over a batch's packs,
and a decoder layer's four GEMMs in bf16 and FP8 (torch._scaled_mm, rowwise scales): time and TFLOP/s."""

from __future__ import annotations

import time

import torch
from flops import pack_pairs

FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def device_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of fn() on its device: CUDA events around each call, the host clock on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    cuda = torch.cuda.is_available()
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
    return sorted(times)[len(times) // 2]


def layer_gemms(cfg: dict, tokens: int) -> dict[str, tuple[int, int, int]]:
    """(M, K, N) of one decoder layer's four GEMMs on `tokens` rows: QKV, O, gate-up, down."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv, inter = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d, cfg["intermediate_size"]
    return {
        "qkv": (tokens, h, q + 2 * kv),
        "o": (tokens, q, h),
        "gate_up": (tokens, h, 2 * inter),
        "down": (tokens, inter, h),
    }


def rowwise_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in float8_e4m3fn, float32 scale per row [rows, 1]) with x ≈ fp8 · scale."""
    scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX  # [rows, 1]
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def gemm_row(m: int, k: int, n: int, device, repeats: int) -> dict:
    """One GEMM [m, k] × [k, n]: bf16 (F.linear) and FP8 rowwise (activations per token, weights per output
    channel) in ms and TFLOP/s; the FP8 output's error relative to bf16's; the activation's quantization alone."""
    flops = 2.0 * m * k * n
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)  # [m, k]
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5  # [n, k], as nn.Linear stores it
    ms = device_ms(lambda: torch.nn.functional.linear(x, w), repeats)
    row = {"m": m, "k": k, "n": n, "bf16_ms": round(ms, 4), "bf16_tflops": round(flops / ms / 1e9, 1)}
    try:
        x8, sx = rowwise_fp8(x)  # [m, k], [m, 1]
        w8, sw = rowwise_fp8(w)  # [n, k], [n, 1]: per output channel
        scale_b = sw.t().contiguous()  # [1, n]; w8.t() is [k, n] column-major, as _scaled_mm wants mat2

        def fp8():
            return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=scale_b, out_dtype=torch.bfloat16)

        ms8 = device_ms(fp8, repeats)
        reference = torch.nn.functional.linear(x, w).float()
        error = float((fp8().float() - reference).norm() / reference.norm())
        quant = device_ms(lambda: rowwise_fp8(x), repeats)
        row.update(
            fp8_ms=round(ms8, 4),
            fp8_tflops=round(flops / ms8 / 1e9, 1),
            fp8_speedup=round(ms / ms8, 2),
            fp8_relative_error=round(error, 4),
            activation_quant_ms=round(quant, 4),
        )
    except Exception as error:  # no FP8 on this device or torch: the bf16 figures stand
        row["fp8_refused"] = (
            f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
        )
    return row


def gemms(cfg: dict, tokens: int, device, repeats: int = 20) -> dict:
    """The four GEMMs of one layer at `tokens` rows, and their sums (ms, TFLOP/s) per layer and per forward."""
    tokens -= tokens % 16  # torch._scaled_mm wants dimensions divisible by 16
    rows = {name: gemm_row(*shape, device, repeats) for name, shape in layer_gemms(cfg, tokens).items()}
    layers = cfg["num_hidden_layers"]
    total = {"tokens": tokens}
    for kind in ("bf16", "fp8"):
        if all(f"{kind}_ms" in r for r in rows.values()):
            ms = sum(r[f"{kind}_ms"] for r in rows.values())
            flops = sum(2.0 * r["m"] * r["k"] * r["n"] for r in rows.values())
            total.update({f"{kind}_layer_ms": round(ms, 3), f"{kind}_forward_ms": round(ms * layers, 2),
                          f"{kind}_tflops": round(flops / ms / 1e9, 1)})  # fmt: skip
    return {"gemms": rows, "total": total}


def attention_inputs(batch, cfg: dict, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q, k, v of a batch in the layouts the native layers hand to attention: [1, heads, tokens, d] views
    of token-major buffers (k and v with equal strides, as FlashInfer's paged run wants them)."""
    n, d = batch.num_tokens, cfg["head_dim"]
    q = torch.randn(n, cfg["num_attention_heads"], d, device=device, dtype=torch.bfloat16)
    kv = torch.randn(n, 2, cfg["num_key_value_heads"], d, device=device, dtype=torch.bfloat16)
    k, v = (kv[:, i].transpose(0, 1).unsqueeze(0) for i in range(2))  # [1, kv_heads, tokens, d]
    return q.transpose(0, 1).unsqueeze(0), k, v  # [1, heads, tokens, d]


def attention_backend(kernel: str, device):
    """The attention backend of a kernel name: fa2 / fa3 (FlashInfer's multi-item prefill) or a registered one."""
    if kernel in ("fa2", "fa3"):
        from score_batch.engine.attention.flashinfer import FlashInferBackend

        return FlashInferBackend(device, kernel=kernel)
    from score_batch.engine.attention.registry import make_backend

    return make_backend(kernel, device)


def attention_row(batch, cfg: dict, kernel: str, device, repeats: int = 20) -> dict:
    """One layer's attention over a batch's packs with one kernel: ms, TFLOP/s on the attended pairs, and ms per
    pack and per forward (× layers)."""
    q, k, v = attention_inputs(batch, cfg, device)
    plan = attention_backend(kernel, device).plan(batch, device)
    plan.attend(q, k, v, None, None)  # plans the wrapper (host work), as a forward's first layer does
    ms = device_ms(lambda: plan.attend(q, k, v, None, None), repeats)
    pairs = sum(pack_pairs(p.segments) for p in batch.packs)
    flops = 4.0 * cfg["head_dim"] * cfg["num_attention_heads"] * pairs
    packs = len(batch.packs)
    return {
        "packs": packs,
        "tokens": batch.num_tokens,
        "attended_pairs": pairs,
        "ms": round(ms, 4),
        "tflops": round(flops / ms / 1e9, 1),
        "ms_per_pack": round(ms / packs, 4),
        "forward_ms_per_pack": round(ms * cfg["num_hidden_layers"] / packs, 3),
    }
