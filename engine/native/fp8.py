"""FP8 GEMMs of the decoder layers: weights quantized once to float8_e4m3fn with a scale per output channel,
activations per token at each call; torch._scaled_mm on the GPU (rowwise scales, Hopper and later), and on the
CPU an emulation with the same scales: the float8 round-trip of both operands, then an fp32 matmul
(fp32 accumulation), the result in the activations' dtype. Only the layers' linear projections are quantized:
the embeddings, the norms, the head and the pooled vectors keep the run's dtype (bench/fp8_agreement.py measures
the ranking this keeps; docs/semantics.md, FP8)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from score_batch.engine.errors import SettingError

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
TINY = 1e-12  # an all-zero row's amax: its scale stays finite, its values 0


Fp8Mode = Literal["none", "scaled_mm", "emulated"]


def resolve_dtype(asked: str, device: torch.device) -> tuple[torch.dtype, Fp8Mode]:
    """EngineConfig.dtype on a device → (the activations' dtype, the layers' GEMMs): auto is bf16 on CUDA and
    float32 on the CPU; fp8 is bf16 with torch._scaled_mm GEMMs on a Hopper-or-later GPU only; fp8-emulated is
    bf16 with this module's emulation anywhere (for benchmarks and checks: slower than bf16)."""
    if asked == "auto":
        return (torch.bfloat16 if device.type == "cuda" else torch.float32), "none"
    if asked == "fp8-emulated":
        return torch.bfloat16, "emulated"
    if asked != "fp8":
        return getattr(torch, asked), "none"
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        where = (
            "the CPU"
            if device.type != "cuda"
            else f"compute capability {torch.cuda.get_device_capability(device)}"
        )
        raise SettingError(
            "EngineConfig.dtype",
            asked,
            f"needs a GPU of compute capability 9.0 or later (Hopper), not {where}; "
            "EngineConfig.dtype='fp8-emulated' runs the same quantization emulated (for benchmarks)",
        )
    return torch.bfloat16, "scaled_mm"


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, cols] → (float8 [rows, cols], scale [rows, 1] float32): x ≈ q · scale, a scale per row."""
    scale = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=TINY) / FP8_MAX  # [rows, 1]
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class Fp8Linear(nn.Module):
    """y = x Wᵀ + b with W in float8 (a scale per output channel) and x quantized per token at each call."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, emulate: bool, keep: bool = False
    ) -> None:
        super().__init__()
        q, scale = quantize(weight)  # [out, in] float8, [out, 1]
        self.emulate = emulate
        # keep: the unquantized weight too, for the reference path (engine/run/verify.py sets use_reference)
        self.reference_weight = weight.detach() if keep else None
        self.use_reference = False
        self.register_buffer("weight_fp8", q)
        self.register_buffer("weight_scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        # the emulation's dequantized weight, made once: the same values every call would make
        self._dequantized = (q.float() * scale) if emulate else None  # [out, in] float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., in_features] → [..., out_features] in x's dtype."""
        if self.use_reference:
            return nn.functional.linear(x, self.reference_weight, self.bias)
        rows = x.reshape(-1, x.shape[-1])  # [tokens, in]
        q, scale = quantize(rows)  # [tokens, in] float8, [tokens, 1]
        if self.emulate:
            y = (q.float() * scale) @ self._dequantized.T  # [tokens, out] fp32 accumulation
            y = y.to(x.dtype)
        else:
            y = torch._scaled_mm(
                q, self.weight_fp8.T, scale_a=scale, scale_b=self.weight_scale.T, out_dtype=x.dtype
            )  # [tokens, out]; the weight's transpose is column-major, as _scaled_mm takes it
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


def quantize_linears(backbone: nn.Module, emulate: bool, keep: bool = False) -> int:
    """Replace every linear projection under backbone (the decoder layers: ours or transformers' nn.Linear)
    with an Fp8Linear of its weight, in place (keep: each keeps its unquantized weight); the count replaced."""
    from score_batch.engine.native.layers import Linear

    replaced = 0
    for module in list(backbone.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, (Linear, nn.Linear)):
                setattr(module, name, Fp8Linear(child.weight.data, child.bias, emulate, keep))
                replaced += 1
    return replaced
