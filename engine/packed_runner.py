"""Decoder scoring: packed ragged batches through the backbone with our attention plan, heads on score rows."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from score_batch.engine.attention.query_cache import QueryCache
from score_batch.engine.attention.registry import make_backend
from score_batch.engine.batching import Batch, collate
from score_batch.engine.chunking import ItemCountdown, aggregate
from score_batch.engine.compiled import OpaquePlan, compile_backbone
from score_batch.engine.config import ScoringConfig
from score_batch.engine.errors import SettingError
from score_batch.engine.heads import classifier_scores, label_scores, pooled_vectors
from score_batch.engine.models import LoadedModel
from score_batch.engine.packing import single_pack
from score_batch.engine.planner import PackedPlan, PackedPlanner
from score_batch.engine.results import ResultTable, non_finite_rows
from score_batch.engine.setup import ResolvedSetup
from score_batch.engine.types import Group, GroupResult

log = logging.getLogger(__name__)

Outputs = tuple[
    np.ndarray, np.ndarray, np.ndarray | None
]  # raw [rows, scores], scores [rows, scores], pooled


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

    @property
    def cfg(self) -> ScoringConfig:
        """The scoring settings the planner packs with."""
        return self.planner.cfg

    def plan(self, groups: list[Group]) -> PackedPlan:
        """Tokenize, pack and batch groups without running the model."""
        return self.planner.plan(groups)

    def run(self, plan: PackedPlan, on_items: Callable[[int], None] | None = None) -> list[GroupResult]:
        """Run a plan's batches and assemble per-group results in input order.

        A pack with a non-finite output has each of its items scored again alone (its own reference
        sequence, its own batch), so a NaN that leaked through masked attention cannot cost a neighbour its
        score; only items non-finite on their own become item errors. Under truncate="chunk" each item's
        windows are aggregated into its one result (engine/chunking.py), with the window count in `chunks`.
        """
        results = self.run_windows(plan, on_items)
        if plan.chunked is None:
            return results
        errors = [g.errors for g in plan.tokenized]
        return aggregate(results, plan.chunked, errors, self.cfg.chunk_aggregate)

    def run_windows(
        self, plan: PackedPlan, on_items: Callable[[int], None] | None = None
    ) -> list[GroupResult]:
        """run() before aggregation: one result row per scored sequence (plan.scored_group's items; under
        truncate="chunk" every window, else every item). on_items counts finished input items."""
        cfg = self.cfg
        table = ResultTable(
            [len(plan.scored_group(g).item_ids) for g in range(len(plan.tokenized))],
            self.setup.num_scores,
            self.setup.info.hidden_size if cfg.pooled_hidden_states else None,
        )
        countdown = ItemCountdown(plan.chunked)
        rescored = 0
        cache = QueryCache(plan.batches)  # the queries of groups whose later packs run without them
        with torch.inference_mode():
            for batch in plan.batches:
                raw, scores, pooled = self._forward(batch, cache)
                cache.release(batch)
                bad = non_finite_rows(raw)  # [rows]
                row = 0
                for pack in batch.packs:
                    rows = range(row, row + len(pack.item_refs))
                    row += len(pack.item_refs)
                    if bad[rows.start : rows.stop].any():
                        rescored += len(rows)
                        for ref in pack.item_refs:
                            self._score_alone(plan, ref, table)
                        continue
                    for r, ref in zip(rows, pack.item_refs):
                        table.put(ref, raw[r], scores[r], None if pooled is None else pooled[r])
                if on_items is not None:
                    repeats = tuple(r for ref in batch.item_refs for r in plan.copies.get(ref, ()))
                    on_items(countdown.finished(batch.item_refs + repeats))
        if rescored:
            log.warning(
                "%d items shared a pack with a non-finite output and were scored again alone", rescored
            )
        for original, repeats in plan.copies.items():  # duplicate (query, item) pairs: scored once
            for repeat in repeats:
                table.copy(original, repeat, plan.item_name(repeat))
        errors = [plan.scored_group(g).errors for g in range(len(plan.tokenized))]
        return table.results(errors, self.setup.activation, cfg.score_index)

    def _score_alone(self, plan: PackedPlan, ref, table: ResultTable) -> None:
        """Score one item as its own reference sequence in its own batch; fail it if still non-finite."""
        sequence = plan.scored_group(ref.group).reference_sequence(ref.item)
        raw, scores, pooled = self._forward(collate([single_pack(sequence, ref)]))
        if non_finite_rows(raw)[0]:
            table.fail(ref, raw[0], plan.item_name(ref))
        else:
            table.put(ref, raw[0], scores[0], None if pooled is None else pooled[0])

    def _forward(self, batch: Batch, cache: QueryCache | None = None) -> Outputs:
        """One prefill-only forward over a ragged batch; heads run on the score rows only."""
        device = self.setup.device
        input_ids = torch.from_numpy(batch.token_ids).to(device, non_blocking=True)  # [num_tokens]
        positions = torch.from_numpy(batch.positions).to(device, non_blocking=True)  # [num_tokens]
        score_rows = torch.from_numpy(batch.score_rows).to(device, non_blocking=True)  # [num_items]
        plan = self.backend.plan(batch, device, cache)
        if self.compiled:
            plan = OpaquePlan(plan)  # compiled attention modules break their graph at attend, untraced
        max_position = int(batch.positions.max())  # host metadata: no device sync
        rows = self.model.hidden_rows(
            input_ids, positions, max_position, plan, score_rows
        )  # [num_items, hidden]
        cfg = self.cfg
        head = self.model.head
        if self.setup.info.kind == "causal":
            scores = label_scores(
                rows,
                head.weight,
                head.bias,
                self._label_ids,
                cfg.apply_softmax,
                self.model.final_logit_softcap,
                label_score=cfg.label_score,
            )  # [num_items, num_labels]
            raw = scores
        else:
            raw = head(rows).float()  # [num_items, num_labels] logits
            scores = classifier_scores(raw, cfg.apply_softmax)
        pooled = pooled_vectors(rows, cfg.normalize).cpu().numpy() if cfg.pooled_hidden_states else None
        return raw.cpu().numpy(), scores.cpu().numpy(), pooled
