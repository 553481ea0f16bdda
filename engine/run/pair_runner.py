"""Encoder cross-encoders: padded (query, item) pair batches through the model's own forward."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from score_batch.engine.model.loading import LoadedModel
from score_batch.engine.model.setup import ResolvedSetup
from score_batch.engine.plan.planner import PairPlan, PairPlanner
from score_batch.engine.run.heads import score_and_pool
from score_batch.engine.run.packed_runner import Outputs
from score_batch.engine.run.results import ResultTable, non_finite_rows
from score_batch.engine.text.pairs import PairBatch, pad_pairs
from score_batch.engine.types import GroupResult


class PairRunner:
    """Runs PairPlans of one loaded encoder cross-encoder (its own attention over padded pairs)."""

    def __init__(self, model: LoadedModel, planner: PairPlanner, setup: ResolvedSetup) -> None:
        self.model = model
        self.planner = planner
        self.setup = setup
        self.backend = None  # no attention plan: the model's own attention
        self.compiled: list[str] = []  # encoders are never compiled (refused at setup)

    def run(self, plan: PairPlan, on_items: Callable[[int], None] | None = None) -> list[GroupResult]:
        """Run a plan's batches; a non-finite row is scored again alone and fails only if it stays so; a repeated
        pair gets its first's outputs bit for bit (plan.copies)."""
        cfg = self.planner.cfg
        table = ResultTable(
            [len(g.item_ids) for g in plan.tokenized],
            self.setup.num_scores,
            self.setup.info.hidden_size if cfg.pooled_hidden_states else None,
        )
        with torch.inference_mode():
            for batch in plan.batches:
                raw, scores, pooled = self._forward(batch)
                good = ~non_finite_rows(raw)  # [rows]
                rows = table.rows(batch.item_refs)[good]
                table.put_rows(rows, raw[good], scores[good], None if pooled is None else pooled[good])
                for ref in itertools.compress(batch.item_refs, ~good):
                    ids = plan.tokenized[ref.group].item_ids[ref.item]
                    alone = pad_pairs([ref], plan.tokenized, len(ids), self.planner.limits.pad_token_id)
                    raw1, scores1, pooled1 = self._forward(alone)
                    if non_finite_rows(raw1)[0]:
                        table.fail(ref, raw1[0])
                    else:
                        table.put(ref, raw1[0], scores1[0], None if pooled1 is None else pooled1[0])
                if on_items is not None:  # progress counts every item, repeats included
                    on_items(len(batch.item_refs) + sum(len(plan.copies.get(r, ())) for r in batch.item_refs))
        table.copy(plan.copies, plan.item_name)  # duplicate (query, item) pairs: scored once
        return table.results([g.errors for g in plan.tokenized], self.setup.activation, cfg.score_index)

    def _forward(self, batch: PairBatch) -> Outputs:
        """An encoder's own forward over padded pairs; pooled = the input of its classification head."""
        device = self.setup.device
        inputs = {
            "input_ids": torch.from_numpy(batch.input_ids).to(device),  # [rows, width]
            "attention_mask": torch.from_numpy(batch.attention_mask).to(device),  # [rows, width]
        }
        if batch.token_type_ids is not None:
            inputs["token_type_ids"] = torch.from_numpy(batch.token_type_ids).to(device)
        captured: list[torch.Tensor] = []
        hook = self.model.backbone.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
        try:
            logits = self.model.model(**inputs).logits  # [rows, num_labels]
        finally:
            hook.remove()
        cfg = self.planner.cfg
        rows = None  # [rows, hidden]: the CLS token's, or the mean over each pair's tokens
        if cfg.pooled_hidden_states:
            hidden = captured[0]  # [rows, width, hidden], the backbone's last hidden state
            if getattr(self.model.model.config, "classifier_pooling", "cls") == "mean":
                mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [rows, width, 1]
                rows = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
            else:
                rows = hidden[:, 0]
        raw, scores, pooled = score_and_pool(rows, cfg, logits=logits)
        return raw.cpu().numpy(), scores.cpu().numpy(), None if pooled is None else pooled.cpu().numpy()
