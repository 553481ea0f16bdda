"""The packed runner's batch loop: each batch launched before the previous one's outputs are read, outputs stored a
batch at a time (ResultTable.put_rows) bit for bit as item-by-item puts, scores as plain HF's."""

from __future__ import annotations

import numpy as np

from score_batch.engine.activation import ResolvedActivation
from score_batch.engine.plan.packing import ItemRef
from score_batch.engine.run.results import ResultTable
from tests.test_scorer import GROUPS, assert_matches_reference, make_scorer


def test_put_rows_stores_bit_for_bit_what_item_by_item_puts_store():
    rng = np.random.default_rng(0)
    counts = [3, 0, 5, 1]
    refs = [ItemRef(g, i) for g, n in enumerate(counts) for i in range(n)]
    order = rng.permutation(len(refs))[:7]  # a batch holds some items, in any order; the others stay NaN
    raw, scores, pooled = (rng.standard_normal((7, width)).astype(np.float32) for width in (2, 2, 6))
    raw[2, 1] = np.inf
    by_item, by_batch = ResultTable(counts, 2, 6), ResultTable(counts, 2, 6)
    for row, index in enumerate(order):
        by_item.put(refs[index], raw[row], scores[row], pooled[row])
    picked = [refs[i] for i in order]
    by_batch.put_rows(by_batch.rows(picked), raw, scores, pooled)
    assert by_batch.rows(picked).tolist() == [[0, 3, 3, 8][r.group] + r.item for r in picked]
    errors = [[None] * n for n in counts]
    none = ResolvedActivation("none", "as stored")
    item_results, batch_results = (table.results(errors, none, -1) for table in (by_item, by_batch))
    for name in ("raw", "scores", "pooled"):
        for a, b in zip(item_results, batch_results):
            a, b = getattr(a, name), getattr(b, name)
            assert a.shape == b.shape and a.view(np.uint32).tobytes() == b.view(np.uint32).tobytes()
    assert sum(np.isnan(r.scores).all(axis=1).sum() for r in batch_results) == len(refs) - 7


def test_each_batch_is_launched_before_the_previous_ones_outputs_are_read(qwen3_causal, monkeypatch):
    scorer = make_scorer(qwen3_causal, max_batch_tokens=24, max_pack_tokens=24)
    plan = scorer.plan(GROUPS)
    batches = len(plan.batches)
    assert batches >= 3
    events = []
    model = scorer._runner.model
    forward = model.hidden_rows

    def launch(*args):
        events.append("launch")
        return forward(*args)

    put_rows = ResultTable.put_rows

    def store(self, rows, *outputs):
        events.append("store")
        return put_rows(self, rows, *outputs)

    monkeypatch.setattr(model, "hidden_rows", launch)
    monkeypatch.setattr(ResultTable, "put_rows", store)
    results = scorer.run(plan)
    assert events == ["launch", "launch", "store"] + ["launch", "store"] * (batches - 2) + ["store"]
    assert_matches_reference(qwen3_causal, "causal", GROUPS, results)
