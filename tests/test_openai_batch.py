"""OpenAI-style batch files (vLLM run-batch /v1/score and /v1/rerank): detection, parsing, round trips, errors."""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from score_batch import job
from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig
from score_batch.io_formats.batch_requests import looks_like_openai_batch, parse_request
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.listing import FileFormat, InputFile
from score_batch.io_formats.locations import Location
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.run_config import RunConfig
from tests.test_cli import LABEL_FLAGS, ROWS, run_cli, write_jsonl
from tests.test_object_stores import keys, s3, s3_server  # noqa: F401 (fixtures)

LABELS = (" to", " the")  # the labels of tests.test_cli.LABEL_FLAGS
QUERY_A, QUERY_B = "I pledge allegiance", "Tokyo is a city in"
LONG = " the flag of the country" * 12  # over max_item_tokens below: a per-item engine error

REQUESTS = [
    {"custom_id": "s-1n", "method": "POST", "url": "/v1/score",
     "body": {"model": "ignored", "text_1": QUERY_A, "text_2": [" to", " the flag of", ""]}},
    {"custom_id": "r-top2", "method": "POST", "url": "/v1/rerank",
     "body": {"query": QUERY_B, "documents": [" Japan", " the country", " to", " Kyoto"], "top_n": 2}},
    "{not json",
    {"custom_id": "s-nn", "method": "POST", "url": "/score",
     "body": {"text_1": [QUERY_A, QUERY_B, QUERY_A], "text_2": [" to", " Japan", " the flag of"]}},
    {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}},
    {"custom_id": "no-docs", "method": "POST", "url": "/rerank", "body": {"query": QUERY_B}},
    {"custom_id": "r-all", "method": "POST", "url": "/v2/rerank",
     "body": {"query": QUERY_A, "documents": [" to", " the flag of"], "return_documents": False}},
    {"custom_id": "too-long", "method": "POST", "url": "/v1/rerank", "body": {"query": QUERY_A, "documents": [" to", LONG]}},
    {"custom_id": "s-11", "method": "POST", "url": "/v1/score", "body": {"text_1": QUERY_B, "text_2": " Japan"}},
]  # fmt: skip


def write_batch(path: Path, requests: list) -> Path:
    """One line per request (strings are written as they are), with a blank line in between."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in requests]
    path.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")
    return path


def batch_config(model_dir: Path, src: Path | str, out: Path | str, **overrides) -> RunConfig:
    scoring = ScoringConfig(label_tokens=LABELS, max_item_tokens=16)
    settings = dict(
        input=str(src),
        output=str(out),
        model_dir=model_dir,
        columns=ColumnOverrides(),
        engine=EngineConfig(device="cpu", scoring=scoring),
        window_rows=4,  # several windows, and requests of different windows
    )
    settings.update(overrides)
    return RunConfig(**settings)


@pytest.fixture(scope="module")
def direct(qwen3_causal):
    """Scores of one group from a separate Scorer, for comparison."""
    scoring = ScoringConfig(label_tokens=LABELS, max_item_tokens=16)
    scorer = Scorer.from_pretrained(qwen3_causal, EngineConfig(device="cpu", scoring=scoring))
    return lambda query, items: scorer.score([Group(query, items)])[0]


def test_round_trip_score_and_rerank(qwen3_causal, tmp_path, direct):
    src, out = write_batch(tmp_path / "batch.jsonl", REQUESTS), tmp_path / "results.jsonl"
    report = job.run(batch_config(qwen3_causal, src, out))  # the batch-file runner of the one run loop

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(REQUESTS)  # one output line per request line, blank lines skipped
    assert [line["custom_id"] for line in lines] == [
        "s-1n", "r-top2", None, "s-nn", "chat", "no-docs", "r-all", "too-long", "s-11"
    ]  # fmt: skip
    assert len({line["id"] for line in lines}) == len(lines)
    by_id = {line["custom_id"]: line for line in lines if line["custom_id"] is not None}

    # /v1/score, one text_1 against many text_2: one group, data in text_2 order
    body = _ok(by_id["s-1n"])
    assert body["object"] == "list" and body["model"] == str(qwen3_causal)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "score" for d in body["data"])
    _close([d["score"] for d in body["data"]], direct(QUERY_A, [" to", " the flag of", ""]).score)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0

    # N:N pairs: pair i is (text_1[i], text_2[i]); pairs that share a text_1 are one group
    body = _ok(by_id["s-nn"])
    a = direct(QUERY_A, [" to", " the flag of"]).score
    b = direct(QUERY_B, [" Japan"]).score
    _close([d["score"] for d in body["data"]], [a[0], b[0], a[1]])

    body = _ok(by_id["s-11"])
    _close([d["score"] for d in body["data"]], direct(QUERY_B, [" Japan"]).score)

    # /v1/rerank: sorted best first (ties in document order), top_n kept, documents returned
    documents = [" Japan", " the country", " to", " Kyoto"]
    expected = direct(QUERY_B, documents).score
    body = _ok(by_id["r-top2"])
    order = sorted(range(len(documents)), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in body["results"]] == order
    assert [r["document"]["text"] for r in body["results"]] == [documents[i] for i in order]
    _close([r["relevance_score"] for r in body["results"]], expected[order])
    assert body["usage"]["total_tokens"] > 0

    body = _ok(by_id["r-all"])  # no top_n: every document; return_documents false: no text
    expected = direct(QUERY_A, [" to", " the flag of"]).score
    assert [r["index"] for r in body["results"]] == sorted(range(2), key=lambda i: -expected[i])
    assert all(r["document"] == {"text": None} for r in body["results"])  # vLLM's RerankDocument, no text
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)

    # errors: each on its own line, the run goes on
    bad_json = lines[2]
    assert bad_json["response"] is None and bad_json["error"]["code"] == "invalid_json"
    assert "line 3" in bad_json["error"]["message"]
    for custom_id, code in (
        ("chat", "unsupported_url"),
        ("no-docs", "invalid_body"),
        ("too-long", "invalid_input"),
    ):
        line = by_id[custom_id]
        assert line["response"]["status_code"] == 400 and line["response"]["body"] is None
        assert line["error"]["code"] == code, line
    assert "'documents'" in by_id["no-docs"]["error"]["message"]
    assert "documents[1]" in by_id["too-long"]["error"]["message"]

    assert report.rows_read == len(REQUESTS)
    assert report.items == 3 + 4 + 3 + 2 + 2 + 1
    assert report.items_failed == 2  # the too-long request's two documents
    assert report.items_scored == report.items - report.items_failed - report.duplicates
    assert report.rows_written == len(REQUESTS)  # one response line per request
    assert report.requests == len(REQUESTS)
    assert report.requests_failed == 4  # bad json, chat, no-docs, too-long
    assert "(4 failed" in report.summary()
    assert report.groups > 0 and report.seconds_total > 0 and report.backend
    assert list(tmp_path.glob(".results.jsonl*")) == [] and not (tmp_path / "results.jsonl.lock").exists()


def test_stdout_and_existing_output(qwen3_causal, tmp_path, capsys, monkeypatch):
    src = write_batch(tmp_path / "batch.jsonl", REQUESTS[:2])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(src.read_bytes())))
    job.run(batch_config(qwen3_causal, "-", "-"))  # stdin to stdout
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["custom_id"] for line in lines] == ["s-1n", "r-top2"]

    out = tmp_path / "results.jsonl"
    out.write_text("keep me\n")
    with pytest.raises(InputError, match="already exists"):
        job.run(batch_config(qwen3_causal, src, out))
    assert out.read_text() == "keep me\n"

    def broken(*args, **kwargs):  # a failure mid-run: the destination keeps its old content
        raise RuntimeError("boom")

    monkeypatch.setattr(Scorer, "run", broken)
    with pytest.raises(RuntimeError):
        job.run(batch_config(qwen3_causal, src, out, overwrite=True))
    assert out.read_text() == "keep me\n"
    assert list(tmp_path.glob(".results.jsonl*")) == [] and not (tmp_path / "results.jsonl.lock").exists()


def test_dry_run_writes_nothing(qwen3_causal, tmp_path):
    src, out = write_batch(tmp_path / "batch.jsonl", REQUESTS), tmp_path / "results.jsonl"
    report = job.run(batch_config(qwen3_causal, src, out, dry_run=True))
    assert not out.exists()
    assert report.items == 15 and report.items_failed == 2 and report.items_scored == 0


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"top_k": 3}, "--top-k"),
        ({"resume": True}, "--resume"),
        ({"columns": ColumnOverrides(keep_columns=("tag",))}, "column options"),
        ({"output": "results.parquet"}, "JSONL"),
    ],
)
def test_refused_settings(qwen3_causal, tmp_path, overrides, match):
    src = write_batch(tmp_path / "batch.jsonl", REQUESTS[:1])
    if "output" in overrides:
        overrides = {"output": str(tmp_path / overrides["output"])}
    config = batch_config(qwen3_causal, src, tmp_path / "out.jsonl", **overrides)
    with pytest.raises(InputError, match=match):
        job.run(config)


def sniff(path) -> bool:
    return looks_like_openai_batch(InputFile(Location.on_disk(path), FileFormat.JSONL, None))


def test_looks_like_openai_batch(tmp_path):
    batch = write_batch(tmp_path / "batch.jsonl", REQUESTS)
    assert sniff(batch)
    leading_blank = tmp_path / "blank.jsonl"
    leading_blank.write_text("\n  \n" + json.dumps(REQUESTS[0]) + "\n")
    assert sniff(leading_blank)
    assert not sniff(write_jsonl(tmp_path / "table.jsonl", ROWS))
    assert not sniff("-")
    assert not sniff(tmp_path)
    assert not sniff(tmp_path / "missing.jsonl")
    for name, text in (("empty.jsonl", ""), ("bad.jsonl", "{not json\n"), ("list.jsonl", "[1, 2]\n")):
        (tmp_path / name).write_text(text)
        assert not sniff(tmp_path / name)
    no_body = tmp_path / "no_body.jsonl"
    no_body.write_text(json.dumps({"custom_id": "a", "url": "/v1/score"}) + "\n")
    assert not sniff(no_body)


def _request(body: dict, url: str = "/v1/score", **envelope) -> str:
    return json.dumps({"custom_id": "x", "method": "POST", "url": url, "body": body, **envelope})


@pytest.mark.parametrize(
    "line, code, http, needle",
    [
        (b"\xff\xfe{}", "invalid_json", False, "UTF-8"),
        ("[1]", "invalid_request", False, "JSON object"),
        (json.dumps({"url": "/v1/score", "body": {}}), "invalid_request", False, "custom_id"),
        (json.dumps({"custom_id": 7, "url": "/v1/score", "body": {}}), "invalid_request", False, "string"),
        (_request({}, method="GET"), "invalid_request", False, "POST"),
        (_request([]), "invalid_request", False, "body"),
        (_request({}, url="/v1/embeddings"), "unsupported_url", True, "/v1/embeddings"),
        (_request({"text_1": "q"}), "invalid_body", True, "'text_2'"),
        (_request({"text_1": [], "text_2": "d"}), "invalid_body", True, "empty"),
        (_request({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}), "invalid_body", True, "1:1, 1:N or N:N"),
        (_request({"text_1": "q", "text_2": [{"type": "image_url"}]}), "invalid_body", True, "text_2[0]"),
        (_request({"text_1": "q", "text_2": "d", "truncate_prompt_tokens": 0}), "invalid_body", True, "truncate_prompt_tokens"),
        (_request({"text_1": "q", "text_2": "d", "use_activation": "yes"}), "invalid_body", True, "true or false"),
        (_request({"query": "q", "documents": ["d"], "raw_scores": True, "use_activation": True}, url="/rerank"), "invalid_body", True, "contradicts"),
        (_request({"text_1": "q", "text_2": "d", "mm_processor_kwargs": {}}), "unsupported_parameter", True, "multimodal"),
        (_request({"query": ["q"], "documents": ["d"]}, url="/rerank"), "invalid_body", True, "query"),
        (_request({"query": "q", "documents": ["d"], "top_n": "2"}, url="/rerank"), "invalid_body", True, "top_n"),
    ],
)  # fmt: skip
def test_parse_errors(line, code, http, needle):
    request = parse_request(line, 5, 0)
    assert request.error is not None and request.error.code == code
    assert request.error.http is http
    assert needle in request.error.message and request.error.message.startswith("line 5: ")
    assert request.items == []


def test_parse_mapping():
    request = parse_request(_request({"text_1": ["a", "b", "a"], "text_2": ["x", "y", "z"]}), 1, 0)
    assert request.error is None and request.endpoint == "score"
    assert request.queries == ["a", "b", "a"] and request.items == ["x", "y", "z"]
    request = parse_request(_request({"queries": "q", "documents": ["x", "y"], "model": "m"}), 1, 0)
    assert request.queries == ["q", "q"] and request.item_field == "documents"
    request = parse_request(_request({"query": "q", "documents": "only", "top_n": 0}, url="/v1/rerank"), 1, 0)
    assert request.endpoint == "rerank" and request.items == ["only"] and request.top_n == 0


def _ok(line: dict) -> dict:
    assert line["error"] is None, line
    assert line["response"]["status_code"] == 200
    assert line["response"]["request_id"]
    return line["response"]["body"]


def _close(got, expected) -> None:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape
    assert np.max(np.abs(got - expected)) <= 1e-6, (got, expected)


def test_batch_file_through_the_cli_detected_and_named(qwen3_causal, tmp_path):
    requests = [
        {
            "custom_id": "r1",
            "method": "POST",
            "url": "/v1/rerank",
            "body": {"query": "Tokyo is", "documents": [" a city", " the flag"]},
        },
        {
            "custom_id": "s1",
            "method": "POST",
            "url": "/v1/score",
            "body": {"text_1": "Tokyo is", "text_2": [" a city"]},
        },
    ]
    data = tmp_path / "requests.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in requests))
    detected = run_cli(data, "-o", tmp_path / "out.jsonl", "--model", qwen3_causal, *LABEL_FLAGS)
    assert detected.returncode == 0, detected.stderr
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["r1", "s1"]
    rerank = lines[0]["response"]["body"]["results"]
    city = next(r["relevance_score"] for r in rerank if r["index"] == 0)
    assert abs(lines[1]["response"]["body"]["data"][0]["score"] - city) <= 1e-6  # same query, same item
    named = run_cli(
        "-",
        "-o",
        "-",
        "--model",
        qwen3_causal,
        *LABEL_FLAGS,
        "--input-format",
        "openai-batch",
        "-q",
        stdin=data.read_text(),
    )
    assert named.returncode == 0, named.stderr
    assert [json.loads(line)["custom_id"] for line in named.stdout.splitlines()] == ["r1", "s1"]


def test_parse_switches():
    """vLLM's use_activation and its deprecated spellings (first set wins), TEI's raw_scores and return_text."""
    cases = [
        ({}, None),
        ({"use_activation": False}, False),
        ({"use_activation": True}, True),
        ({"activation": False, "use_activation": True}, False),  # vLLM: softmax, activation, use_activation
        ({"softmax": True, "activation": False}, True),
        ({"use_activation": None, "softmax": None}, None),
    ]
    for extra, expected in cases:
        request = parse_request(_request({"text_1": "q", "text_2": ["d"], **extra}), 1, 0)
        assert request.error is None and request.use_activation is expected, extra
    tei = parse_request(
        _request({"query": "q", "texts": ["a", "b"], "raw_scores": True}, url="/rerank"), 1, 0
    )
    assert tei.error is None and tei.use_activation is False and tei.items == ["a", "b"]
    assert tei.return_documents is True  # vLLM always returns documents
    tei = parse_request(_request({"query": "q", "texts": ["a"], "return_text": False}, url="/rerank"), 1, 0)
    assert tei.return_documents is False and tei.use_activation is None
    cut = parse_request(_request({"text_1": "q", "text_2": "d", "truncate_prompt_tokens": 7}), 1, 0)
    assert cut.truncate_prompt_tokens == 7
    whole = parse_request(_request({"text_1": "q", "text_2": "d", "truncate_prompt_tokens": -1}), 1, 0)
    assert whole.error is None and whole.truncate_prompt_tokens is None  # -1: the model's own limit


def test_bom_and_crlf_detected_and_read(qwen3_causal, tmp_path):
    """A batch file saved by a Windows editor (UTF-8 BOM, CRLF) is a batch file, read line by line."""
    text = "\r\n".join(json.dumps(r) for r in REQUESTS[:2]) + "\r\n"
    src = tmp_path / "windows.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert sniff(src)
    result = run_cli(src, "-o", tmp_path / "out.jsonl", "--model", qwen3_causal, *LABEL_FLAGS)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["s-1n", "r-top2"]
    assert all(line["error"] is None for line in lines)


def test_stdin_batch_detected_and_failures_counted(qwen3_causal, tmp_path):
    """A batch file on stdin is detected without --input-format; the summary counts failed requests."""
    requests = [*REQUESTS[:2], "{broken", *REQUESTS[4:6]]
    report = tmp_path / "report.json"
    result = run_cli(
        "-", "-o", "-", "--model", qwen3_causal, *LABEL_FLAGS, "--report", report,
        stdin="".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["custom_id"] for line in lines] == ["s-1n", "r-top2", None, "chat", "no-docs"]
    assert "3 failed" in result.stderr and "0 failed" not in result.stderr
    written = json.loads(report.read_text())
    assert written["requests"] == 5 and written["requests_failed"] == 3


def test_stdin_batch_as_table_names_the_flag(qwen3_causal):
    result = run_cli(
        "-", "-o", "-", "--model", qwen3_causal, *LABEL_FLAGS, "--input-format", "table",
        stdin=json.dumps(REQUESTS[0]) + "\n",
    )  # fmt: skip
    assert result.returncode == 2
    assert "--input-format openai-batch" in result.stderr and "Traceback" not in result.stderr


def test_use_activation_with_raw_label_logits(qwen3_causal, tmp_path):
    """A CausalLM run whose score is a label's raw logit (label_score logit, as the bge-reranker-v2-gemma
    profile): use_activation true gives its sigmoid (FlagEmbedding's normalize=True), false and unset the logit.
    Under label_score sigmoid there is no raw logit to give: use_activation false is that request's error line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen3_causal)
    model = AutoModelForCausalLM.from_pretrained(qwen3_causal, dtype=torch.float32).eval()
    label = tokenizer(" the", add_special_tokens=False)["input_ids"][0]
    items = [" to", " the flag of", " Japan"]
    with torch.no_grad():
        logits = np.array(
            [
                model(torch.tensor([tokenizer(QUERY_A)["input_ids"] + tokenizer(i)["input_ids"]])).logits[
                    0, -1, label
                ]
                for i in items
            ]
        )
    body = {"text_1": QUERY_A, "text_2": items}
    requests = [
        {"custom_id": name, "url": "/v1/score", "body": {**body, **extra}}
        for name, extra in (
            ("unset", {}),
            ("on", {"use_activation": True}),
            ("off", {"use_activation": False}),
        )
    ]
    for label_score in ("logit", "sigmoid"):
        src, out = tmp_path / f"{label_score}.jsonl", tmp_path / f"{label_score}-out.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in requests))
        scoring = ScoringConfig(label_tokens=(" the",), label_score=label_score)
        config = RunConfig(
            input=str(src),
            output=str(out),
            model_dir=qwen3_causal,
            columns=ColumnOverrides(),
            engine=EngineConfig(device="cpu", scoring=scoring),
        )
        job.run(config)
        lines = {line["custom_id"]: line for line in map(json.loads, out.read_text().splitlines())}
        sigmoid = 1 / (1 + np.exp(-logits))
        if label_score == "logit":
            _near(lines["unset"], logits)
            _near(lines["off"], logits)
            _near(lines["on"], sigmoid)
        else:
            _near(lines["unset"], sigmoid)
            _near(lines["on"], sigmoid)
            assert lines["off"]["error"]["code"] == "unsupported_parameter"
            assert "--label-score logit" in lines["off"]["error"]["message"]


def _near(line: dict, expected) -> None:
    """A score response's scores within 1e-5 of a plain forward pass (a raw logit, not a probability)."""
    got = np.array([d["score"] for d in _ok(line)["data"]])
    assert np.max(np.abs(got - np.asarray(expected))) <= 1e-5, (got, expected)


def test_batch_files_on_an_object_store_and_compressed(qwen3_causal, tmp_path, s3):  # noqa: F811
    """A batch file read from s3:// (gzip-compressed) and its responses published to s3:// give the lines a
    local run gives (detected without --input-format; `created` aside)."""
    client, bucket, storage = s3
    src = write_batch(tmp_path / "batch.jsonl", REQUESTS)
    flags = ["--model", qwen3_causal, *LABEL_FLAGS, "--max-item-tokens", "16", *storage]
    local = run_cli(src, "-o", tmp_path / "out.jsonl", *flags)
    assert local.returncode == 0, local.stderr
    gz = gzip.compress(src.read_bytes())
    client.put_object(Bucket=bucket, Key="in/batch.jsonl.gz", Body=gz, ACL="public-read")  # HTTP reads it too
    remote = run_cli(f"s3://{bucket}/in/batch.jsonl.gz", "-o", f"s3://{bucket}/out/responses.jsonl", *flags)
    assert remote.returncode == 0, remote.stderr
    body = client.get_object(Bucket=bucket, Key="out/responses.jsonl")["Body"].read().decode()

    def without_created(text: str) -> list[dict]:
        lines = [json.loads(line) for line in text.splitlines()]
        for line in lines:
            (line["response"] or {}).get("body", {}) and line["response"]["body"].pop("created", None)
        return lines

    assert without_created(body) == without_created((tmp_path / "out.jsonl").read_text())
    assert keys(client, bucket) == ["in/batch.jsonl.gz", "out/responses.jsonl"]  # no lock or staging left
    again = run_cli(f"s3://{bucket}/in/batch.jsonl.gz", "-o", f"s3://{bucket}/out/responses.jsonl", *flags)
    assert again.returncode == 2 and "--overwrite" in again.stderr and "Traceback" not in again.stderr
    endpoint = storage[1].split("=", 1)[
        1
    ]  # the same object over plain HTTP(S), as vllm run-batch -i https://
    fetched = run_cli(f"{endpoint}/{bucket}/in/batch.jsonl.gz", "-o", tmp_path / "http.jsonl", *flags)
    assert fetched.returncode == 0, fetched.stderr
    assert without_created((tmp_path / "http.jsonl").read_text()) == without_created(body)


def test_a_presigned_url_is_named_by_its_path():
    from score_batch.io_formats.listing import file_format
    from score_batch.io_formats.locations import parse_location

    location = parse_location(
        "https://bucket.example.com/in/batch.jsonl.gz?X-Amz-Signature=abc&X-Amz-Expires=60"
    )
    assert location.name == "batch.jsonl.gz" and "abc" not in location.uri
    assert file_format(location.name) is not None


def test_a_damaged_compressed_batch_file_is_a_one_line_error(qwen3_causal, tmp_path):
    good = gzip.compress(write_batch(tmp_path / "batch.jsonl", REQUESTS).read_bytes())
    damaged = tmp_path / "damaged.jsonl.gz"
    damaged.write_bytes(good[: len(good) // 2])  # cut off midway: the first lines read, then the stream ends
    out = tmp_path / "out.jsonl"
    ran = run_cli(damaged, "-o", out, "--model", qwen3_causal, *LABEL_FLAGS, "--input-format", "openai-batch")
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert "damaged.jsonl.gz: cannot read" in ran.stderr and not out.exists()
    assert not list(tmp_path.glob(".out.jsonl*"))  # no temporary file left beside the output
