"""--truncate chunk: an over-long item scored as chunks (those of a Hugging Face tokenizer's overflow), one result
per item aggregated by max / first / mean, exact per chunk against plain HF (docs/semantics.md: Truncation)."""

from __future__ import annotations

import json
import math
import signal

import numpy as np
import pyarrow.parquet as pq
import pytest

from score_batch.engine import EngineConfig, Group, GroupResult, ScoringConfig, SettingError
from score_batch.engine.model.setup import load_planner
from score_batch.engine.plan.planner import PackedPlanner, PairPlanner, PlanLimits
from score_batch.engine.text.chunking import ChunkedGroup, aggregate, chunk_spans, split_chunks
from tests.reference import max_abs_diff, reference_scores, tokenizer
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import start_cli, wait_for_parts
from tests.test_scorer import label_ids, make_scorer

TOLERANCE = 1e-5  # fp32, every chunk against its own plain-HF forward
LONG = (
    " the quick brown fox jumps over the lazy dog to get to the other side, and Tokyo is a city in Japan"
    " and the capital of the country; wireless noise cancelling headphones with long battery life"
)
MEDIUM = " red running shoes for women, lightweight and breathable"


def hf_chunks(tok, text: str, size: int, overlap: int) -> list[list[int]]:
    """What a Hugging Face fast tokenizer's overflow gives: chunks of size tokens sharing overlap tokens."""
    encoded = tok(
        text,
        add_special_tokens=False,
        truncation=True,
        max_length=size,
        stride=overlap,
        return_overflowing_tokens=True,
    )
    return encoded["input_ids"]


def limits(vocab_size: int, max_pack_tokens: int = 4096, cache_query: bool = False) -> PlanLimits:
    return PlanLimits(
        max_pack_tokens=max_pack_tokens,
        max_batch_tokens=1 << 20,
        delimiter_token_id=0,
        vocab_size=vocab_size,
        cache_query=cache_query,
    )


# --- chunks (no model) ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [LONG, MEDIUM, " to"])
def test_chunks_are_the_hugging_face_overflow_windows(qwen3_causal, text):
    tok = tokenizer(str(qwen3_causal))
    assert tok.is_fast
    ids = tok(text, add_special_tokens=False)["input_ids"]
    n = len(ids)
    checked = 0
    # limits from tiny to exactly the item's length (one chunk) and one short of it (the item is limit + 1)
    for size in sorted({1, 2, 3, 5, 8, n - 1, n, n + 3} - {0}):
        for overlap in sorted({0, 1, size // 2, size - 1}):
            if not 0 <= overlap < size:
                continue
            ours, why = split_chunks(ids, list(range(n)), size, overlap)
            assert why is None
            assert ours == hf_chunks(tok, text, size, overlap), (size, overlap)
            spans = chunk_spans(n, size, overlap)
            assert [ids[a:b] for a, b in spans] == ours
            if n > size:  # neighbours share exactly overlap tokens
                assert all(spans[k + 1][0] == spans[k][1] - overlap for k in range(len(spans) - 1))
            checked += 1
    assert checked >= 10


def test_edge_lengths():
    assert chunk_spans(0, 4, 1) == [(0, 0)]  # an empty item is one empty chunk
    assert chunk_spans(4, 4, 3) == [(0, 4)]  # exactly the limit: itself
    assert chunk_spans(5, 4, 0) == [(0, 4), (4, 5)]  # limit + 1
    assert chunk_spans(5, 4, 3) == [(0, 4), (1, 5)]  # limit + 1, overlap limit - 1
    assert chunk_spans(6, 4, 3) == [(0, 4), (1, 5), (2, 6)]  # overlap limit - 1: one token forward each
    assert chunk_spans(9, 4, 1) == [(0, 4), (3, 7), (6, 9)]  # the last chunk ends at the end, shorter
    with pytest.raises(ValueError):
        chunk_spans(9, 4, 4)
    assert split_chunks([], [], 4, 1) == ([[]], None)
    assert split_chunks([7, 8, 9, 10], [0, 1, 2, 3], 4, 3) == ([[7, 8, 9, 10]], None)


def test_template_tokens_wrap_every_chunk(qwen3_causal):
    """The template's tokens before and after the content wrap each chunk of the content tokens."""
    tok = tokenizer(str(qwen3_causal))
    cfg = ScoringConfig(
        item_template="<|im_start|>{item}<|im_end|>", truncate="chunk", max_item_tokens=7, chunk_overlap=2
    )
    planner = PackedPlanner(tok, cfg, limits(len(tok)))
    plan = planner.plan([Group("Tokyo is", [LONG, MEDIUM])])
    chunked = plan.chunked[0]
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    for item, text in enumerate((LONG, MEDIUM)):
        first, count = chunked.firsts[item], chunked.counts[item]
        chunks = chunked.scored.item_ids[first : first + count]
        assert all(w[0] == start and w[-1] == end and len(w) <= 7 for w in chunks)
        assert [w[1:-1] for w in chunks] == hf_chunks(tok, text, 5, 2)  # 7 less the 2 template tokens
        assert plan.tokenized[0].item_ids[item] == [
            start,
            *tok(text, add_special_tokens=False)["input_ids"],
            end,
        ]
    assert plan.stats.items == 2 and plan.stats.sequences == sum(chunked.counts) > 2


@pytest.mark.parametrize("overlap", [0, 2])
def test_a_token_straddling_the_template_boundary_is_the_items(qwen3_causal, overlap):
    """Under "Product: {item}" a token holding both the template's space and the item's first word ("Ġthe") is
    the item's: the chunks partition every token holding an item character, exactly as HF's overflow
    chunks of that text do, and only template tokens wrap every chunk (before, "Ġthe" was repeated at the
    head of each chunk and the chunks differed from HF's)."""
    tok = tokenizer(str(qwen3_causal))
    limit = len(tok("Product: ", add_special_tokens=False)["input_ids"]) + 6
    cfg = ScoringConfig(
        item_template="Product: {item}", truncate="chunk", max_item_tokens=limit, chunk_overlap=overlap
    )
    items = [LONG.strip(), MEDIUM.strip(), "red running shoes for women with long battery life"]
    plan = PackedPlanner(tok, cfg, limits(len(tok))).plan([Group("Tokyo is", items)])
    chunked = plan.chunked[0]
    straddled = 0
    for item, text in enumerate(items):
        encoded = tok("Product: " + text, return_offsets_mapping=True)
        start, end = len("Product: "), len("Product: " + text)
        body = [i for i, (s, e) in enumerate(encoded["offset_mapping"]) if e > s and s < end and e > start]
        straddled += encoded["offset_mapping"][body[0]][0] < start
        ids = encoded["input_ids"]
        head, body_ids = ids[: body[0]], ids[body[0] :]
        assert tok(tok.decode(body_ids), add_special_tokens=False)["input_ids"] == body_ids
        reference = hf_chunks(tok, tok.decode(body_ids), limit - len(head), overlap)
        first, count = chunked.firsts[item], chunked.counts[item]
        chunks = chunked.scored.item_ids[first : first + count]
        assert chunks == [head + chunk for chunk in reference] and count > 1
    assert straddled >= 1  # the case this is about occurs


def test_items_that_cannot_be_split_are_row_errors(qwen3_causal):
    tok = tokenizer(str(qwen3_causal))
    long_template = ScoringConfig(
        item_template="Document: the flag of the United States {item} end",
        truncate="chunk",
        max_item_tokens=6,
    )
    tokenized = PackedPlanner(tok, long_template, limits(len(tok))).plan([Group("q", [LONG])]).tokenized[0]
    assert "cannot be split into chunks: its template alone has" in tokenized.errors[0]
    # chunks of what the pack allows (its 12 tokens less the query's and 2 delimiters) cannot share that many
    size = 12 - len(tok("Tokyo is a")["input_ids"]) - 2
    overlap = ScoringConfig(truncate="chunk", chunk_overlap=size)
    plan = PackedPlanner(tok, overlap, limits(len(tok), max_pack_tokens=12)).plan(
        [Group("Tokyo is a", [LONG])]
    )
    assert f"chunks of {size} content tokens" in plan.tokenized[0].errors[0]
    assert f"cannot share chunk_overlap {size} tokens" in plan.tokenized[0].errors[0]
    assert (
        plan.chunked[0].counts == (0,)
        and plan.tokenized[0].errors[0] is not None
        and plan.stats.sequences == 0
    )


def test_settings_refused(qwen3_causal, zoo):
    tok = tokenizer(str(qwen3_causal))
    with pytest.raises(SettingError, match="chunk_overlap.*smaller than ScoringConfig.max_item_tokens"):
        PackedPlanner(tok, ScoringConfig(truncate="chunk", max_item_tokens=4, chunk_overlap=4), limits(600))
    with pytest.raises(SettingError, match="encoder cross-encoder yet"):
        PairPlanner(tok, ScoringConfig(truncate="chunk"), limits(600))
    with pytest.raises(SettingError, match="ScoringConfig.truncate.*encoder cross-encoder yet"):
        load_planner(zoo.get("bert", "classifier"), EngineConfig(scoring=ScoringConfig(truncate="chunk")))


# --- aggregation (no model) ----------------------------------------------------------------------------


def chunk_result(score, scores, pooled, item_errors=()) -> GroupResult:
    scores = np.asarray(scores, np.float32)
    return GroupResult(
        scores=scores,
        score=np.asarray(score, np.float32),
        pooled=np.asarray(pooled, np.float32),
        errors=[None] * len(score),
        item_errors=tuple(item_errors),
        raw=scores * 10,
    )


# items: 0 → chunks 0..2, 1 → chunk 3, 2 → failed before scoring (no chunk), 3 → chunks 4..5
CHUNKED = ChunkedGroup(scored=None, owners=(0, 0, 0, 1, 3, 3), firsts=(0, 3, 4, 4), counts=(3, 1, 0, 2))
SCORE = [0.2, 0.7, 0.7, 0.4, 0.1, 0.3]  # ties: the first best chunk wins
SCORES = [[s, 1 - s] for s in SCORE]
POOLED = [[k, -k] for k in range(6)]
ERRORS = [None, None, "item 2 has 9 tokens …", None]


@pytest.mark.parametrize(
    ("how", "picks"),
    [("max", [1, 3, None, 5]), ("first", [0, 3, None, 4]), ("mean", [(0, 3), (3, 4), None, (4, 6)])],
)
def test_aggregation(how, picks):
    (item,) = aggregate([chunk_result(SCORE, SCORES, POOLED)], [CHUNKED], [ERRORS], how)
    assert item.chunks.tolist() == [3, 1, 0, 2] and item.chunks.dtype == np.int32
    assert item.errors == ERRORS and item.failures == ERRORS
    for k, pick in enumerate(picks):
        if pick is None:
            assert (
                np.isnan(item.score[k]) and np.isnan(item.scores[k]).all() and np.isnan(item.pooled[k]).all()
            )
            continue
        rows = slice(*pick) if isinstance(pick, tuple) else slice(pick, pick + 1)
        expected = {
            "score": np.mean(np.asarray(SCORE)[rows]),
            "scores": np.mean(np.asarray(SCORES)[rows], 0),
            "pooled": np.mean(np.asarray(POOLED, np.float64)[rows], 0),
            "raw": np.mean(np.asarray(SCORES, np.float32)[rows] * 10, 0),
        }
        for name, value in expected.items():
            assert max_abs_diff(getattr(item, name)[k], value) <= 1e-6, (name, k)


def test_a_failed_chunk_fails_its_item_only():
    failed = [None, "non-finite score (nan) for item 0 (chunk 2 of 3)", None, None, None, None]
    (item,) = aggregate([chunk_result(SCORE, SCORES, POOLED, failed)], [CHUNKED], [ERRORS], "max")
    assert item.failures == [failed[1], None, ERRORS[2], None]
    assert np.isnan(item.score[0]) and item.score[1] == np.float32(0.4) and item.score[3] == np.float32(0.3)


# --- exact against plain HF -----------------------------------------------------------------------------

QUERIES = ["I pledge allegiance to the flag", "What is the capital of California?"]
ITEMS = [[LONG, "", " to", MEDIUM], [MEDIUM + LONG, " Sacramento"]]


def references(model_dir, kind, size, overlap):
    """Per group, per item: the plain-HF (scores, pooled) of query + each HF overflow chunk."""
    tok = tokenizer(str(model_dir))
    out = []
    for query, items in zip(QUERIES, ITEMS):
        query_ids = tok(query)["input_ids"]
        out.append(
            [
                [
                    reference_scores(model_dir, kind, query_ids + chunk, label_ids(model_dir))
                    for chunk in (hf_chunks(tok, item, size, overlap) if item else [[]])
                ]
                for item in items
            ]
        )
    return out


@pytest.mark.parametrize(("family", "kind", "overlap"), [("qwen3", "causal", 3), ("llama", "classifier", 0)])
def test_every_chunk_equals_plain_hf_and_items_their_aggregate(zoo, family, kind, overlap):
    model_dir = zoo.get(family, kind, add_bos=family == "llama")
    size = 9
    groups = [Group(q, items) for q, items in zip(QUERIES, ITEMS)]
    expected = references(model_dir, kind, size, overlap)
    worst = 0.0
    for how in ("max", "first", "mean"):
        # a small pack budget: a group's chunks spread over several packs, later ones reading the query's K/V
        scorer = make_scorer(
            model_dir,
            kind,
            truncate="chunk",
            max_item_tokens=size,
            chunk_overlap=overlap,
            chunk_aggregate=how,
            pooled_hidden_states=True,
            max_pack_tokens=48,
        )
        plan = scorer.plan(groups)
        assert plan.stats.packs > len(groups)
        if how == "max":  # every chunk against its own forward
            for g, result in enumerate(scorer._runner.run_sequences(plan)):
                chunked = plan.chunked[g]
                assert result.scores.shape[0] == len(chunked.owners)
                for w, item in enumerate(chunked.owners):
                    scores, pooled = expected[g][item][w - chunked.firsts[item]]
                    worst = max(worst, max_abs_diff(scores, result.scores[w]))
                    worst = max(worst, max_abs_diff(pooled, result.pooled[w]))
        for g, result in enumerate(scorer.score(groups)):
            assert result.chunks.tolist() == [len(chunks) for chunks in expected[g]]
            for item, chunks in enumerate(expected[g]):
                scores = np.asarray([s for s, _ in chunks])  # [chunks, num_scores]
                pooled = np.asarray([p for _, p in chunks])
                score = result.score[item]
                if how == "mean":
                    want_scores, want_pooled = scores.mean(0), pooled.mean(0)
                    chunk_scores = [_score(scorer, s) for s in scores]
                    worst = max(worst, abs(score - np.mean(chunk_scores)))
                else:
                    pick = 0 if how == "first" else int(np.argmax([_score(scorer, s) for s in scores]))
                    want_scores, want_pooled = scores[pick], pooled[pick]
                    worst = max(worst, abs(score - _score(scorer, want_scores)))
                worst = max(worst, max_abs_diff(want_scores, result.scores[item]))
                worst = max(worst, max_abs_diff(want_pooled, result.pooled[item]))
    print(f"{family} {kind}: max |ours - plain HF| over chunks and aggregates = {worst:.2e}")
    assert worst <= TOLERANCE, worst
    assert any(len(chunks) > 2 for group in expected for chunks in group)  # really chunked


def _score(scorer, scores: np.ndarray) -> float:
    """The `score` of one reference row of scores, under the scorer's activation."""
    from score_batch.engine.activation import activate

    return float(activate(scores[None, :], scorer.activation.name, -1)[0])


def test_default_limit_is_what_the_pack_allows_after_the_query(qwen3_causal):
    tok = tokenizer(str(qwen3_causal))
    query = "Tokyo is a city"
    q = len(tok(query)["input_ids"])
    scorer = make_scorer(qwen3_causal, truncate="chunk", chunk_overlap=1, max_pack_tokens=24)
    plan = scorer.plan([Group(query, [LONG])])
    size = 24 - q - 2  # the pack less the query and the item's two delimiters
    chunks = plan.chunked[0].scored.item_ids
    assert chunks == hf_chunks(tok, LONG, size, 1)
    result = scorer.score([Group(query, [LONG])])[0]
    best = max(
        reference_scores(qwen3_causal, "causal", tok(query)["input_ids"] + w, label_ids(qwen3_causal))[0][-1]
        for w in chunks
    )
    assert result.chunks.tolist() == [len(chunks)] and abs(result.score[0] - best) <= TOLERANCE


def test_item_first_chunks_carry_the_special_tokens(zoo):
    model_dir = zoo.get("llama", "causal", add_bos=True)
    tok = tokenizer(str(model_dir))
    scorer = make_scorer(model_dir, truncate="chunk", max_item_tokens=8, chunk_overlap=2, item_first=True)
    plan = scorer.plan([Group("the country", [LONG])])
    chunks = plan.chunked[0].scored.item_ids
    assert [w[1:] for w in chunks] == hf_chunks(tok, LONG, 7, 2) and {w[0] for w in chunks} == {
        tok.bos_token_id
    }
    result = scorer.score([Group("the country", [LONG])])[0]
    query_ids = tok("the country", add_special_tokens=False)["input_ids"]
    best = max(
        reference_scores(model_dir, "causal", w + query_ids, label_ids(model_dir))[0][-1] for w in chunks
    )
    assert abs(result.score[0] - best) <= TOLERANCE


def test_predict_gives_the_aggregate(qwen3_causal):
    scorer = make_scorer(qwen3_causal, truncate="chunk", max_item_tokens=9)
    pairs = [("Tokyo is", LONG), ("Tokyo is", " Japan")]
    predicted = scorer.predict(pairs)
    scored = scorer.score([Group("Tokyo is", [LONG, " Japan"])])[0]
    assert predicted.tolist() == scored.score.tolist() and scored.chunks.tolist()[1] == 1


def test_a_non_finite_chunk_fails_its_item_and_names_the_chunk(qwen3_causal, tmp_path):
    from tests.test_non_finite import poison

    tok = tokenizer(str(qwen3_causal))
    token = tok(" Japan", add_special_tokens=False)["input_ids"][-1]
    bad = poison(qwen3_causal, tmp_path / "nan", "embed_tokens.weight", token)
    chunks = hf_chunks(tok, LONG, 9, 2)
    hit = [k for k, w in enumerate(chunks) if token in w]
    assert hit and len(hit) < len(chunks)
    group = [Group(QUERIES[0], [LONG, MEDIUM])]
    result = make_scorer(bad, truncate="chunk", max_item_tokens=9, chunk_overlap=2).score(group)[0]
    clean = make_scorer(qwen3_causal, truncate="chunk", max_item_tokens=9, chunk_overlap=2).score(group)[0]
    assert result.failures[0] == f"non-finite score (nan) for item 0 (chunk {hit[0] + 1} of {len(chunks)})"
    assert np.isnan(result.score[0]) and result.failures[1] is None
    assert (
        abs(result.score[1] - clean.score[1]) <= TOLERANCE and result.chunks.tolist() == clean.chunks.tolist()
    )


# --- through the command line ---------------------------------------------------------------------------

ROWS = [
    {"query_id": "a", "query": QUERIES[0], "item_id": "a1", "item": LONG},
    {"query_id": "b", "query": QUERIES[1], "item_id": "b1", "item": MEDIUM},
    {"query_id": "a", "query": QUERIES[0], "item_id": "a2", "item": " to"},
    {"query_id": "a", "query": QUERIES[0], "item_id": "a3", "item": MEDIUM + LONG},
    {"query_id": "b", "query": QUERIES[1], "item_id": "b2", "item": ""},
]
CHUNK_FLAGS = ["--truncate", "chunk", "--max-item-tokens", "9", "--chunk-overlap", "2"]


def engine_expectation(model_dir, rows, pooled=False):
    """Per row: (score, chunks) from the engine (its exactness is tested above)."""
    scorer = make_scorer(
        model_dir, truncate="chunk", max_item_tokens=9, chunk_overlap=2, pooled_hidden_states=pooled
    )
    out = []
    for row in rows:
        result = scorer.score([Group(row["query"], [row["item"]])])[0]
        out.append((float(result.score[0]), int(result.chunks[0])))
    return out


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_cli_writes_one_row_per_item_with_chunks(qwen3_causal, tmp_path, suffix):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / f"out{suffix}"
    ran = run_cli(
        data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, *CHUNK_FLAGS, "--pooled-hidden-states"
    )
    assert ran.returncode == 0, ran.stderr
    if suffix == ".parquet":
        table = pq.read_table(out)
        assert table.column_names == [
            "query_id",
            "item_id",
            "score",
            "scores",
            "chunks",
            "pooled_hidden_state",
            "score_key",
        ]
        assert str(table.schema.field("chunks").type) == "int32"
        rows = table.to_pylist()
    else:
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["item_id"] for r in rows] == [r["item_id"] for r in ROWS]
    expected = engine_expectation(qwen3_causal, ROWS, pooled=True)
    assert [r["chunks"] for r in rows] == [c for _, c in expected]
    assert rows[0]["chunks"] > 2 and rows[2]["chunks"] == 1 and rows[4]["chunks"] == 1
    for row, (score, _) in zip(rows, expected):
        assert abs(row["score"] - score) <= TOLERANCE and len(row["pooled_hidden_state"]) == 64
    assert "scored 5 items" in ran.stderr


def test_cli_ranks_items_by_their_aggregate(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "ranked.jsonl"
    ran = run_cli(data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, *CHUNK_FLAGS, "--top-k", "2")
    assert ran.returncode == 0, ran.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert list(rows[0]) == ["query_id", "item_id", "score", "rank", "scores", "chunks", "score_key"]
    expected = dict(zip((r["item_id"] for r in ROWS), engine_expectation(qwen3_causal, ROWS)))
    for query in ("a", "b"):
        mine = [r for r in rows if r["query_id"] == query]
        best = sorted((v[0] for k, v in expected.items() if k.startswith(query)), reverse=True)[:2]
        assert [r["rank"] for r in mine] == [1, 2]
        assert max(abs(r["score"] - b) for r, b in zip(mine, best)) <= TOLERANCE
        assert all(r["chunks"] == expected[r["item_id"]][1] for r in mine)


def test_cli_dry_run_counts_chunks(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, *CHUNK_FLAGS]
    assert run_cli(*base, "-o", tmp_path / "o.parquet", "--report", tmp_path / "run.json").returncode == 0
    dry = run_cli(*base, "-o", tmp_path / "d.parquet", "--dry-run", "--report", tmp_path / "dry.json")
    assert dry.returncode == 0 and "planned 5 items" in dry.stderr
    run, plan = (json.loads((tmp_path / n).read_text()) for n in ("run.json", "dry.json"))
    assert run["items"] == plan["items"] == 5
    for key in ("groups", "packs", "batches", "packed_tokens", "pairwise_tokens"):
        assert run[key] == plan[key], key
    # pairwise tokens count every chunk's query + chunk: more than one pass over each item
    assert run["pairwise_tokens"] > run["packed_tokens"]


def test_cli_chunks_is_a_reserved_name_only_when_chunking(qwen3_causal, tmp_path):
    rows = [dict(r, chunks="mine") for r in ROWS]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--keep-columns", "chunks"]
    refused = run_cli(*base, *CHUNK_FLAGS, "-o", tmp_path / "a.jsonl")
    assert refused.returncode == 2 and "'chunks'" in refused.stderr and "--truncate chunk" in refused.stderr
    plain = run_cli(*base, "-o", tmp_path / "b.jsonl", "--max-item-tokens", "64")
    assert plain.returncode == 0, plain.stderr
    written = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [r["chunks"] for r in written] == ["mine"] * 5


def test_cli_engine_errors_are_row_errors(qwen3_causal, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.jsonl"
    args = [data, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "record"]
    ran = run_cli(*args, "--truncate", "chunk", "--max-item-tokens", "4", "--item-template", "Doc: {item} !")
    assert ran.returncode == 4, ran.stderr  # every item failed: the output is written, then exit 4
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    failed = [r for r in rows if r["error"] is not None]
    assert failed and all(r["chunks"] is None and r["score"] is None for r in failed)
    assert all("cannot be split into chunks" in r["error"] for r in failed)


@pytest.mark.slow
def test_cli_resume_after_kill_gives_the_same_output(qwen3_causal, tmp_path):
    rows = [
        {
            "query_id": q,
            "query": f"query {q} about the flag",
            "item_id": f"{q}-{i}",
            "item": (LONG * 2)[: 40 + 60 * i],
        }
        for q in range(50)
        for i in range(4)
    ]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, *CHUNK_FLAGS, "--window-rows", "4"]
    reference = tmp_path / "reference.parquet"
    assert run_cli(*base, "-o", reference).returncode == 0
    out = tmp_path / "out.parquet"
    process = start_cli(*base, "-o", out)
    wait_for_parts(tmp_path / "out.parquet.parts", 3, process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not out.exists()
    resumed = run_cli(*base, "-o", out, "--resume", "--report", tmp_path / "report.json")
    assert resumed.returncode == 0, resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))
    assert json.loads((tmp_path / "report.json").read_text())["rows_skipped_by_resume"] >= 12
    assert min(pq.read_table(out).column("chunks").to_pylist()) >= 1
    assert max(pq.read_table(out).column("chunks").to_pylist()) > 2
    assert not math.isnan(pq.read_table(out).column("score").to_pylist()[0])


def test_batch_file_scores_long_documents_by_their_chunks(qwen3_causal, tmp_path):
    """Batch files (vLLM rerank / score lines) take the engine's per-item aggregate as they are."""
    documents = [LONG, " Japan", MEDIUM + LONG]
    requests = [
        {"custom_id": "r", "url": "/v1/rerank", "body": {"query": QUERIES[1], "documents": documents}},
        {"custom_id": "s", "url": "/v1/score", "body": {"text_1": QUERIES[0], "text_2": documents}},
    ]
    src = write_jsonl(tmp_path / "batch.jsonl", [dict(r, method="POST") for r in requests])
    out = tmp_path / "results.jsonl"
    ran = run_cli(src, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, *CHUNK_FLAGS)
    assert ran.returncode == 0, ran.stderr
    lines = {line["custom_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    scorer = make_scorer(qwen3_causal, truncate="chunk", max_item_tokens=9, chunk_overlap=2)
    rerank = scorer.score([Group(QUERIES[1], documents)])[0]
    assert rerank.chunks.tolist()[1] == 1 and min(rerank.chunks.tolist()[::2]) > 2
    results = lines["r"]["response"]["body"]["results"]
    assert [r["index"] for r in results] == list(np.argsort(-rerank.score, kind="stable"))
    assert max(abs(r["relevance_score"] - rerank.score[r["index"]]) for r in results) <= TOLERANCE
    score = scorer.score([Group(QUERIES[0], documents)])[0]
    data = lines["s"]["response"]["body"]["data"]
    assert max(abs(d["score"] - s) for d, s in zip(data, score.score)) <= TOLERANCE


@pytest.mark.slow
def test_ray_run_writes_the_local_run_s_chunks(qwen3_causal, tmp_path):
    pytest.importorskip("ray")
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    common = [data, "--model", qwen3_causal, *LABEL_FLAGS, *CHUNK_FLAGS, "-q"]
    local = run_cli(*common, "-o", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    ray = run_cli(*common, "-o", tmp_path / "out", "--ray", "--num-workers", "1", fresh_process=True)
    assert ray.returncode == 0, ray.stderr[-3000:]
    ours = pq.read_table(tmp_path / "out").sort_by("row_index")
    theirs = pq.read_table(tmp_path / "local.parquet")
    assert ours.drop(["row_index"]).schema == theirs.schema and "chunks" in theirs.column_names
    assert ours.column("chunks").to_pylist() == theirs.column("chunks").to_pylist()
    assert max_abs_diff(ours.column("score").to_pylist(), theirs.column("score").to_pylist()) <= 1e-6
