"""FlashInfer backend: multi-item-scoring paged prefill (page size 1 over the batch's own K/V), CUDA only.

Only BatchPrefillWithPagedKVCacheWrapper applies the multi-item mask (the ragged wrapper accepts the
same plan() arguments and ignores them), so K/V of the batch are viewed as a paged cache of one-token
pages. RoPE is applied by the model from the pack positions before attention (pos_encoding_mode="NONE").
tests/gpu/ checks it against the sdpa backend; bench/gpu_check.sh runs those tests on a GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from score_batch.engine.attention.base import Capabilities
from score_batch.engine.attention.flashinfer_plan import MAX_ITEM_TOKENS, MultiItemMetadata, build_metadata
from score_batch.engine.batching import Batch
from score_batch.engine.errors import SettingError

WORKSPACE_BYTES = 256 * 1024 * 1024


def _to_device(array, device: torch.device) -> torch.Tensor:
    """A host array on the device, copied from pinned memory without blocking the host."""
    host = torch.from_numpy(array)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


@dataclass(frozen=True)
class SplitKv:
    """FlashInfer's split-KV settings for plan(): its own choice by default; tests force each way."""

    disable: bool = False  # plan(disable_split_kv=True): one CTA per query tile, no merge
    fixed_size: int | None = None  # plan(fixed_split_size=pages): split every request's KV at this size


class FlashInferPlan:
    """Uploads the CPU-built metadata once, plans the wrapper on the first layer, runs it in every layer.

    One output buffer per plan is passed to every layer's run(out=...): run() would otherwise allocate
    and zero a [tokens, heads, head_dim] tensor per layer. A layer's output is consumed by its o_proj
    (stream-ordered) before the next layer's run writes the buffer again.
    """

    def __init__(
        self, wrapper, meta: MultiItemMetadata, device: torch.device, split_kv: SplitKv = SplitKv()
    ) -> None:
        self._wrapper = wrapper
        self._meta = meta
        self._device = device
        self._split_kv = split_kv
        self._planned = False
        self._out: torch.Tensor | None = (
            None  # [num_tokens, num_heads, head_dim], allocated by the first layer
        )

    def _plan(self, query: torch.Tensor, key: torch.Tensor, scaling: float | None) -> None:
        meta = self._meta
        # plan() reads the indptr arrays on the host: CPU int32 tensors spare it a device→host sync.
        indptr = torch.from_numpy(meta.qo_indptr)  # [num_packs + 1] int32, CPU
        multi_item = {}
        if meta.token_pos_in_items_len > 0:
            multi_item = dict(
                prefix_len_ptr=_to_device(meta.prefix_len, self._device),
                token_pos_in_items_ptr=_to_device(meta.token_pos_in_items, self._device),
                token_pos_in_items_len=meta.token_pos_in_items_len,
                max_item_len_ptr=_to_device(meta.max_item_len, self._device),
            )
        self._wrapper.plan(
            indptr,
            indptr,
            _to_device(meta.kv_indices, self._device),
            torch.from_numpy(meta.kv_last_page_len),
            query.shape[1],
            key.shape[1],
            query.shape[-1],
            1,
            causal=True,
            pos_encoding_mode="NONE",
            sm_scale=scaling,
            q_data_type=query.dtype,
            kv_data_type=key.dtype,
            fixed_split_size=self._split_kv.fixed_size,
            disable_split_kv=self._split_kv.disable,
            **multi_item,
        )
        self._planned = True

    def attend(self, query, key, value, scaling, sliding_window, softcap=None):
        """Paged multi-item prefill over the batch; K/V pages are the batch's own tokens."""
        if sliding_window is not None or softcap is not None:
            raise SettingError(
                "EngineConfig.backend",
                "flashinfer",
                "does not apply sliding windows by position or attention-logit soft-capping",
            )
        if not self._planned:
            self._plan(query, key, scaling)
        q = query[0].transpose(0, 1).contiguous()  # [num_tokens, num_heads, head_dim]
        k = (
            key[0].transpose(0, 1).contiguous().unsqueeze(1)
        )  # [pages=num_tokens, page_size=1, kv_heads, head_dim]
        v = value[0].transpose(0, 1).contiguous().unsqueeze(1)
        out = self._output(q, v)
        return self._wrapper.run(q, (k, v), out=out).unsqueeze(0)  # [1, num_tokens, num_heads, head_dim]

    def _output(self, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The plan's output buffer [num_tokens, num_heads, v_head_dim] in q's dtype (plan's o_data_type)."""
        shape = (*q.shape[:-1], v.shape[-1])
        if self._out is None or self._out.shape != shape or self._out.dtype != q.dtype:
            self._out = torch.zeros(shape, dtype=q.dtype, device=q.device)
        return self._out


class FlashInferBackend:
    """One paged prefill wrapper and its workspace, re-planned per batch."""

    name = "flashinfer"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        auto_devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.bfloat16, torch.float16}),  # FA2 kernels are 16-bit only
        head_dims=frozenset({64, 128, 256}),
        softcap=False,
        sliding_window=False,
        max_pack_tokens=MAX_ITEM_TOKENS,
        module="flashinfer",
    )

    def __init__(self, device: torch.device, split_kv: SplitKv = SplitKv()) -> None:
        import flashinfer

        self._split_kv = split_kv
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, kv_layout="NHD", backend="fa2"
        )

    def plan(self, batch: Batch, device: torch.device) -> FlashInferPlan:
        """Metadata is built on the CPU here; the kernel plan happens on the first layer (needs head shapes)."""
        return FlashInferPlan(self._wrapper, build_metadata(batch), device, self._split_kv)
