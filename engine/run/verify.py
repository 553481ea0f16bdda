"""EngineConfig.verify: a few items of a run, chosen at random (seeded) across it, scored again as their own
single-item sequences through the reference path (sdpa attention, torch ops, the run's dtype and weights) and
compared with the scores the run gave them (docs/semantics.md, Verify).

A Verifier sees every call's plan and results (Scorer.run), keeps a seeded reservoir of `count` scored items
(their reference sequence and the run's scores), and re-scores them once at the end (verify()): the largest
|run − reference| over the items' scores, judged against the dtype's bound (VERIFY_BOUNDS, times the larger of 1
and |reference|); beyond it, one warning names the items and the result says ok False. Packed decoder runs only
(an encoder runs its own attention); items of a truncate="chunk" run are not sampled (they are aggregates).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from score_batch.engine.attention.sdpa import SdpaBackend
from score_batch.engine.native.fp8 import Fp8Linear
from score_batch.engine.native.ops import TorchOps
from score_batch.engine.plan.batching import make_batches
from score_batch.engine.plan.packing import ItemRef, single_pack
from score_batch.engine.run.compiled import OpaquePlan
from score_batch.engine.run.heads import score_and_pool

log = logging.getLogger(__name__)

DEFAULT_ITEMS = 16  # verify=None on a GPU kernel path
SEED = 0
# |run − reference| allowed per score, times max(1, |reference|): float32 kernels agree to ~1e-6 on the tiny
# models; a bf16 model's scores through two kernel arrangements 0.018 (tests/gpu/common.SAME_MODEL_SCORES 3e-2)
VERIFY_BOUNDS = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
# FP8 GEMMs against the bf16 reference: e4m3 rounds each operand by up to 2^-4 of its value (docs/semantics.md, FP8)
FP8_BOUND = 1e-1
# The default's cost cap: the re-scored tokens at most this share of the tokens the run computed, each counted
# twice (the reference path's torch ops and dense sdpa: ~2x the fast path's time per token at the goal shape),
# at least one item. An explicit count is kept whole.
COST_SHARE = 0.01
REFERENCE_COST = 2.0


def make_verifier(asked: int | None, setup) -> Verifier:
    """The Verifier of a loaded setup: verify_count's items, the default's capped by cost."""
    return Verifier(verify_count(asked, setup), capped=asked is None)


def verify_count(asked: int | None, setup) -> int:
    """Items to verify: as asked; None → DEFAULT_ITEMS where a packed run takes a GPU kernel path (CUDA with a
    backend other than sdpa, or FlashInfer's ops), else 0 (the CPU reference path)."""
    if asked is not None:
        return asked
    fast = setup.device.type == "cuda" and (setup.backend != "sdpa" or setup.ops == "flashinfer")
    fast = fast or getattr(setup, "fp8", "none") != "none"
    return DEFAULT_ITEMS if fast and setup.runner == "packed" else 0


@dataclass
class Sample:
    """One sampled item: where it was (call, group, item), its reference sequence and the run's scores."""

    name: str
    sequence: list[int]
    scores: np.ndarray  # [num_scores] float32


class Verifier:
    """A seeded reservoir of a run's scored items, re-scored through the reference path by verify()."""

    def __init__(self, count: int, capped: bool = False, seed: int = SEED) -> None:
        self.count = count
        self._capped = capped  # the default count: trimmed to COST_SHARE of the run's tokens
        self._tokens = 0  # tokens the run computed (its plans' packed tokens)
        self._rng = np.random.default_rng(seed)
        self._seen = 0  # candidates offered so far
        self._calls = 0
        self.samples: list[Sample] = []

    def observe(self, plan, results) -> None:
        """Offer a call's scored items (Algorithm R over the whole run; the reservoir holds `count`)."""
        self._calls += 1
        self._tokens += getattr(getattr(plan, "stats", None), "packed_tokens", 0)
        if self.count <= 0 or getattr(plan, "chunked", None) is not None or not hasattr(plan, "scored"):
            return
        refs = [ItemRef(g, i) for g, r in enumerate(results) for i, e in enumerate(r.failures) if e is None]
        if not refs:
            return
        order = self._seen + np.arange(len(refs))  # each candidate's index in the run
        slots = np.where(order < self.count, order, self._rng.integers(0, order + 1))  # [candidates]
        self._seen += len(refs)
        for ref, slot in zip(refs, slots.tolist()):
            if slot >= self.count:
                continue
            scores = results[ref.group].scores[ref.item]
            if not np.isfinite(scores).all():
                continue
            sequence = plan.scored[ref.group].reference_sequence(ref.item)
            sample = Sample(f"call {self._calls} group {ref.group} item {ref.item}", sequence, scores.copy())
            if slot < len(self.samples):
                self.samples[slot] = sample
            else:
                self.samples.append(sample)

    def verify(self, runner) -> dict:
        """Re-score the samples through the reference path: the report's `verify` object, warned about when
        an item differs beyond the bound."""
        started = time.perf_counter()
        if self._capped:
            self.samples = self._within_budget()
        dtype, fp8 = runner.setup.dtype, runner.setup.fp8 != "none"
        bound = FP8_BOUND if fp8 else VERIFY_BOUNDS.get(dtype, VERIFY_BOUNDS[torch.bfloat16])
        result = {"items": len(self.samples), "max_abs_diff": None, "bound": bound, "ok": True}
        weights = " weights and GEMMs" if fp8 else ""
        result.update(path=f"sdpa, torch ops, {str(dtype).removeprefix('torch.')}{weights}", failed_items=[])
        if self.samples:
            reference = reference_scores(runner, [s.sequence for s in self.samples])  # [samples, num_scores]
            run = np.stack([s.scores for s in self.samples])
            difference = np.abs(run - reference)
            beyond = (difference > bound * np.maximum(1.0, np.abs(reference))).any(axis=1)  # [samples]
            failed = [s.name for s, bad in zip(self.samples, beyond) if bad]
            result.update(max_abs_diff=float(difference.max()), ok=not failed, failed_items=failed)
            if fp8:  # the ranking the FP8 scores keep over the verified items (Spearman ρ of `score`)
                index = runner.planner.cfg.score_index
                result["rank_agreement"] = rank_agreement(run[:, index], reference[:, index])
            if failed:
                log.warning(
                    "verify: %d of %d items scored again through the reference path (%s) differ by up to %.3g, "
                    "beyond the %s bound %g: %s",
                    len(failed), len(self.samples), result["path"], result["max_abs_diff"],
                    str(dtype).removeprefix("torch."), bound, ", ".join(failed),
                )  # fmt: skip
        result["seconds"] = round(time.perf_counter() - started, 3)
        return result

    def _within_budget(self) -> list[Sample]:
        """The samples (in random slot order) whose tokens stay within COST_SHARE of the run's; at least one."""
        budget = COST_SHARE * self._tokens / REFERENCE_COST
        used = np.cumsum([len(s.sequence) for s in self.samples])  # [samples]
        return self.samples[: max(1, int(np.searchsorted(used, budget, side="right")))]


def reference_scores(runner, sequences: list[list[int]]) -> np.ndarray:  # [sequences, num_scores] float32
    """Each sequence alone (its own pack) through the runner's model with sdpa attention and torch ops."""
    setup, model = runner.setup, runner.model
    device, backend = setup.device, SdpaBackend(setup.device)
    packs = [single_pack(sequence, ItemRef(0, k)) for k, sequence in enumerate(sequences)]
    out = np.full((len(sequences), setup.num_scores), np.nan, np.float32)
    labels = torch.tensor(setup.label_ids, dtype=torch.long, device=device)
    causal = setup.info.kind == "causal"
    with torch.inference_mode(), torch_ops(model.backbone):
        for batch in make_batches(packs, setup.limits.max_batch_tokens):
            ids, positions, rows = (
                torch.from_numpy(a).to(device) for a in (batch.token_ids, batch.positions, batch.score_rows)
            )
            plan = backend.plan(batch, device)
            plan = OpaquePlan(plan) if runner.compiled else plan  # as the run's compiled modules take it
            hidden = model.hidden_rows(
                ids, positions, int(batch.positions.max()), plan, rows
            )  # [items, hidden]
            _, scores, _ = score_and_pool(
                hidden, runner.planner.cfg, model.head, labels if causal else None, model.final_logit_softcap
            )
            out[[ref.item for ref in batch.item_refs]] = scores.float().cpu().numpy()
    return out


def rank_agreement(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman ρ of two score vectors (ranks by argsort; None under 2 items or a constant one)."""
    if len(a) < 2:
        return None
    ra, rb = (np.argsort(np.argsort(x)).astype(np.float64) for x in (a, b))
    spread = ra.std() * rb.std()
    return None if spread == 0 else round(float(((ra - ra.mean()) * (rb - rb.mean())).mean() / spread), 6)


@contextlib.contextmanager
def torch_ops(backbone: torch.nn.Module):
    """The reference path while the block runs: the native layers' ops set to TorchOps (transformers' layers
    have none), FP8 projections on their unquantized weights."""
    swapped = [(module, module.ops) for module in backbone.modules() if hasattr(module, "ops")]
    fp8 = [module for module in backbone.modules() if isinstance(module, Fp8Linear)]
    reference = TorchOps()
    try:
        for module, _ in swapped:
            module.ops = reference
        for module in fp8:
            module.use_reference = True
        yield
    finally:
        for module, ops in swapped:
            module.ops = ops
        for module in fp8:
            module.use_reference = False
