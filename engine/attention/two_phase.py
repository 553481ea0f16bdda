"""The multi-item mask as two standard attentions merged by log-sum-exp (docs/semantics.md, Attention mask).

An item row of a pack sees the query's keys (all of them) and its own item's earlier keys; a query row sees the
query's earlier keys. So per batch:

- own: a causal prefill over segments that tile every row in order (each pack's query; then its opening
  delimiter alone; each item with its closing delimiter; an empty item's delimiter alone), with its LSE;
- cross: each pack's non-query rows against that pack's query K/V, no mask, with its LSE; the pack's query rows
  take one dummy key there (their cross output is discarded), so both phases tile the batch's rows in order and
  read q in place;
- merge: the non-query rows' two states by log-sum-exp (FlashInfer's merge_state_in_place on the GPU).

Query rows and item rows come out as the mask gives them; a delimiter row sees itself or its item's keys in
`own`, where the mask shows it the query only: its output is never read (no row attends to a delimiter's key and
no score is read there). Cached packs (the query from a QueryCache), sliding windows and soft-capping are not
taken. This module holds the layout (numpy, per batch), the one plan both kernels share, and the torch kernels:
the CPU reference tests/test_two_phase.py checks against the dense mask (sdpa) in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from score_batch.engine.errors import SettingError
from score_batch.engine.plan.batching import Batch
from score_batch.engine.plan.packing import DELIMITER_SEGMENT, QUERY_SEGMENT


@dataclass(frozen=True)
class TwoPhaseLayout:
    """The two phases' requests over a batch's rows (FlashInfer's ragged indptr form), built on the CPU."""

    own_indptr: (
        np.ndarray
    )  # [own requests + 1] int32: q and K/V rows of each causal segment (the same ranges)
    cross_qo_indptr: np.ndarray  # [cross requests + 1] int32: the rows of each cross request
    cross_kv_indptr: np.ndarray  # [cross requests + 1] int32: each request's keys in the gathered cross K/V
    cross_kv_index: np.ndarray  # [cross keys] int64: the batch row of each gathered cross key
    merged_rows: np.ndarray  # [num_tokens] bool: the rows whose two states are merged (every non-query row)


def own_segments(segments: np.ndarray, cu_seqlens: np.ndarray) -> np.ndarray:
    """[own requests + 1] int32: a segment starts at a pack's start, at an item's first row, at a delimiter
    right after the query, and at a delimiter right after another (an empty item's)."""
    previous = np.concatenate([[QUERY_SEGMENT], segments[:-1]])  # [num_tokens]
    starts = np.zeros(segments.shape[0], dtype=bool)
    starts[cu_seqlens[:-1]] = True
    starts |= (segments >= 0) & (previous != segments)
    starts |= (segments == DELIMITER_SEGMENT) & (previous < 0)  # after the query or after a delimiter
    return np.concatenate([np.flatnonzero(starts), [segments.shape[0]]]).astype(np.int32)


def two_phase_layout(batch: Batch) -> TwoPhaseLayout:
    """Both phases' requests for a batch of inline packs (multi-item or single); refuses cached packs."""
    if any(p.query_cached for p in batch.packs):
        raise ValueError("the two-phase attention does not take packs whose query K/V come from a QueryCache")
    bounds = batch.cu_seqlens.tolist()
    qo, kv, index = [0], [0], []
    for pack_id, pack in enumerate(batch.packs):
        start, end, query = bounds[pack_id], bounds[pack_id + 1], pack.prefix_len
        qo.append(start + query)  # the query rows: one dummy key (the pack's first row)
        index.append(np.asarray([start]))
        kv.append(kv[-1] + 1)
        if end > start + query:  # the non-query rows: every key of the pack's query
            qo.append(end)
            index.append(np.arange(start, start + query))
            kv.append(kv[-1] + query)
    return TwoPhaseLayout(
        own_indptr=own_segments(batch.segments, batch.cu_seqlens),
        cross_qo_indptr=np.asarray(qo, dtype=np.int32),
        cross_kv_indptr=np.asarray(kv, dtype=np.int32),
        cross_kv_index=np.concatenate(index).astype(np.int64),
        merged_rows=batch.segments != QUERY_SEGMENT,
    )


class TwoPhaseKernels(Protocol):
    """The three steps of one layer; `own` and `cross` return (out [rows, heads, d], lse [rows, heads] float32)."""

    def own(self, q, k, v, scaling: float | None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def cross(self, q, k, v, scaling: float | None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def merge(self, out, lse, other_out, other_lse) -> None:
        """(out, lse) merged in place with the other state on the layout's merged rows."""
        ...


class TwoPhasePlan:
    """One batch's two-phase attention: the same three steps in every layer, on torch or FlashInfer kernels."""

    def __init__(self, layout: TwoPhaseLayout, kernels: TwoPhaseKernels, device: torch.device) -> None:
        self._kernels = kernels
        self._index = torch.from_numpy(layout.cross_kv_index).to(device)  # [cross keys]

    def attend(self, query, key, value, scaling, sliding_window, softcap=None, layer=0):
        """own (causal per segment) and cross (non-query rows over their query's K/V), merged by LSE."""
        if sliding_window is not None or softcap is not None:
            raise SettingError(
                "EngineConfig.backend",
                "flashinfer-two-phase",
                "does not apply sliding windows by position or attention-logit soft-capping",
            )
        q = query[0].transpose(0, 1)  # [num_tokens, heads, head_dim] (a strided view)
        k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [num_tokens, kv_heads, head_dim]
        out, lse = self._kernels.own(q, k, v, scaling)
        cross_k, cross_v = (
            k.index_select(0, self._index),
            v.index_select(0, self._index),
        )  # [keys, kv_heads, d]
        cross_out, cross_lse = self._kernels.cross(q, cross_k, cross_v, scaling)
        self._kernels.merge(out, lse, cross_out, cross_lse)
        return out.unsqueeze(0)  # [1, num_tokens, heads, head_dim]


def ragged_attention(
    q: torch.Tensor,  # [rows, heads, head_dim]
    k: torch.Tensor,  # [keys, kv_heads, head_dim]
    v: torch.Tensor,  # [keys, kv_heads, head_dim]
    qo_indptr: np.ndarray,
    kv_indptr: np.ndarray,
    causal: bool,
    scaling: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # [rows, heads, head_dim] in q's dtype, [rows, heads] float32
    """Each request's rows over its keys in float32 (causal: aligned bottom-right, as FlashInfer's ragged
    prefill), with the natural-log LSE of each row's logits."""
    heads, scale = q.shape[1], q.shape[-1] ** -0.5 if scaling is None else scaling
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for i in range(len(qo_indptr) - 1):
        rows, keys = (
            slice(int(qo_indptr[i]), int(qo_indptr[i + 1])),
            slice(int(kv_indptr[i]), int(kv_indptr[i + 1])),
        )
        qi = q[rows].float()  # [n, heads, d]
        ki, vi = (
            x[keys].float().repeat_interleave(heads // x.shape[1], dim=1) for x in (k, v)
        )  # [m, heads, d]
        logits = torch.einsum("nhd,mhd->hnm", qi, ki) * scale  # [heads, n, m]
        if causal:
            n, m = qi.shape[0], ki.shape[0]
            logits = logits.masked_fill(~torch.ones(n, m, dtype=torch.bool).tril(m - n), float("-inf"))
        row_lse = torch.logsumexp(logits, dim=-1)  # [heads, n]
        out[rows] = torch.einsum("hnm,mhd->nhd", torch.exp(logits - row_lse[..., None]), vi)
        lse[rows] = row_lse.transpose(0, 1)
    return out.to(q.dtype), lse


def merge_lse(out, lse, other_out, other_lse, rows: torch.Tensor) -> None:
    """(out [rows, heads, d], lse [rows, heads]) ← both states merged by natural-log LSE where rows (bool)."""
    top = torch.maximum(lse[rows], other_lse[rows])  # [merged, heads]
    mine, other = torch.exp(lse[rows] - top), torch.exp(other_lse[rows] - top)
    total = mine + other
    merged = (out[rows].float() * mine[..., None] + other_out[rows].float() * other[..., None]) / total[
        ..., None
    ]
    out[rows] = merged.to(out.dtype)
    lse[rows] = top + torch.log(total)


class TorchTwoPhase:
    """The torch kernels of the two phases: the CPU reference (float32 arithmetic, any dtype in and out)."""

    def __init__(self, layout: TwoPhaseLayout, device: torch.device) -> None:
        self._layout = layout
        self._rows = torch.from_numpy(layout.merged_rows).to(device)

    def own(self, q, k, v, scaling):
        """Causal attention within each own segment."""
        indptr = self._layout.own_indptr
        return ragged_attention(q, k, v, indptr, indptr, True, scaling)

    def cross(self, q, k, v, scaling):
        """Every row over its request's gathered keys, no mask."""
        layout = self._layout
        return ragged_attention(q, k, v, layout.cross_qo_indptr, layout.cross_kv_indptr, False, scaling)

    def merge(self, out, lse, other_out, other_lse) -> None:
        """Merge on the non-query rows."""
        merge_lse(out, lse, other_out, other_lse, self._rows)


def reference_plan(batch: Batch, device: torch.device) -> TwoPhasePlan:
    """The CPU reference of the two-phase form for one batch."""
    layout = two_phase_layout(batch)
    return TwoPhasePlan(layout, TorchTwoPhase(layout, device), device)
