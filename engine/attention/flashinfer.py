"""FlashInfer backend: multi-item-scoring paged prefill (page size 1 over the batch's own K/V), CUDA only.

Only BatchPrefillWithPagedKVCacheWrapper applies the multi-item mask (the ragged wrapper accepts the
same plan() arguments and ignores them), so K/V of the batch are viewed as a paged cache of one-token
pages. RoPE is applied by the model from the pack positions before attention (pos_encoding_mode="NONE").
tests/gpu/ checks it against the sdpa backend; bench/gpu_check.sh runs those tests on a GPU machine.

Kernels (FlashInferBackend(device, kernel=...)): "fa2" (the default; SGLang's choice for multi-item
scoring) or "fa3" (Hopper only). FlashInfer 0.6.6's FA3 paged prefill takes the same multi-item plan
arguments: prefill.py passes prefix_len / token_pos_in_items / max_item_len to the sm90 paged run, the
sm90 module is built for mask mode 3 (kMultiItemScoring), and hopper/mainloop_mma.cuh masks with the same
rule as FA2's prefill.cuh (kernel_mask in flashinfer_plan.py); it skips the same tiles (between the query
and q_tile_start - max_item_len). Its unmasked-tile loop masks a query row whole (`is_prefix` in
mask_multi_item_scoring_assume_in_bound) from tile prefix_tiles - 2 on, which no query row reaches: with
kv_len == qo_len a query tile holds query rows only while its KV tiles end by prefix_tiles + 1, and the
last ceil(CTA_Q / CTA_KV) + 1 of those run the full mask (tiles 128 × 96 at head_dim 128, 192 × 96 at 64,
128 × 32 at 256); a cached pack has no query rows. Differences read there: FA3's plan has no split-KV settings (FlashInfer
passes fixed_split_size / disable_split_kv to FA2 only), so SplitKv must stay default; FA3 needs equal K and
V strides (ours are two contiguous [pages, 1, kv_heads, head_dim] tensors) and head_dim 64, 128 or 256.
Neither has run on a GPU yet: tests/gpu/test_flashinfer.py checks both against the fp32 reference.

Cached packs (the query computed once per group) are OFF unless FlashInferBackend(cache_query=True):
see flashinfer_plan.py for their pages; the plan copies cached queries' K/V from the QueryCache into pages
after the batch's own in every layer, and puts every storing pack's query K/V ([q, 1, kv_heads, d] copies).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from score_batch.engine.attention.base import Capabilities, to_device
from score_batch.engine.attention.flashinfer_plan import MAX_ITEM_TOKENS, MultiItemMetadata, build_metadata
from score_batch.engine.errors import SettingError
from score_batch.engine.plan.batching import Batch

WORKSPACE_BYTES = 256 * 1024 * 1024
KERNELS = ("fa2", "fa3")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim] as FlashInfer's run reads it: any token stride, heads packed in a row and the
    last dimension contiguous (a view of the QKV output as it is; else a contiguous copy)."""
    if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1]:
        return x
    return x.contiguous()


class PlanCopies:
    """The wait that lets a plan be made while the previous batch runs. FlashInfer's plan() writes its schedule
    into the wrapper's one page-locked buffer and queues the copy to the device without waiting (FA2 and FA3:
    scheduler.cuh); a second plan() before that copy has run would overwrite what the earlier batch's kernels
    read. So each plan() first waits for the previous plan's copy: the device has then started that batch, and
    the host only waits for work the device is already doing."""

    def __init__(self, event=None) -> None:
        self._event = event or torch.cuda.Event  # tests pass a recording stand-in
        self._copied = None  # the event after the last plan's copy

    def __enter__(self) -> PlanCopies:
        if self._copied is not None:
            self._copied.synchronize()
        return self

    def __exit__(self, *exc) -> None:
        self._copied = self._event()
        self._copied.record()


@dataclass(frozen=True)
class SplitKv:
    """FlashInfer's split-KV settings for plan(): its own choice by default; tests force each way (FA2 only)."""

    disable: bool = False  # plan(disable_split_kv=True): one CTA per query tile, no merge
    fixed_size: int | None = None  # plan(fixed_split_size=pages): split every request's KV at this size


class FlashInferPlan:
    """Uploads the CPU-built metadata once, plans the wrapper on the first layer, runs it in every layer. One
    output buffer per plan is passed to every layer's run(out=...): run() would otherwise allocate and zero a
    [tokens, heads, head_dim] tensor per layer. A layer's output is consumed by its o_proj (stream-ordered)
    before the next layer's run writes the buffer again. With cached queries, the paged K/V are two buffers of
    [pages, 1, kv_heads, head_dim] per plan, written in every layer the same way."""

    def __init__(
        self,
        wrapper,
        meta: MultiItemMetadata,
        device: torch.device,
        split_kv: SplitKv = SplitKv(),
        query_cache=None,
        plan_copies: PlanCopies | None = None,
    ) -> None:
        self._wrapper = wrapper
        self._plan_copies = plan_copies
        self._meta = meta
        self._device = device
        self._split_kv = split_kv
        self._cache = query_cache
        self._planned = False
        self._out: torch.Tensor | None = None  # [num_tokens, num_heads, head_dim], made by the first layer
        self._pages: tuple[torch.Tensor, torch.Tensor] | None = None  # paged K and V with cached queries

    def _plan(self, query: torch.Tensor, key: torch.Tensor, scaling: float | None) -> None:
        meta = self._meta
        # plan() reads the indptr arrays on the host: CPU int32 tensors spare it a device→host sync.
        multi_item = {}
        if meta.token_pos_in_items_len > 0:
            multi_item = dict(
                prefix_len_ptr=to_device(meta.prefix_len, self._device),
                token_pos_in_items_ptr=to_device(meta.token_pos_in_items, self._device),
                token_pos_in_items_len=meta.token_pos_in_items_len,
                max_item_len_ptr=to_device(meta.max_item_len, self._device),
            )
        # the previous batch's plan must have reached the device first: see PlanCopies
        with self._plan_copies or contextlib.nullcontext():
            self._wrapper.plan(
                torch.from_numpy(meta.qo_indptr),
                torch.from_numpy(meta.kv_indptr),
                to_device(meta.kv_indices, self._device),
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

    def attend(self, query, key, value, scaling, sliding_window, softcap=None, layer=0):
        """Paged multi-item prefill over the batch; K/V pages are the batch's own tokens (+ cached queries)."""
        if sliding_window is not None or softcap is not None:
            raise SettingError(
                "EngineConfig.backend",
                "flashinfer",
                "does not apply sliding windows by position or attention-logit soft-capping",
            )
        if not self._planned:
            self._plan(query, key, scaling)
        q = _rows(query[0].transpose(0, 1))  # [num_tokens, num_heads, head_dim], strided rows kept
        k, v = self._paged(key, value, layer)  # [pages, page_size=1, kv_heads, head_dim] each
        out = self._output(q, v)
        return self._wrapper.run(q, (k, v), out=out).unsqueeze(0)  # [1, num_tokens, num_heads, head_dim]

    def _paged(self, key, value, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's paged K and V; storing packs put their query K/V, cached queries are copied in."""
        meta = self._meta
        if not meta.cached and (self._cache is None or not meta.stored):
            # [pages=num_tokens, 1, kv_heads, head_dim] views: FlashInfer reads the pages through their strides
            # and needs K's and V's equal (the native layers' k and v are views of one QKV output); else copies
            k, v = (x[0].transpose(0, 1).unsqueeze(1) for x in (key, value))
            if k.stride() != v.stride() or k.stride(-1) != 1 or k.stride(-2) != k.shape[-1]:
                k, v = k.contiguous(), v.contiguous()
            return k, v
        tokens = key.shape[2]
        shape = (meta.pages, 1, key.shape[1], key.shape[3])  # [pages, 1, kv_heads, head_dim]
        if self._pages is None or self._pages[0].shape != shape or self._pages[0].dtype != key.dtype:
            self._pages = tuple(torch.empty(shape, dtype=key.dtype, device=key.device) for _ in range(2))
        pages = self._pages
        for buffer, source in zip(pages, (key, value)):
            buffer[:tokens, 0].copy_(source[0].transpose(0, 1))  # [tokens, kv_heads, head_dim]
        if self._cache is not None:
            needed = getattr(self._cache, "needed", lambda key: True)
            for stored in meta.stored:
                if needed(stored.key):  # copies: the buffers are rewritten by the next layer
                    rows = slice(stored.start, stored.start + stored.length)
                    self._cache.put(stored.key, layer, tuple(buffer[rows].clone() for buffer in pages))
        for cached in meta.cached:
            rows = slice(cached.first_page, cached.first_page + cached.length)
            for buffer, stored_kv in zip(pages, self._cache.get(cached.key, layer)):
                buffer[rows].copy_(stored_kv)  # [q, 1, kv_heads, head_dim]
        return pages

    def _output(self, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The plan's output buffer [num_tokens, num_heads, v_head_dim] in q's dtype (plan's o_data_type)."""
        shape = (*q.shape[:-1], v.shape[-1])
        if self._out is None or self._out.shape != shape or self._out.dtype != q.dtype:
            self._out = torch.zeros(shape, dtype=q.dtype, device=q.device)
        return self._out


class FlashInferBackend:
    """One paged prefill wrapper and its workspace, re-planned per batch. kernel: "fa2" (default) or "fa3"
    (Hopper). cache_query: run cached packs (the query computed once per group, from a QueryCache); off by
    default until a GPU run confirms it (tests/gpu/test_flashinfer.py)."""

    name = "flashinfer"
    _plan_copies: PlanCopies | None = None  # set on CUDA by __init__
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        auto_devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.bfloat16, torch.float16}),  # FA2/FA3 kernels are 16-bit only
        head_dims=frozenset({64, 128, 256}),
        softcap=False,
        sliding_window=False,
        max_pack_tokens=MAX_ITEM_TOKENS,
        module="flashinfer",
    )

    def __init__(
        self,
        device: torch.device,
        split_kv: SplitKv = SplitKv(),
        kernel: str = "fa2",
        cache_query: bool = False,
    ) -> None:
        check_kernel(kernel, split_kv, device)
        import flashinfer

        self.kernel = kernel
        self._split_kv = split_kv
        self._cache_query = cache_query
        if cache_query:  # this instance runs cached packs; the class (what setup reads) still says no
            self.capabilities = dataclasses.replace(type(self).capabilities, cached_query=True)
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, kv_layout="NHD", backend=kernel
        )
        if device.type == "cuda":
            self._plan_copies = PlanCopies()

    def plan(self, batch: Batch, device: torch.device, query_cache=None) -> FlashInferPlan:
        """Metadata is built on the CPU here; the kernel plan happens on the first layer (needs head shapes)."""
        meta = build_metadata(batch)
        if meta.cached and (not self._cache_query or query_cache is None):
            raise ValueError(
                "this batch has packs whose query K/V come from a QueryCache: FlashInferBackend runs them "
                "only with cache_query=True and the run's QueryCache (backend.plan(batch, device, cache))"
            )
        cache = query_cache if self._cache_query else None
        return FlashInferPlan(self._wrapper, meta, device, self._split_kv, cache, self._plan_copies)


def check_kernel(kernel: str, split_kv: SplitKv, device: torch.device) -> None:
    """Refuse a kernel FlashInfer cannot run here (before importing flashinfer)."""
    if kernel not in KERNELS:
        raise ValueError(f"FlashInfer kernel must be one of {', '.join(KERNELS)}, not {kernel!r}")
    if kernel == "fa3":
        if split_kv != SplitKv():
            raise ValueError(
                "FA3's plan has no split-KV settings (FlashInfer 0.6.6 applies them to FA2 only)"
            )
        if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
            raise ValueError("FlashInfer's FA3 kernels run on Hopper GPUs (sm90) only")
