"""Duplicate (query, item) pairs within one call are scored once and copied to every row that repeats them."""

from __future__ import annotations

import json
import signal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from score_batch.engine import Group
from score_batch.engine.plan.packing import ItemRef
from score_batch.engine.plan.planner import duplicate_sequences
from score_batch.engine.types import TokenizedGroup
from score_batch.job.reuse import KEY_BYTES, ScoredPairs
from score_batch.job.windows import WindowGroups
from tests.test_cli import LABEL_FLAGS, expected_scores, run_cli, write_jsonl
from tests.test_job import many_rows, start_cli, wait_for_parts
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
    assert plan.stats.duplicates == 3 and plan.stats.sequences == 5
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
    # items_scored counts the items run through the model, not their copies
    assert written["duplicates"] == 3 and written["items_scored"] == 5 and written["rows_written"] == 8
    lines = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert lines[0]["score"] == lines[2]["score"] and lines[3]["score"] == lines[4]["score"]


def test_pairs_repeated_in_later_windows_are_copied_not_scored(qwen3_causal, tmp_path):
    """A pair seen in an earlier window (the one just before, still being scored while this one was
    prepared, or one far back) is copied bit for bit, counted once, and every score matches plain HF."""
    unique = [
        {"query": f"query {q} about Tokyo", "item": f" item {i} of the city"}
        for q in range(4)
        for i in range(3)
    ]
    repeats = [unique[0], unique[4], unique[11], unique[0]]
    rows = (
        unique[:6] + [repeats[0]] + unique[6:] + repeats[1:]
    )  # windows of 4 rows: repeats in windows 1 and 3
    src, report = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "r.json"
    out = tmp_path / "o.parquet"
    flags = ["--model", qwen3_causal, "--label-tokens", " to", "--label-tokens", " the", "--window-rows", "4"]
    result = run_cli(src, "-o", out, *flags, "--report", report)
    assert result.returncode == 0, result.stderr
    written = json.loads(report.read_text())
    assert (
        written["duplicates"] == 4
        and written["items_scored"] == 12
        and written["sequences"] == 12
        and "windows" not in written  # sequences' earlier name, dropped in report version 2
    )
    assert "4 duplicate pairs scored once" in result.stderr
    table = pq.read_table(out)
    scores = table["scores"].to_pylist()
    for k, row in enumerate(rows):  # every repeat holds the bits of the pair's first scoring
        original = min(j for j, other in enumerate(rows) if other == row)
        assert (
            np.asarray(scores[k], np.float32).tobytes() == np.asarray(scores[original], np.float32).tobytes()
        )
    reference = expected_scores(qwen3_causal, rows)
    np.testing.assert_allclose(np.asarray(scores), np.asarray(reference), atol=1e-5)


def test_scored_pairs_forget_the_oldest_past_their_budget():
    table = pa.table(
        {
            "score": [0.1, 0.2, 0.3, None],
            "scores": [[0.1], [0.2], [0.3], None],
            "score_key": ["a", "b", "c", None],
            "error": [None, None, None, "row 3: bad"],
        }
    )
    row = table.slice(0, 3).select(["score", "scores"]).nbytes / 3 + KEY_BYTES  # what one held pair costs
    pairs = ScoredPairs(budget=int(2.5 * row))  # two pairs fit
    pairs.add(table)
    grouped = WindowGroups([Group("q", ["x", "y", "z"])], [np.arange(3)])
    found = pairs.take(grouped, ["a", "b", "c"])
    assert found == {1: {"score": 0.2, "scores": [0.2]}, 2: {"score": 0.3, "scores": [0.3]}}
    assert pairs.take(grouped, ["d", "d", "d"]) == {}
    later = pa.table(
        {"score": [0.4], "scores": [[0.4]], "score_key": ["d"], "error": pa.array([None], pa.string())}
    )
    pairs.add(later)  # a later window's pair pushes out the oldest held one (b), not c
    assert pairs.take(grouped, ["b", "c", "d"]) == {
        1: {"score": 0.3, "scores": [0.3]},
        2: {"score": 0.4, "scores": [0.4]},
    }
    too_big = ScoredPairs(budget=int(0.5 * row))  # not one pair fits: none is held
    too_big.add(table)
    assert too_big.take(grouped, ["a", "b", "c"]) == {}
    wide = pa.table({"score": [0.5], "scores": [[0.5] * 10_000], "score_key": ["w"], "error": [None]})
    mixed = ScoredPairs(budget=int(2.5 * row))
    mixed.add(wide)  # a window none of whose pairs fits holds nothing, and later evictions pass over it
    mixed.add(table)
    mixed.add(later)
    assert mixed.take(grouped, ["w", "c", "d"]) == {
        1: {"score": 0.3, "scores": [0.3]},
        2: {"score": 0.4, "scores": [0.4]},
    }


@pytest.mark.slow
def test_after_resume_repeats_of_checkpointed_pairs_are_copied(qwen3_causal, tmp_path):
    first = many_rows(12, 5)
    rows = first + [{**row, "item_id": f"again-{row['item_id']}"} for row in first]  # same pairs, new ids
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [src, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "4"]
    reference, out, report = tmp_path / "reference.parquet", tmp_path / "out.parquet", tmp_path / "r.json"
    assert run_cli(*base, "-o", reference).returncode == 0
    process = start_cli(*base, "-o", out)
    wait_for_parts(tmp_path / "out.parquet.parts", 3, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    ran = run_cli(*base, "-o", out, "--resume", "--report", report)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(report.read_text())["duplicates"] == 60  # every repeat copied, resumed windows' too
    table = pq.read_table(out)
    assert table.equals(pq.read_table(reference))
    scores = np.asarray(table["score"].to_pylist(), np.float32)
    assert scores[:60].tobytes() == scores[60:].tobytes()


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        ["--truncate", "chunk", "--max-item-tokens", "9", "--chunk-overlap", "2"],
        ["--pooled-hidden-states"],
        ["--rank"],
        ["--on-error", "skip"],
    ],
    ids=["chunk", "pooled", "rank", "skip"],
)
def test_copies_across_windows_agree_with_one_window(qwen3_causal, tmp_path, flags):
    """Windows of 3 rows (repeats copied from earlier windows) against one window (repeats deduped by the
    engine): the same rows and values within 1e-5, every repeat's values the bits of its first copy, and
    (outside chunking, where the engine counts windows) the same duplicates count."""
    unique = [
        {"query": f"query {q} about Tokyo", "item": f" item {i} of the city" + " far" * (4 * i)}
        for q in range(3)
        for i in range(3)
    ]
    rows = [dict(row, item_id=f"{k}") for k, row in enumerate(unique + unique[::-1] + unique[:4])]
    rows[5]["item"] = None  # an unreadable row: it is never a copy, nor copied
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    errors = [] if "--on-error" in flags else ["--on-error", "record"]
    base = [src, "--model", qwen3_causal, *LABEL_FLAGS, *errors, *flags]
    outputs, reports = [], []
    for window_rows in (3, 1000):
        out, report = tmp_path / f"o{window_rows}.parquet", tmp_path / f"r{window_rows}.json"
        ran = run_cli(*base, "-o", out, "--window-rows", window_rows, "--report", report)
        assert ran.returncode == 0, ran.stderr
        outputs.append(pq.read_table(out).sort_by("item_id"))
        reports.append(json.loads(report.read_text()))
    windows, one = outputs
    assert windows.column_names == one.column_names and windows.num_rows == one.num_rows
    names = [n for n in ("score", "scores", "chunks", "pooled_hidden_state", "rank") if n in one.column_names]
    assert windows["item_id"].to_pylist() == one["item_id"].to_pylist()
    for name in names:
        got, want = windows[name].to_pylist(), one[name].to_pylist()
        assert [v is None for v in got] == [v is None for v in want], name
        for a, b in zip(got, want):
            if a is not None:
                np.testing.assert_allclose(a, b, atol=1e-5)
    first: dict = {}
    for row in windows.to_pylist():
        source = rows[int(row["item_id"])]
        if row["score"] is None:
            continue
        key = (source["query"], source["item"])
        values = tuple(np.asarray(row[n], np.float32).tobytes() for n in names if n != "rank")
        assert first.setdefault(key, values) == values  # a repeat holds its first copy's bits
    if "chunk" not in flags:
        assert reports[0]["duplicates"] == reports[1]["duplicates"] > 0
