"""Rotary position embeddings: the frequencies transformers computes for a config, as a cos/sin cache by position.

The cache is float32 [positions, head_dim]: cos of each frequency in the first half, sin in the second
(FlashInfer's `cos_sin_cache` layout), already multiplied by the RoPE kind's attention scaling (YaRN).
Its values are transformers' own: position * inv_freq in float32, then cos/sin, then the scaling.
"""

from __future__ import annotations

import torch


def inverse_frequencies(config, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim // 2] float32, attention scaling) of a config, as transformers' rotary module computes them."""
    from score_batch.engine.native.spec import rope_type

    kind = rope_type(config)
    if kind == "default":
        parameters = getattr(config, "rope_parameters", None) or {}
        base = parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
        return 1.0 / (base**exponents), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config, None)
    return inv_freq.float(), float(scaling)


class RopeCache:
    """cos/sin rows by position, grown on the host's knowledge of the largest position (no device sync)."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float, device: torch.device) -> None:
        self.inv_freq = inv_freq.to(device)  # [head_dim // 2] float32
        self.scaling = scaling
        self.table = torch.empty(0, 2 * inv_freq.shape[0], dtype=torch.float32, device=device)

    def covering(self, max_position: int) -> torch.Tensor:
        """The [positions, head_dim] float32 table, holding at least positions 0..max_position."""
        if max_position >= self.table.shape[0]:
            size = max(max_position + 1, 2 * self.table.shape[0], 256)
            positions = torch.arange(size, device=self.inv_freq.device, dtype=torch.int64).float()
            freqs = positions[:, None] * self.inv_freq[None, :]  # [size, head_dim // 2]
            self.table = torch.cat([freqs.cos() * self.scaling, freqs.sin() * self.scaling], dim=-1)
        return self.table
