"""flex_attention backend: one block-sparse mask over the ragged batch, from the same pack metadata.

Compiled (the CUDA default), the kernel runs at a bucketed token count so that any number of batch
sizes compiles a bounded number of times (dynamo turns the padded length dynamic after the second
size); padded tokens see only themselves and their rows are never read.

Padding costs one allocation per batch: the plan keeps zeroed [length] buffers for Q, K and V and each
layer copies its rows into their heads (no per-layer allocation or zero fill); the output is returned as
a view of its first rows. Two alternatives were rejected: padding the model's inputs would run every
MLP on the padding (up to a quarter more tokens), and cropping the block mask to the batch
(BlockMask._adjust) puts the exact length into the mask's guarded seq_lengths, one compile per size.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from score_batch.engine.attention.base import Capabilities
from score_batch.engine.attention.query_cache import QueryCache
from score_batch.engine.plan.batching import Batch
from score_batch.engine.plan.packing import QUERY_SEGMENT

FLEX_BLOCK_SIZE = 128
BUCKETS_PER_OCTAVE = 4  # padding stays under one block or a quarter of the batch, whichever is larger


def bucket_tokens(num_tokens: int, block: int = FLEX_BLOCK_SIZE) -> int:
    """The padded length of a batch: a multiple of block, BUCKETS_PER_OCTAVE steps per power of two."""
    octave = 1 << (max(num_tokens - 1, 1).bit_length() - 1)  # the largest power of two below num_tokens
    step = max(block, octave // BUCKETS_PER_OCTAVE)
    return -(-num_tokens // step) * step


def _padded(array: np.ndarray, length: int, fill: int, device: torch.device) -> torch.Tensor:
    """A [num_tokens] host array as a [length] device tensor, padded with fill."""
    return torch.from_numpy(np.pad(array, (0, length - array.shape[0]), constant_values=fill)).to(device)


class FlexPlan:
    """Block masks for one batch, one per sliding-window size, shared by all layers."""

    def __init__(self, batch: Batch, device: torch.device, backend: FlexBackend) -> None:
        self._length = bucket_tokens(batch.num_tokens) if backend.compiled else batch.num_tokens
        # Padded tokens form their own pack (-1) of query tokens: each sees itself only, never a real token.
        self._pack = _padded(batch.pack_index, self._length, -1, device)  # [length]
        self._segment = _padded(batch.segments, self._length, QUERY_SEGMENT, device)  # [length]
        self._position = _padded(batch.positions, self._length, 0, device)  # [length]
        self._device = device
        self._backend = backend
        self._block_masks: dict[int | None, object] = {}
        # (role, heads, head_dim, dtype) → a zero-tailed [1, heads, length, d] buffer
        self._buffers: dict[tuple, torch.Tensor] = {}

    def _block_mask(self, sliding_window: int | None):
        """The BlockMask for one window size (docs/semantics.md, Attention mask)."""
        if sliding_window not in self._block_masks:
            pack, segment, position = self._pack, self._segment, self._position

            def mask_mod(b, h, q_idx, kv_idx):
                visible = (segment[kv_idx] == QUERY_SEGMENT) | (
                    (segment[kv_idx] == segment[q_idx]) & (segment[q_idx] >= 0)
                )
                allowed = (pack[q_idx] == pack[kv_idx]) & (kv_idx <= q_idx) & visible
                if sliding_window is not None:
                    allowed = allowed & (position[q_idx] - position[kv_idx] < sliding_window)
                return allowed

            length = self._length
            self._block_masks[sliding_window] = self._backend.create_block_mask(
                mask_mod, None, None, length, length, device=self._device, BLOCK_SIZE=FLEX_BLOCK_SIZE
            )
        return self._block_masks[sliding_window]

    def attend(self, query, key, value, scaling, sliding_window, softcap=None, layer=0):
        """One flex_attention call over the whole ragged batch (padded to its bucket when compiled). layer is
        accepted for the interface; flex runs every query inline (no QueryCache)."""
        block_mask = self._block_mask(sliding_window)
        num_tokens = query.shape[2]
        query, key, value = (self._padded(role, x) for role, x in (("q", query), ("k", key), ("v", value)))
        score_mod = None if softcap is None else _soft_cap_mod(softcap)
        gqa = key.shape[1] != query.shape[1]
        with warnings.catch_warnings():
            # Uncompiled flex (the CPU default) warns that it materializes scores; that is the intent there.
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            output = self._backend.flex_attention(  # [1, num_heads, length, head_dim]
                query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling, enable_gqa=gqa
            )
        return output[:, :, :num_tokens].transpose(1, 2)  # [1, num_tokens, num_heads, head_dim], a view

    def _padded(self, role: str, x: torch.Tensor) -> torch.Tensor:
        """[1, heads, num_tokens, d] in the head of this plan's zero-tailed [1, heads, length, d] buffer."""
        if x.shape[2] == self._length:
            return x
        key = (role, x.shape[1], x.shape[3], x.dtype)
        buffer = self._buffers.get(key)
        if buffer is None:  # once per batch: the tail rows stay zero for every layer
            buffer = torch.zeros((1, x.shape[1], self._length, x.shape[3]), dtype=x.dtype, device=x.device)
            self._buffers[key] = buffer
        buffer[:, :, : x.shape[2]].copy_(x)
        return buffer


def _soft_cap_mod(cap: float):
    """flex score_mod for attention-logit soft-capping."""

    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap

    return score_mod


class FlexBackend:
    """flex_attention with a block mask; compiled when it pays (CUDA by default)."""

    name = "flex"
    capabilities = Capabilities(devices=frozenset({"cpu", "cuda"}), auto_devices=frozenset({"cuda"}))

    def __init__(self, device: torch.device, compile: bool | None = None) -> None:
        self.compiled = device.type == "cuda" if compile is None else compile
        self.flex_attention = torch.compile(flex_attention) if self.compiled else flex_attention
        self.create_block_mask = torch.compile(create_block_mask) if self.compiled else create_block_mask

    def plan(self, batch: Batch, device: torch.device, query_cache: QueryCache | None = None) -> FlexPlan:
        """Build the block mask lazily on the first layer that asks; a batch with a cached pack is refused."""
        if any(p.query_cached for p in batch.packs):
            raise ValueError(
                "the flex backend runs every query inline (Capabilities.cached_query is False), but this "
                "batch has packs whose query K/V come from a QueryCache: plan with PlanLimits.cache_query=False"
            )
        return FlexPlan(batch, device, self)
