"""FLOP counts of the bench model and data-sheet peaks by exact device name (MFU with and without attention).

Dense FLOPs: 2 per non-embedding weight per token (q/k/v/o projections and the gated MLP; norms, RoPE and
softmax left out). Attention FLOPs: per layer, per query head and per attended (query, key) pair, 2·d for
QKᵀ and 2·d for PV. Attended pairs are those the mask allows (docs/semantics.md, Attention mask): a
causal sequence of L tokens has L(L+1)/2; in a multi-item pack a query token i sees i + 1 keys, a
delimiter sees the Q query tokens, and the j-th token of an item sees the query and j item tokens.
Padding is no useful work and is not counted in attended pairs.

MFU is reported on the tokens run (MFU_BASIS): every token that goes through every layer, the multi-item
delimiters and plain HF's padding included, since the GPU computes them all; `mfu_dense_useful` counts only
query and item tokens (delimiters and padding out), the work a user asked for.
"""

from __future__ import annotations

import numpy as np

QUERY_SEGMENT, DELIMITER_SEGMENT = -1, -2  # as engine/plan/packing.py
MFU_BASIS = (
    "mfu_dense and mfu_with_attention count the tokens run: every token through every layer, multi-item "
    "delimiters and plain-HF padding included; mfu_dense_useful counts query and item tokens only"
)

# Dense bf16 tensor-core peaks, FLOP/s, keyed by torch.cuda.get_device_name(). The data sheets give them
# "with sparsity"; the dense figure is half. Sources: NVIDIA H100 Tensor Core GPU data sheet (H100 SXM
# 1,979 TFLOPS, H100 NVL 1,671, H100 PCIe 1,513 with sparsity); NVIDIA H200 Tensor Core GPU data sheet
# (H200 SXM 1,979, H200 NVL 1,671 with sparsity); NVIDIA A100 data sheet (312 dense). Measured here on
# random 8192³ bf16 products (the workplace's notes): about 798 TFLOP/s on an H100 80GB HBM3 and 788 on
# an H200, i.e. MFU against the data sheet reads about 0.8 of the reachable figure.
PEAK_BF16_FLOPS: dict[str, tuple[float, str]] = {
    "NVIDIA H100 80GB HBM3": (989.4e12, "H100 SXM5 data sheet: 1,979 TFLOPS bf16 with sparsity, halved"),
    "NVIDIA H100 PCIe": (756.5e12, "H100 PCIe data sheet: 1,513 TFLOPS bf16 with sparsity, halved"),
    "NVIDIA H100 NVL": (835.5e12, "H100 NVL data sheet: 1,671 TFLOPS bf16 with sparsity, halved"),
    "NVIDIA H200": (989.4e12, "H200 SXM data sheet: 1,979 TFLOPS bf16 with sparsity, halved"),
    "NVIDIA H200 NVL": (835.5e12, "H200 NVL data sheet: 1,671 TFLOPS bf16 with sparsity, halved"),
    "NVIDIA A100-SXM4-80GB": (312e12, "A100 data sheet: 312 TFLOPS bf16 dense"),
    "NVIDIA A100-SXM4-40GB": (312e12, "A100 data sheet: 312 TFLOPS bf16 dense"),
}


def peak_flops(device_name: str) -> tuple[float | None, str]:
    """(dense bf16 peak, its source) for an exact device name; (None, why) for any other."""
    if device_name in PEAK_BF16_FLOPS:
        return PEAK_BF16_FLOPS[device_name]
    return None, f"no data-sheet peak for {device_name!r}: MFU not reported"


def dense_flops_per_token(cfg: dict) -> float:
    """2 × non-embedding weights of a Qwen3-style layer stack (q/k/v/o projections and the gated MLP)."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    attention = h * d * (2 * cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"])
    mlp = 3 * h * cfg["intermediate_size"]
    return 2.0 * cfg["num_hidden_layers"] * (attention + mlp)


def attention_flops(cfg: dict, pairs: int) -> float:
    """QKᵀ and PV FLOPs of `pairs` attended (query, key) pairs in every layer and query head."""
    return 4.0 * cfg["head_dim"] * cfg["num_attention_heads"] * cfg["num_hidden_layers"] * pairs


def causal_pairs(length: int) -> int:
    """Attended pairs of one causal sequence."""
    return length * (length + 1) // 2


def pack_pairs(segments: np.ndarray, cached_query: int = 0) -> int:
    """Attended pairs of one pack under the multi-item mask (a single-item pack is all query: causal).

    cached_query: query tokens the pack reads from the QueryCache instead of holding them (a cached pack's
    prefix_len); every row of such a pack also sees them.
    """
    index = np.arange(segments.shape[0])
    is_query = segments == QUERY_SEGMENT
    queries_before = np.cumsum(is_query) + cached_query  # [length] query tokens at or before each row
    # Distance to the last delimiter at or before each row: j for the j-th token of an item.
    last_delimiter = np.maximum.accumulate(np.where(segments == DELIMITER_SEGMENT, index, -1))
    own = np.where(segments >= 0, index - last_delimiter, 0)
    return int(np.where(is_query, index + 1, queries_before + own).sum())


def figures(
    cfg: dict,
    tokens: int,
    pairs: int,
    seconds: float,
    peak: float | None,
    useful_tokens: int | None = None,
) -> dict[str, float | None]:
    """FLOPs of a run on its tokens run and MFU without and with attention (None without a peak; MFU_BASIS).

    useful_tokens (query and item tokens, no delimiters or padding) adds mfu_dense_useful.
    """
    dense = dense_flops_per_token(cfg) * tokens
    attention = attention_flops(cfg, pairs)
    row = {
        "dense_flops": dense,
        "attention_flops": attention,
        "attention_share": round(attention / (dense + attention), 4) if dense + attention else 0.0,
        "mfu_dense": None if peak is None else round(dense / seconds / peak, 4),
        "mfu_with_attention": None if peak is None else round((dense + attention) / seconds / peak, 4),
    }
    if useful_tokens is not None:
        useful = dense_flops_per_token(cfg) * useful_tokens
        row["mfu_dense_useful"] = None if peak is None else round(useful / seconds / peak, 4)
    return row
