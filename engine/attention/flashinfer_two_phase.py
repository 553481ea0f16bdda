"""FlashInfer two-phase backend: the multi-item mask as two ragged prefills merged by LSE (two_phase.py), CUDA only.

Built from FlashInfer 0.6.6's standard kernels, none of them the delimiter-based multi-item mask:
BatchPrefillWithRaggedKVCacheWrapper twice (`own`: causal over the layout's segments, q/K/V read in place;
`cross`: non-query rows over their pack's query K/V, gathered per layer, no mask), each run with return_lse, and
flashinfer.merge_state_in_place on the non-query rows. The ragged wrapper's backend "auto" takes FA3 (TMA loads)
on Hopper where FlashInfer supports the shape, FA2 elsewhere. Not the default: EngineConfig.backend="auto" keeps the mask
path (registry.AUTO_RIVALS is empty) until a GPU run measures this one faster; tests/gpu/test_two_phase.py
checks it against float32 sdpa, and the load proves it like the mask path (engine/model/proof.py).
"""

from __future__ import annotations

import contextlib

import torch

from score_batch.engine.attention.base import Capabilities
from score_batch.engine.attention.flashinfer import WORKSPACE_BYTES, PlanCopies, _rows
from score_batch.engine.attention.two_phase import TwoPhaseLayout, TwoPhasePlan, two_phase_layout
from score_batch.engine.plan.batching import Batch


class FlashInferTwoPhase:
    """The two phases on FlashInfer's ragged wrappers, planned on the first layer (head shapes), one output and
    LSE buffer per phase reused by every layer (each layer's result is read by its o_proj before the next)."""

    def __init__(self, wrappers, layout: TwoPhaseLayout, device: torch.device, plan_copies) -> None:
        self._own, self._cross = wrappers
        self._layout = layout
        self._copies = plan_copies  # a PlanCopies per wrapper (CUDA), or None
        self._rows = torch.from_numpy(layout.merged_rows).to(device)  # [num_tokens] bool, FlashInfer reads u8
        self._planned = False
        self._buffers: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _plan(self, q: torch.Tensor, k: torch.Tensor, scaling: float | None) -> None:
        layout = self._layout
        phases = (
            (self._own, layout.own_indptr, layout.own_indptr, True),
            (self._cross, layout.cross_qo_indptr, layout.cross_kv_indptr, False),
        )
        for index, (wrapper, qo, kv, causal) in enumerate(phases):
            # the previous batch's plan must have reached the device first: see flashinfer.PlanCopies
            with self._copies[index] if self._copies else contextlib.nullcontext():
                wrapper.plan(
                    torch.from_numpy(qo),  # host int32: plan() reads the indptrs on the host
                    torch.from_numpy(kv),
                    q.shape[1],
                    k.shape[1],
                    q.shape[-1],
                    causal=causal,
                    pos_encoding_mode="NONE",
                    sm_scale=scaling,
                    q_data_type=q.dtype,
                    kv_data_type=k.dtype,
                )
        self._planned = True

    def _run(self, phase: str, wrapper, q, k, v, scaling) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._planned:
            self._plan(q, k, scaling)
        q = _rows(q)  # [num_tokens, heads, head_dim], strided rows kept
        if k.stride() != v.stride() or k.stride(-1) != 1 or k.stride(-2) != k.shape[-1]:
            k, v = k.contiguous(), v.contiguous()
        shape = (*q.shape[:-1], v.shape[-1])
        if phase not in self._buffers or self._buffers[phase][0].shape != shape:
            self._buffers[phase] = (
                torch.empty(shape, dtype=q.dtype, device=q.device),
                torch.empty(q.shape[:2], dtype=torch.float32, device=q.device),
            )
        out, lse = self._buffers[phase]
        return wrapper.run(q, k, v, out=out, lse=lse, return_lse=True)

    def own(self, q, k, v, scaling):
        """Causal per segment, K/V as views of the layer's projection."""
        return self._run("own", self._own, q, k, v, scaling)

    def cross(self, q, k, v, scaling):
        """The non-query rows over their query's gathered K/V (query rows over one dummy key)."""
        return self._run("cross", self._cross, q, k, v, scaling)

    def merge(self, out, lse, other_out, other_lse) -> None:
        """merge_state_in_place on the non-query rows (its mask: one byte per row)."""
        import flashinfer

        flashinfer.merge_state_in_place(out, lse, other_out, other_lse, mask=self._rows)


class FlashInferTwoPhaseBackend:
    """Two ragged prefill wrappers (own, cross), each with its workspace, re-planned per batch."""

    name = "flashinfer-two-phase"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        auto_devices=frozenset(),  # auto keeps the mask path; AUTO_RIVALS lets it race this one at load
        dtypes=frozenset({torch.bfloat16, torch.float16}),
        head_dims=frozenset({64, 128, 256}),
        softcap=False,
        sliding_window=False,
        module="flashinfer",
    )

    def __init__(self, device: torch.device, kernel: str = "auto") -> None:
        import flashinfer

        self.kernel = kernel
        self._workspaces = [torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device) for _ in range(2)]
        self._wrappers = tuple(
            flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, kv_layout="NHD", backend=kernel)
            for workspace in self._workspaces
        )
        self._plan_copies = (PlanCopies(), PlanCopies()) if device.type == "cuda" else None

    def plan(self, batch: Batch, device: torch.device, query_cache=None) -> TwoPhasePlan:
        """The layout is built on the CPU here; the wrappers plan on the first layer."""
        layout = two_phase_layout(batch)
        kernels = FlashInferTwoPhase(self._wrappers, layout, device, self._plan_copies)
        return TwoPhasePlan(layout, kernels, device)
