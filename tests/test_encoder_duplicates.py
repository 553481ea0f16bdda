"""Encoder cross-encoders dedupe as decoders do: a (query, item) pair repeated within a call is run once and
its outputs copied bit for bit to every repeat (PairPlan.copies); the report counts the copies."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from score_batch.engine import Group
from score_batch.engine.plan.packing import ItemRef
from tests.reference import max_abs_diff, tokenizer
from tests.test_cli import run_cli, write_jsonl
from tests.test_scorer import make_scorer

GROUPS = [
    Group("Tokyo is a city in", [" Japan", " the country of the rising sun", " Japan", " yes"]),
    Group("Tokyo is a city in", [" yes", " no"]),  # the same query again (another id): " yes" repeats
    Group("the quick brown fox", [" Japan", " Japan"]),  # another query: a new pair, then its repeat
]


@pytest.fixture(scope="module")
def bert(zoo):
    return zoo.get("bert", "classifier")


def plain_logits(model_dir, pairs: list[tuple[str, str]]) -> np.ndarray:
    """[pairs, labels] a plain Hugging Face forward of each (query, item) pair alone, fp32, eager."""
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = tokenizer(str(model_dir))
    rows = []
    with torch.no_grad():
        for query, item in pairs:
            encoded = tok(query, item, return_tensors="pt")
            rows.append(model(**encoded).logits[0].numpy())
    return np.stack(rows)


def test_a_repeated_pair_is_run_once_and_copied_bit_for_bit(bert):
    scorer = make_scorer(bert, "classifier", backend="auto", pooled_hidden_states=True, max_batch_tokens=32)
    plan = scorer.plan(GROUPS)
    assert plan.copies == {
        ItemRef(0, 0): (ItemRef(0, 2),),
        ItemRef(0, 3): (ItemRef(1, 0),),
        ItemRef(2, 0): (ItemRef(2, 1),),
    }
    assert (plan.stats.duplicates, plan.stats.sequences, plan.stats.items) == (3, 5, 8)
    batched = [ref for batch in plan.batches for ref in batch.item_refs]
    assert len(batched) == 5 and not {ref for refs in plan.copies.values() for ref in refs} & set(batched)
    counted = []
    results = scorer.run(plan, counted.append)
    assert sum(counted) == 8  # progress counts every item, repeats included
    for (g, i), (h, j) in [((0, 0), (0, 2)), ((0, 3), (1, 0)), ((2, 0), (2, 1))]:
        assert results[g].scores[i].tobytes() == results[h].scores[j].tobytes()
        assert results[g].pooled[i].tobytes() == results[h].pooled[j].tobytes()
    expected = plain_logits(bert, [(g.query, item) for g in GROUPS for item in g.items])
    assert max_abs_diff(expected, np.concatenate([r.scores for r in results])) <= 1e-4


def test_a_window_with_repeats_scores_each_distinct_pair_once(bert, tmp_path):
    distinct = [
        {"query": f"query {q} about Tokyo", "item": " the city" * (1 + (3 * q + i) % 4)}
        for q in range(3)
        for i in range(4)
    ]
    repeats = [distinct[k] for k in (0, 5, 5, 11, 2, 0)]
    rows = distinct[:6] + repeats[:3] + distinct[6:] + repeats[3:]
    keys = {(row["query"], row["item"]) for row in rows}
    src, out, report = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "o.parquet", tmp_path / "r.json"
    # a small batch budget: the pairs and their repeats would land in batches of other widths
    ran = run_cli(src, "-o", out, "--model", bert, "--max-batch-tokens", "40", "--report", report)
    assert ran.returncode == 0, ran.stderr
    written = json.loads(report.read_text())
    n, d = len(rows), len(keys)
    assert (written["items"], written["items_scored"], written["duplicates"], written["sequences"]) == (
        n, d, n - d, d,
    )  # fmt: skip
    summary = ran.stderr.strip().splitlines()[-1]
    assert f"scored {d} items from {n} rows" in summary and f"{n - d} duplicate pairs scored once" in summary
    table = pq.read_table(out)
    values = defaultdict(set)  # score key → the distinct (score, scores) bits it holds
    for key, score, scores in zip(*(table[c].to_pylist() for c in ("score_key", "score", "scores"))):
        values[key].add((np.float32(score).tobytes(), np.asarray(scores, np.float32).tobytes()))
    assert len(values) == d and all(len(held) == 1 for held in values.values())
    expected = plain_logits(bert, [(row["query"], row["item"]) for row in rows])
    assert max_abs_diff(expected, np.asarray(table["scores"].to_pylist(), np.float32)) <= 1e-4
