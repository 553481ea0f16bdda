"""Decoder scoring: packed ragged batches through the backbone with our attention plan, heads on score rows."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from score_batch.engine.attention.base import to_device
from score_batch.engine.attention.query_cache import QueryCache
from score_batch.engine.attention.registry import make_backend
from score_batch.engine.errors import SettingError
from score_batch.engine.model.loading import LoadedModel
from score_batch.engine.model.setup import ResolvedSetup
from score_batch.engine.plan.batching import Batch, collate
from score_batch.engine.plan.packing import single_pack
from score_batch.engine.plan.planner import PackedPlan, PackedPlanner
from score_batch.engine.run.compiled import OpaquePlan, compile_backbone
from score_batch.engine.run.heads import score_and_pool
from score_batch.engine.run.results import ResultTable, non_finite_rows
from score_batch.engine.text.chunking import ItemCountdown, aggregate
from score_batch.engine.types import GroupResult

log = logging.getLogger(__name__)

# raw [rows, scores], scores [rows, scores], pooled [rows, hidden] or None
Outputs = tuple[np.ndarray, np.ndarray, np.ndarray | None]


class PackedRunner:
    """Runs PackedPlans of one loaded decoder (CausalLM or sequence classifier)."""

    def __init__(
        self, model: LoadedModel, planner: PackedPlanner, setup: ResolvedSetup, compile: bool
    ) -> None:
        self.model = model
        self.planner = planner
        self.setup = setup
        self.backend = make_backend(setup.backend, setup.device)
        self._label_ids = torch.tensor(setup.label_ids, dtype=torch.long, device=setup.device)
        self.compiled: list[str] = []  # the backbone modules torch.compile runs (EngineConfig.compile)
        if compile:
            self.compiled = compile_backbone(model.backbone, 0 if model.native else 1)
            if not self.compiled:
                raise SettingError(
                    "EngineConfig.compile",
                    compile,
                    f"finds no decoder layers with norms, MLPs or attention modules in {setup.info.architecture}",
                )
            log.info(
                "compiling %d modules of %s (norms, MLPs, attention around the kernel); token count dynamic",
                len(self.compiled),
                setup.info.architecture,
            )

    def run(self, plan: PackedPlan, on_items: Callable[[int], None] | None = None) -> list[GroupResult]:
        """Run a plan's batches and assemble per-group results in input order (start, then its results)."""
        return self.start(plan, on_items).results()

    def run_sequences(
        self, plan: PackedPlan, on_items: Callable[[int], None] | None = None
    ) -> list[GroupResult]:
        """run() before aggregation: one result row per scored sequence (plan.scored's items; under
        truncate="chunk" every chunk, else every item)."""
        return self.start(plan, on_items).sequences()

    def start(self, plan: PackedPlan, on_items: Callable[[int], None] | None = None) -> PlanRun:
        """Launch a plan's first batch; the PlanRun launches the rest (launch_rest) and gives the results."""
        return PlanRun(self, plan, on_items)

    def _store(
        self,
        plan: PackedPlan,
        launched: Launched,
        table: ResultTable,
        countdown: ItemCountdown,
        on_items: Callable[[int], None] | None,
    ) -> int:
        """Wait for a launched batch's outputs and store them (one assignment for the batch); the items of a pack
        with a non-finite output are scored again alone. Returns how many were."""
        batch = launched.batch
        raw, scores, pooled = launched.read()
        rows = table.rows(batch.item_refs)  # [num_items] flat result rows
        bad = non_finite_rows(raw)  # [num_items]
        rescored = 0
        if bad.any():
            pack_of_row = np.repeat(np.arange(len(batch.packs)), [len(p.item_refs) for p in batch.packs])
            bad = np.isin(pack_of_row, pack_of_row[bad])  # every row of a pack with a non-finite row
            for ref in (ref for ref, b in zip(batch.item_refs, bad) if b):
                self._score_alone(plan, ref, table)
            rescored = int(bad.sum())
            good = ~bad
            rows, raw, scores = rows[good], raw[good], scores[good]
            pooled = None if pooled is None else pooled[good]
        table.put_rows(rows, raw, scores, pooled)
        if on_items is not None:
            repeats = tuple(r for ref in batch.item_refs for r in plan.copies.get(ref, ()))
            on_items(countdown.finished(batch.item_refs + repeats))
        return rescored

    def _score_alone(self, plan: PackedPlan, ref, table: ResultTable) -> None:
        """Score one item as its own reference sequence in its own batch; fail it if still non-finite."""
        sequence = plan.scored[ref.group].reference_sequence(ref.item)
        raw, scores, pooled = self._launch(collate([single_pack(sequence, ref)])).read()
        if non_finite_rows(raw)[0]:
            table.fail(ref, raw[0], plan.item_name(ref))
        else:
            table.put(ref, raw[0], scores[0], None if pooled is None else pooled[0])

    def _launch(self, batch: Batch, cache: QueryCache | None = None) -> Launched:
        """One prefill-only forward over a ragged batch, queued on the device with its outputs' copy back to the
        host; heads run on the score rows only. Nothing here waits for the device."""
        device = self.setup.device
        input_ids = to_device(batch.token_ids, device)  # [num_tokens]
        positions = to_device(batch.positions, device)  # [num_tokens]
        score_rows = to_device(batch.score_rows, device)  # [num_items]
        plan = self.backend.plan(batch, device, cache)
        if self.compiled:
            plan = OpaquePlan(plan)  # compiled attention modules break their graph at attend, untraced
        max_position = int(batch.positions.max())  # host metadata: no device sync
        # [num_items, hidden]
        rows = self.model.hidden_rows(input_ids, positions, max_position, plan, score_rows)
        causal = self.setup.info.kind == "causal"
        raw, scores, pooled = score_and_pool(
            rows,
            self.planner.cfg,
            self.model.head,
            self._label_ids if causal else None,
            self.model.final_logit_softcap,
        )  # [num_items, num_scores] ×2, [num_items, hidden] or None
        return Launched.of(batch, raw, scores, pooled)


class PlanRun:
    """One plan on the device (PackedRunner.start): its first batch launched when made, the rest by launch_rest,
    its per-group results in input order by results. A pack with a non-finite output has each of its items
    scored again alone (its own reference sequence, its own batch), so a NaN that leaked through masked
    attention cannot cost a neighbour its score; only items non-finite on their own become item errors. Under
    truncate="chunk" each item's chunks are aggregated into its one result (engine/text/chunking.py), with
    their count in `chunks`. on_items counts finished input items.

    The device never waits for the host between batches: each batch is launched before the previous one's
    outputs are read (on CUDA they come back through pinned buffers, copied behind the forward; on the CPU the
    launch is the forward itself), so the next batch's host work (its attention plan, its inputs) overlaps the
    device's work on the previous one; between plans, the next plan's first batch can be launched (its start)
    before this one's last outputs are read (results)."""

    def __init__(
        self, runner: PackedRunner, plan: PackedPlan, on_items: Callable[[int], None] | None
    ) -> None:
        self.runner, self.plan, self.on_items = runner, plan, on_items
        self.table = ResultTable(
            [len(group.item_ids) for group in plan.scored],
            runner.setup.num_scores,
            runner.setup.info.hidden_size if runner.planner.cfg.pooled_hidden_states else None,
        )
        self.countdown = ItemCountdown(plan.chunked)
        self.rescored = 0
        self.cache = QueryCache(plan.batches)  # the queries of groups whose later packs run without them
        self._batches = iter(plan.batches)
        self._launched: Launched | None = None
        with torch.inference_mode():
            self._launch_next()

    def _launch_next(self) -> bool:
        """Launch the next batch, then read the one before it; False when every batch is launched."""
        batch = next(self._batches, None)
        if batch is None:
            return False
        previous, self._launched = self._launched, self.runner._launch(batch, self.cache)
        self.cache.release(batch)  # stream-ordered: what the launched batch reads stays until it ran
        if previous is not None:
            self._store(previous)
        return True

    def _store(self, launched: Launched) -> None:
        self.rescored += self.runner._store(self.plan, launched, self.table, self.countdown, self.on_items)

    def launch_rest(self) -> None:
        """Launch every batch not launched yet (reading each one's predecessor); the last stays unread."""
        with torch.inference_mode():
            while self._launch_next():
                pass

    def results(self) -> list[GroupResult]:
        """Every batch launched and read, and the per-group results (chunks aggregated)."""
        results = self.sequences()
        plan, cfg = self.plan, self.runner.planner.cfg
        if plan.chunked is None:
            return results
        errors = [g.errors for g in plan.tokenized]
        return aggregate(results, plan.chunked, errors, cfg.chunk_aggregate)

    def sequences(self) -> list[GroupResult]:
        """Every batch launched and read, and one result row per scored sequence (plan.scored's items)."""
        self.launch_rest()
        if self._launched is not None:
            with torch.inference_mode():
                self._store(self._launched)
            self._launched = None
        if self.rescored:
            log.warning(
                "%d items shared a pack with a non-finite output and were scored again alone", self.rescored
            )
        plan, setup, cfg = self.plan, self.runner.setup, self.runner.planner.cfg
        self.table.copy(plan.copies, plan.item_name)  # duplicate (query, item) pairs: scored once
        errors = [group.errors for group in plan.scored]
        return self.table.results(errors, setup.activation, cfg.score_index)


class Launched:
    """A batch whose forward is queued: its outputs' host copies, readable once `ready` has passed (CUDA)."""

    def __init__(self, batch: Batch, host: tuple, ready: torch.cuda.Event | None) -> None:
        self.batch = batch
        self._host = host  # (raw, scores, pooled or None) host tensors, pinned on CUDA
        self._ready = ready

    @classmethod
    def of(cls, batch: Batch, *outputs: torch.Tensor | None) -> Launched:
        """Copy device outputs back behind the forward (pinned buffers, non-blocking, then an event); CPU
        outputs are the host tensors already, so the CPU path copies nothing."""
        if all(t is None or t.device.type == "cpu" for t in outputs):
            return cls(batch, outputs, None)
        host = tuple(None if t is None else _pinned_copy(t) for t in outputs)
        ready = torch.cuda.Event()
        ready.record()
        return cls(batch, host, ready)

    def read(self) -> Outputs:
        """(raw, scores, pooled) as numpy arrays, once the device has written them."""
        if self._ready is not None:
            self._ready.synchronize()
        return tuple(None if t is None else t.numpy() for t in self._host)


def _pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A pinned host tensor that a copy queued behind the device's work fills."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=True)
