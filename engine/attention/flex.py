"""flex_attention backend: one block-sparse mask over the ragged batch, from the same pack metadata."""

from __future__ import annotations

import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from engine.attention.base import Capabilities
from engine.batching import Batch
from engine.packing import QUERY_SEGMENT

FLEX_BLOCK_SIZE = 128


class FlexPlan:
    """Block masks for one batch, one per sliding-window size, shared by all layers."""

    def __init__(self, batch: Batch, device: torch.device, attention_fn, compile_mask: bool) -> None:
        self._pack = torch.from_numpy(batch.pack_index).to(device)  # [num_tokens]
        self._segment = torch.from_numpy(batch.segments).to(device)  # [num_tokens]
        self._position = torch.from_numpy(batch.positions).to(device)  # [num_tokens]
        self._length = batch.num_tokens
        self._device = device
        self._attention_fn = attention_fn
        self._compile_mask = compile_mask
        self._block_masks: dict[int | None, object] = {}

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

            self._block_masks[sliding_window] = create_block_mask(
                mask_mod,
                None,
                None,
                self._length,
                self._length,
                device=self._device,
                BLOCK_SIZE=FLEX_BLOCK_SIZE,
                _compile=self._compile_mask,
            )
        return self._block_masks[sliding_window]

    def attend(self, query, key, value, scaling, sliding_window, softcap=None):
        """One flex_attention call over the whole ragged batch."""
        block_mask = self._block_mask(sliding_window)
        with warnings.catch_warnings():
            # Uncompiled flex (the CPU default) warns that it materializes scores; that is the intent there.
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            output = self._attention_fn(
                query,
                key,
                value,
                score_mod=None if softcap is None else _soft_cap_mod(softcap),
                block_mask=block_mask,
                scale=scaling,
                enable_gqa=key.shape[1] != query.shape[1],
            )  # [1, num_heads, num_tokens, head_dim]
        return output.transpose(1, 2)


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
        compile = device.type == "cuda" if compile is None else compile
        self._compile = compile
        self._attention_fn = torch.compile(flex_attention, dynamic=False) if compile else flex_attention

    def plan(self, batch: Batch, device: torch.device) -> FlexPlan:
        """Build the block mask lazily on the first layer that asks."""
        return FlexPlan(batch, device, self._attention_fn, self._compile)
