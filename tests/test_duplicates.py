"""Duplicate (query, item) pairs within one call are scored once and copied to every row that repeats them."""

from __future__ import annotations

import json

import numpy as np
from score_batch.engine import Group
from score_batch.engine.packing import ItemRef
from score_batch.engine.planner import duplicate_sequences
from score_batch.engine.tokenize import TokenizedGroup

from tests.test_cli import run_cli, write_jsonl
from tests.test_scorer import assert_matches_reference, make_scorer

GROUPS = [
    Group("Tokyo is a city in", [" Japan", " the country", " Japan", " yes"]),
    Group("Tokyo is a city in", [" yes", " no"]),  # the same query again: " yes" repeats group 0's
    Group("the quick brown fox", [" Japan", " Japan"]),  # another query: " Japan" is a new pair once
]


def test_duplicate_sequences_are_keyed_by_query_and_item_tokens():
    groups = [
        TokenizedGroup([1, 2], [[5], [6], [5], None], [None, None, None, "bad"]),
        TokenizedGroup([1, 2], [[6], [7]], [None, None]),
        TokenizedGroup([3], [[5], [5]], [None, None]),
        TokenizedGroup([1, 2], [[5]], [None], item_first=True),  # another reference sequence
    ]
    assert duplicate_sequences(groups) == {
        ItemRef(0, 0): (ItemRef(0, 2),),
        ItemRef(0, 1): (ItemRef(1, 0),),
        ItemRef(2, 0): (ItemRef(2, 1),),
    }


def test_repeats_are_scored_once_with_their_originals_outputs(qwen3_causal):
    scorer = make_scorer(qwen3_causal, pooled_hidden_states=True)
    plan = scorer.plan(GROUPS)
    assert plan.stats.duplicates == 3 and plan.stats.windows == 5
    assert sum(len(b.item_refs) for b in plan.batches) == 5  # only the first of each pair is packed
    counted = []
    results = scorer.run(plan, counted.append)
    assert sum(counted) == 8  # progress counts every item, repeats included
    assert_matches_reference(qwen3_causal, "causal", GROUPS, results)
    for (g, i), (h, j) in [((0, 0), (0, 2)), ((0, 3), (1, 0)), ((2, 0), (2, 1))]:
        assert np.array_equal(results[g].scores[i], results[h].scores[j])
        assert np.array_equal(results[g].pooled[i], results[h].pooled[j])


def test_the_report_counts_duplicates(qwen3_causal, tmp_path):
    rows = [{"query": g.query, "item": item} for g in GROUPS for item in g.items]
    src, report = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "r.json"
    result = run_cli(
        src, "-o", tmp_path / "o.jsonl", "--model", qwen3_causal, "--label-tokens", " to", "--report", report
    )
    assert result.returncode == 0, result.stderr
    written = json.loads(report.read_text())
    assert written["duplicates"] == 3 and written["items_scored"] == 8
    lines = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert lines[0]["score"] == lines[2]["score"] and lines[3]["score"] == lines[4]["score"]
