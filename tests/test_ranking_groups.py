"""Ranking groups (--rank / --top-k): the given query_id is the key (text is not), generated ids without id
columns, exact ties in input order; local file, stdout and Ray agree."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from score_batch.io_formats.readers import InputRow
from score_batch.io_formats.window import from_rows
from score_batch.job.outputs.query_ranking import rank_parts
from score_batch.job.preflight.contract import ERROR, QUERY_KEY, OutputContract
from score_batch.job.windows import row_query_keys
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl

ITEMS = [" to", " the flag of", " Japan", " the", " a city", " over there"]


def id_rows() -> list[dict]:
    """Query u1 spelled with and without a trailing space, and under another text; u2 interleaved."""
    texts = ["I pledge allegiance", "I pledge allegiance ", "Tokyo is a city in"]
    rows = []
    for i, item in enumerate(ITEMS):
        rows.append({"query_id": "u1", "query": texts[i % 3], "item_id": f"u1-{i}", "item": item})
        rows.append({"query_id": "u2", "query": "the capital of", "item_id": f"u2-{i}", "item": item})
    return rows


def noid_rows() -> list[dict]:
    """Two query texts (one also with a trailing space, which is another text), no id columns."""
    texts = ["I pledge allegiance", "Tokyo is a city in", "I pledge allegiance "]
    return [{"query": texts[i % 3], "item": item} for i, item in enumerate(ITEMS * 2)]


def ranked_rows(result) -> list[dict]:
    """The JSON lines a stdout run printed."""
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def check_groups(rows: list[dict], groups: dict, top_k: int | None) -> None:
    """Each group comes out whole, best first, ranks 1..n (at most top_k) with one rank 1 per query_id."""
    seen = [row["query_id"] for row in rows]
    assert list(dict.fromkeys(seen)) == list(groups)  # queries in order of first appearance, contiguous
    for query_id, scores in groups.items():
        got = [row for row in rows if row["query_id"] == query_id]
        expected = sorted(scores, reverse=True)[:top_k] if top_k else sorted(scores, reverse=True)
        assert [row["score"] for row in got] == expected
        assert [row["rank"] for row in got] == list(range(1, len(got) + 1))


@pytest.mark.parametrize("top_k", [None, 2])
def test_a_given_query_id_is_one_group_whatever_its_texts(qwen3_causal, tmp_path, top_k):
    data = write_jsonl(tmp_path / "in.jsonl", id_rows())
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "4"]
    plain = run_cli(*base, "-o", tmp_path / "plain.parquet")
    assert plain.returncode == 0, plain.stderr
    scores: dict[str, list[float]] = {}
    for row in pq.read_table(tmp_path / "plain.parquet").to_pylist():
        scores.setdefault(row["query_id"], []).append(row["score"])
    assert len(scores["u1"]) == 6  # three texts, one query id
    flag = ["--top-k", str(top_k)] if top_k else ["--rank"]
    ranked = run_cli(*base, *flag, "-o", tmp_path / "ranked.parquet")
    assert ranked.returncode == 0, ranked.stderr
    from_file = pq.read_table(tmp_path / "ranked.parquet").to_pylist()
    check_groups(from_file, scores, top_k)
    assert [row["rank"] for row in from_file].count(1) == 2  # one best row per query id
    streamed = ranked_rows(run_cli(*base, *flag, "-o", "-", "-q"))
    assert streamed == [{**row, "scores": pytest.approx(row["scores"])} for row in from_file]


def digest_id(query: str) -> int:
    """docs/ranking.md's generated query_id, computed here as the docs say: the first 63 bits of the text's
    SHA-256 (behind the tag byte t)."""
    return int.from_bytes(hashlib.sha256(b"t" + query.encode()).digest()[:8], "big") >> 1


def test_without_id_columns_a_group_is_its_query_text_with_a_digest_of_it_as_id(qwen3_causal, tmp_path):
    rows = noid_rows()
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "2", "-o", "-", "-q"]
    plain = ranked_rows(run_cli(*base))
    assert [row["query_id"] for row in plain] == [digest_id(row["query"]) for row in rows]
    by_text: dict[int, list[float]] = {}
    for row, out in zip(rows, plain):
        by_text.setdefault(digest_id(row["query"]), []).append(out["score"])
    assert len(by_text) == 3  # "I pledge allegiance " (trailing space) is a text of its own
    check_groups(ranked_rows(run_cli(*base, "--rank")), by_text, None)
    top = ranked_rows(run_cli(*base, "--top-k", "1"))
    check_groups(top, by_text, 1)
    assert [row["query_id"] for row in top] == list(by_text)
    # The item ids stay the row indexes: each output row still names its input row.
    assert all(digest_id(rows[row["item_id"]]["query"]) == row["query_id"] for row in top)
    # The ids are the same whatever the input order: a join key across runs.
    backwards = write_jsonl(tmp_path / "backwards.jsonl", rows[::-1])
    again = ranked_rows(run_cli(backwards, *base[1:], "--top-k", "1"))
    assert sorted((r["query_id"], r["score"]) for r in again) == sorted(
        (r["query_id"], r["score"]) for r in top
    )


def test_skipped_rows_carry_their_group_id(qwen3_causal, tmp_path):
    rows = noid_rows()
    rows[3]["item"] = None  # the second row of the group that starts at row 0
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "o.parquet"
    common = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "skip", "--window-rows", "2"]
    result = run_cli(*common, "--rank", "-o", out)
    assert result.returncode == 0, result.stderr
    skipped = [json.loads(line) for line in (tmp_path / "o.parquet.errors.jsonl").read_text().splitlines()]
    assert [(s["row_index"], s["query_id"]) for s in skipped] == [(3, digest_id(rows[0]["query"]))]
    assert {row["query_id"] for row in pq.read_table(out).to_pylist()} == {
        digest_id(r["query"]) for r in rows
    }


def test_nested_rows_sharing_a_query_id_are_one_ranking(qwen3_causal, tmp_path):
    rows = [
        {"query_id": "u1", "query": "I pledge allegiance", "items": [" to", " the flag of"]},
        {"query_id": "u2", "query": "Tokyo is a city in", "items": [" Japan"]},
        {"query_id": "u1", "query": "I pledge allegiance ", "items": [" the", " a city"]},
    ]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "-o", "-", "-q"]
    plain = ranked_rows(run_cli(*base))
    scores: dict[str, list[float]] = {}
    for row in plain:
        scores.setdefault(row["query_id"], []).append(row["score"])
    check_groups(ranked_rows(run_cli(*base, "--rank")), scores, None)


# --- exact ties, on hand-built tables (scores of two pack positions need not be bit-identical) ------------


def contract(query_ids_given: bool, top_k: int | None = None, on_error: str = "record") -> OutputContract:
    """A ranked contract over int64 or string ids, no kept columns."""
    id_type = pa.string() if query_ids_given else pa.int64()
    return OutputContract((id_type, pa.int64()), (), None, on_error, query_ids_given, True, top_k)


def part(rows: list[tuple], given: OutputContract) -> pa.Table:
    """A part from (row_index, query_id, key, score, error) tuples."""
    columns = {name: [] for name in given.part_schema().names}
    for row_index, query_id, key, score, error in rows:
        values = {"row_index": row_index, "query_id": query_id, "item_id": row_index, "score": score}
        values.update({"scores": None if score is None else [score], QUERY_KEY: key, ERROR: error})
        values["score_key"] = None if error else f"pair-{row_index}"
        for name in columns:
            columns[name].append(values[name])
    return given.part_table(columns)


def test_exact_ties_keep_input_order_across_windows():
    given = contract(True)
    windows = [
        [(0, "a", "ka", 0.5, None), (1, "b", "kb", 0.25, None), (2, "a", "ka", 0.75, None)],
        [(3, "a", "ka", 0.5, None), (4, "b", "kb", 0.25, None), (5, "a", "ka", None, "row 5: bad")],
        [(6, "a", "ka", 0.75, None), (7, "b", "kb", 0.5, None)],
    ]
    ranked, failed = rank_parts([part(w, given) for w in windows], given)
    got = list(zip(ranked["row_index"].to_pylist(), ranked["rank"].to_pylist()))
    # a: 0.75 (rows 2, 6), 0.5 (rows 0, 3), then the failed row 5; b: 0.5 (row 7), 0.25 (rows 1, 4)
    assert got == [(2, 1), (6, 2), (0, 3), (3, 4), (5, None), (7, 1), (1, 2), (4, 3)]
    assert failed.num_rows == 0
    top = rank_parts([part(w, contract(True, top_k=3)) for w in windows], contract(True, top_k=3))[0]
    assert top["row_index"].to_pylist() == [2, 6, 0, 5, 7, 1, 4]


def test_ties_order_as_crossencoder_rank_does():
    scores = [0.5, 0.875, 0.5, 0.875, 0.125, 0.5]
    given = contract(False)
    ranked = rank_parts([part([(i, i, "k", s, None) for i, s in enumerate(scores)], given)], given)[0]
    # sentence-transformers' CrossEncoder.rank: sorted(results, key=score, reverse=True), a stable sort
    expected = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    assert ranked["row_index"].to_pylist() == expected == [1, 3, 0, 2, 5, 4]
    assert ranked["query_id"].to_pylist() == expected  # each row's own id, carried along


def test_ids_and_the_skip_split_on_a_hand_built_table():
    given = contract(False, on_error="skip")
    rows = [
        (0, 0, "x", 0.5, None),
        (1, 1, "y", 0.5, None),
        (2, 0, "x", None, "row 2: bad"),
        (3, 1, "y", 0.75, None),
    ]
    ranked, failed = rank_parts([part(rows, given)], given)
    assert list(zip(ranked["row_index"].to_pylist(), ranked["query_id"].to_pylist())) == [
        (0, 0),
        (3, 1),
        (1, 1),
    ]
    assert list(zip(failed["row_index"].to_pylist(), failed["query_id"].to_pylist())) == [(2, 0)]


def test_query_key_uses_the_given_id_and_ignores_the_text():
    with_ids, without = contract(True), contract(False)

    def row(index, query, query_id):
        return InputRow(index, query, ["x"], query_id, [index])

    def query_key(row, contract):
        return row_query_keys(from_rows([row], contract.query_ids_given, ()), contract.query_ids_given)[0]

    assert query_key(row(0, "q", "u1"), with_ids) == query_key(row(1, "q ", "u1"), with_ids)
    assert query_key(row(0, "q", "u1"), with_ids) != query_key(row(1, "q", "u2"), with_ids)
    assert query_key(row(0, "q", None), with_ids) == query_key(row(1, "q", None), with_ids)  # null id: text
    assert query_key(row(0, "q", None), without) == query_key(row(5, "q", None), without)
    assert query_key(row(0, "q", None), without) != query_key(row(1, "q ", None), without)
    assert query_key(row(0, [1, 2], None), without) == query_key(row(1, [1, 2], None), without)
    assert query_key(row(0, None, None), without) != query_key(row(1, None, None), without)  # unreadable rows


# --- Ray: the same groups and generated ids as a local run -----------------------------------------------


@pytest.mark.slow
def test_ray_ranking_groups_equal_the_local_ones(qwen3_causal, tmp_path):
    pytest.importorskip("ray")
    rows = noid_rows()
    rows[3]["item"] = None
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    common = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--on-error", "skip", "--top-k", "2"]
    local = run_cli(*common, "-o", tmp_path / "local.parquet", "--report", tmp_path / "local.json")
    assert local.returncode == 0, local.stderr
    ray_flags = ["--ray", "--num-workers", "1", "-q", "--report", tmp_path / "ray.json"]
    ray = run_cli(*common, "-o", tmp_path / "ray_out", *ray_flags, fresh_process=True)
    assert ray.returncode == 0, ray.stderr
    expected = pq.read_table(tmp_path / "local.parquet").to_pylist()
    got = ds.dataset(tmp_path / "ray_out", format="parquet").to_table().to_pylist()
    keys = ("query_id", "item_id", "rank")
    assert [tuple(r[k] for k in keys) for r in got] == [tuple(r[k] for k in keys) for r in expected]
    local_errors = (tmp_path / "local.parquet.errors.jsonl").read_text()
    assert (tmp_path / "ray_out.errors.jsonl").read_text() == local_errors
    # The report's score distribution covers every scored item (before --top-k), on Ray as locally.
    ray_stats = json.loads((tmp_path / "ray.json").read_text())["score_stats"]["scores"]
    local_stats = json.loads((tmp_path / "local.json").read_text())["score_stats"]["scores"]
    assert ray_stats["count"] == local_stats["count"] == len(rows) - 1
    for name in ("min", "p05", "p50", "p95", "max", "mean"):
        assert ray_stats[name] == pytest.approx(local_stats[name], abs=1e-6), name
    assert ray_stats["max"] == max(row["score"] for row in got)
