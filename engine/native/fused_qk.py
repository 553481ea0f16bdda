"""One Triton kernel for the per-head q/k RMSNorms and RoPE, in place in the QKV projection's output (CUDA).

FlashInfer 0.6.6 has no fused q/k-norm + RoPE: its path is three launches (q norm, k norm, RoPE), each reading and
writing q and k. This kernel reads each head of q and k once, normalizes it in float32 (times its weight),
rotates it (neox halves, cos/sin from the float32 cache at the token's position) and writes it back once,
rounded once. q's heads then k's heads are adjacent in a QKV row, so both are one strided
[tokens, heads + kv_heads, head_dim] view. One program per block of BLOCK_TOKENS tokens × all those heads: it
loads the block's cos/sin and both weights once, then walks the heads a group of heads at a time (a
[tokens, heads, head_dim] tile of TILE elements); masks cover the last block's tokens and the last group's heads.
Imported only where triton is; engine/model/proof.py checks it against TorchOps at load, so a wrong result falls
back instead of scoring.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter: CPU tensors (tests, counts)
BLOCK_TOKENS = 16  # tokens per program: cdiv(tokens, 16) programs, 351 for a 5,601-token pack
# Elements of q/k a program holds at once (tokens × heads × head_dim, 8 KiB of bf16) and its warps: compiled for
# sm_90 (Triton 3.9), 128 registers a thread, no spills, 16-byte loads and stores, 4 programs resident per SM (the
# 351 programs of a 5,601-token pack fit in one wave on 132 SMs). Not yet tuned on a GPU.
TILE = 4096
NUM_WARPS = 4


@triton.jit
def _qk_norm_rope(
    qk_ptr,  # first element of q's first head; k's heads follow q's in every row
    q_weight_ptr,
    k_weight_ptr,
    positions_ptr,  # [tokens] int64
    cos_sin_ptr,  # [max_position + 1, head_dim] float32: cos half, sin half
    tokens,
    row_stride,  # elements between two tokens' rows
    q_heads,
    heads,  # q_heads + kv_heads
    eps,
    HALF: tl.constexpr,  # head_dim // 2, a power of two
    NORM: tl.constexpr,
    BLOCK: tl.constexpr,  # tokens per program, a power of two
    GROUP: tl.constexpr,  # heads per step, a power of two
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] token indices
    live = rows < tokens
    half = tl.arange(0, HALF)
    position = tl.load(positions_ptr + rows, mask=live, other=0)
    table = cos_sin_ptr + position[:, None] * (2 * HALF) + half[None, :]  # [BLOCK, HALF]
    cos = tl.load(table, mask=live[:, None], other=0.0)[:, None, :]  # [BLOCK, 1, HALF] float32
    sin = tl.load(table + HALF, mask=live[:, None], other=0.0)[:, None, :]
    if NORM:
        q_first = tl.load(q_weight_ptr + half).to(tl.float32)[None, None, :]  # [1, 1, HALF]
        q_second = tl.load(q_weight_ptr + HALF + half).to(tl.float32)[None, None, :]
        k_first = tl.load(k_weight_ptr + half).to(tl.float32)[None, None, :]
        k_second = tl.load(k_weight_ptr + HALF + half).to(tl.float32)[None, None, :]
    row_base = qk_ptr + rows.to(tl.int64)[:, None, None] * row_stride  # [BLOCK, 1, 1]
    for start in tl.range(0, heads, GROUP):
        head = start + tl.arange(0, GROUP)  # [GROUP]
        mask = live[:, None, None] & (head < heads)[None, :, None]  # [BLOCK, GROUP, 1]
        base = row_base + (head * (2 * HALF))[None, :, None] + half[None, None, :]  # [BLOCK, GROUP, HALF]
        first = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        second = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
        if NORM:
            is_q = (head < q_heads)[None, :, None]
            mean_square = (tl.sum(first * first, axis=2) + tl.sum(second * second, axis=2)) / (2 * HALF)
            scale = (1.0 / tl.sqrt(mean_square + eps))[:, :, None]  # [BLOCK, GROUP, 1]
            first = first * scale * tl.where(is_q, q_first, k_first)
            second = second * scale * tl.where(is_q, q_second, k_second)
        tl.store(base, (first * cos - second * sin).to(qk_ptr.dtype.element_ty), mask=mask)
        tl.store(base + HALF, (second * cos + first * sin).to(qk_ptr.dtype.element_ty), mask=mask)


def runs_on(x: torch.Tensor) -> bool:
    """Whether the kernel runs on x's device: CUDA, or any device under Triton's interpreter."""
    return x.is_cuda or INTERPRETED


def fusable(q: torch.Tensor, k: torch.Tensor, head_dim: int) -> bool:
    """Whether q [tokens, heads * head_dim] and k are rows of one buffer with k's heads right after q's (the QKV
    output's views), the last dimension contiguous and head_dim a power of two."""
    return (
        q.dim() == 2
        and q.stride(1) == 1
        and k.stride() == q.stride()
        and k.dtype == q.dtype
        and head_dim & (head_dim - 1) == 0
        and k.data_ptr() == q.data_ptr() + q.shape[1] * q.element_size()
    )


def head_group(heads: int, head_dim: int, block: int = BLOCK_TOKENS) -> int:
    """Heads per step: a power of two, TILE // (block * head_dim) at most, no more than the heads need."""
    return max(1, min(triton.next_power_of_2(heads), TILE // (block * head_dim)))


def programs(tokens: int, block: int = BLOCK_TOKENS) -> int:
    """Programs one launch runs for a batch of tokens: one per block of tokens."""
    return triton.cdiv(tokens, block)


def qk_norm_rope(
    q: torch.Tensor,  # [tokens, heads * head_dim], a view of the QKV output
    k: torch.Tensor,  # [tokens, kv_heads * head_dim], right after q in every row
    positions: torch.Tensor,  # [tokens] int64
    cos_sin: torch.Tensor,  # [max_position + 1, head_dim] float32
    norms: tuple | None,  # (q_weight, k_weight, eps) or None: RoPE alone
    head_dim: int,
    block: int = BLOCK_TOKENS,  # tokens per program, a power of two
) -> None:
    """The q/k RMSNorms (when given) and RoPE, in place, in one launch (fusable(q, k, head_dim) must hold)."""
    tokens = q.shape[0]
    if tokens == 0:
        return
    q_heads, kv_heads = q.shape[1] // head_dim, k.shape[1] // head_dim
    q_weight, k_weight, eps = norms if norms is not None else (cos_sin, cos_sin, 0.0)  # unread without NORM
    _qk_norm_rope[(programs(tokens, block),)](
        q,
        q_weight,
        k_weight,
        positions,
        cos_sin,
        tokens,
        q.stride(0),
        q_heads,
        q_heads + kv_heads,
        float(eps),
        HALF=head_dim // 2,
        NORM=norms is not None,
        BLOCK=block,
        GROUP=head_group(q_heads + kv_heads, head_dim, block),
        num_warps=NUM_WARPS,
    )
