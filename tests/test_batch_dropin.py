"""Batch files as a drop-in for `vllm run-batch`: request files shaped like vLLM's own run-batch tests, every
output line validated against pydantic models written from vLLM's documented response fields, and the
per-request switches (use_activation, truncate_prompt_tokens) checked against plain Hugging Face forward passes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from pydantic import BaseModel, ConfigDict
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from score_batch import job
from score_batch.engine import EngineConfig, ScoringConfig
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.run_config import RunConfig

ACTIVATION_MERGED = importlib.util.find_spec("score_batch.engine.activation") is not None
needs_activation = pytest.mark.xfail(
    not ACTIVATION_MERGED, reason="engine.activation not merged", strict=True
)

QUESTION = "Which river runs through Vienna?"
DOCUMENTS = [
    "The Danube flows through Vienna.",
    "Paris lies on the Seine.",
    "Vienna has a large opera house.",
]


# vLLM's response models (vllm/entrypoints/openai/run_batch.py, vllm/entrypoints/pooling/score/protocol.py),
# strict about the fields we promise: extra keys are refused so a misspelt field fails the test.
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UsageInfo(_Strict):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int | None = 0
    prompt_tokens_details: Any = None


class ScoreResponseData(_Strict):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(_Strict):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreResponseData]
    usage: UsageInfo


class RerankDocument(_Strict):
    text: str | None = None


class RerankResult(_Strict):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(_Strict):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(_Strict):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class BatchResponseData(_Strict):
    status_code: int
    request_id: str
    body: dict | None


class BatchRequestOutput(_Strict):
    id: str
    custom_id: str | None
    response: BatchResponseData | None
    error: Any


def _request(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "my-reranker", **body}}


SCORE_REQUESTS = [  # as vLLM's test_run_batch score file: /score and /v1/score, one text_1 against a list
    _request("score-1", "/score", {"text_1": QUESTION, "text_2": DOCUMENTS[:2]}),
    _request("score-2", "/v1/score", {"text_1": QUESTION, "text_2": DOCUMENTS[:2]}),
    _request("score-raw", "/v1/score", {"text_1": QUESTION, "text_2": DOCUMENTS, "use_activation": False}),
    _request("score-act", "/v1/score", {"text_1": QUESTION, "text_2": DOCUMENTS, "use_activation": True}),
]
RERANK_REQUESTS = [  # as vLLM's rerank file: /rerank, /v1/rerank and /v2/rerank
    _request("rerank-1", "/rerank", {"query": QUESTION, "documents": DOCUMENTS}),
    _request("rerank-2", "/v1/rerank", {"query": QUESTION, "documents": DOCUMENTS, "top_n": 2}),
    _request("rerank-3", "/v2/rerank", {"query": QUESTION, "documents": DOCUMENTS, "softmax": False}),
    _request("rerank-tei", "/rerank", {"query": QUESTION, "texts": DOCUMENTS, "raw_scores": True, "return_text": False}),
]  # fmt: skip


@pytest.fixture(scope="module")
def cross_encoder(zoo) -> Path:
    """A tiny one-label BERT cross-encoder (vLLM applies a sigmoid to its logit by default)."""
    return zoo.get("bert", "classifier", num_labels=1)


@pytest.fixture(scope="module")
def logits(cross_encoder) -> np.ndarray:
    """The head's logit for (QUESTION, document), from a plain Hugging Face forward pass per pair."""
    tokenizer = AutoTokenizer.from_pretrained(cross_encoder)
    model = AutoModelForSequenceClassification.from_pretrained(cross_encoder).eval()
    with torch.no_grad():
        return np.array(
            [model(**tokenizer(QUESTION, d, return_tensors="pt")).logits[0, 0].item() for d in DOCUMENTS]
        )


def run_batch_file(
    model_dir: Path, tmp_path: Path, requests: list[dict], scoring: ScoringConfig, **engine
) -> list[dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in requests))
    config = RunConfig(
        input=str(src),
        output=str(out),
        model_dir=model_dir,
        columns=ColumnOverrides(),
        engine=EngineConfig(device="cpu", scoring=scoring, **engine),
    )
    job.run(config)  # the batch-file runner of the one run loop
    lines = out.read_text().splitlines()
    assert len(lines) == len(requests)
    for line in lines:
        BatchRequestOutput.model_validate_json(line)
    return [json.loads(line) for line in lines]


def _bodies(lines: list[dict], model) -> dict[str, BaseModel]:
    bodies = {}
    for line in lines:
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        bodies[line["custom_id"]] = model.model_validate(line["response"]["body"])
    return bodies


def _close(got, expected, tolerance: float = 1e-5) -> None:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape and np.max(np.abs(got - expected)) <= tolerance, (got, expected)


def test_score_file_validates_and_raw_is_the_logit(cross_encoder, logits, tmp_path):
    bodies = _bodies(run_batch_file(cross_encoder, tmp_path, SCORE_REQUESTS, ScoringConfig()), ScoreResponse)
    assert [d.index for d in bodies["score-1"].data] == [0, 1]
    assert bodies["score-1"].usage.prompt_tokens > 0
    _close([d.score for d in bodies["score-1"].data], [d.score for d in bodies["score-2"].data], 0)
    _close([d.score for d in bodies["score-raw"].data], logits)  # use_activation false: the raw logit


def test_rerank_file_validates(cross_encoder, logits, tmp_path):
    bodies = _bodies(
        run_batch_file(cross_encoder, tmp_path, RERANK_REQUESTS, ScoringConfig()), RerankResponse
    )
    order = list(np.argsort(-logits, kind="stable"))
    assert [r.index for r in bodies["rerank-1"].results] == order  # sigmoid keeps the logit order
    assert [r.document.text for r in bodies["rerank-1"].results] == [DOCUMENTS[i] for i in order]
    assert [r.index for r in bodies["rerank-2"].results] == order[:2]
    for name in ("rerank-3", "rerank-tei"):  # vLLM's softmax=false, TEI's raw_scores=true: raw logits
        results = bodies[name].results
        _close([r.relevance_score for r in results], logits[[r.index for r in results]])
    assert all(r.document.text is None for r in bodies["rerank-tei"].results)  # return_text false


@needs_activation
def test_use_activation_true_is_the_sigmoid(cross_encoder, logits, tmp_path):
    """use_activation true (and vLLM's default, unset) gives sigmoid(logit) for a one-label head, whatever
    the run's own --activation is; false gives the logit."""
    sigmoid = 1 / (1 + np.exp(-logits))
    for activation in ("auto", "none"):
        scoring = ScoringConfig(activation=activation)
        bodies = _bodies(
            run_batch_file(cross_encoder, tmp_path / activation, SCORE_REQUESTS, scoring), ScoreResponse
        )
        _close([d.score for d in bodies["score-act"].data], sigmoid)
        _close([d.score for d in bodies["score-raw"].data], logits)
    bodies = _bodies(
        run_batch_file(cross_encoder, tmp_path / "default", SCORE_REQUESTS[:1], ScoringConfig()),
        ScoreResponse,
    )
    _close([d.score for d in bodies["score-1"].data], sigmoid[:2])


def test_truncate_prompt_tokens_keeps_the_last_tokens(qwen3_causal, tmp_path):
    """A causal model: each pair longer than N tokens is scored on its last N tokens, as a plain forward pass of
    those tokens gives; shorter pairs are untouched."""
    labels = (" to", " the")
    tokenizer = AutoTokenizer.from_pretrained(qwen3_causal)
    model = AutoModelForCausalLM.from_pretrained(qwen3_causal).eval()
    label_ids = [tokenizer.encode(label, add_special_tokens=False)[0] for label in labels]
    query, items = (
        "Tokyo is a city in the east of",
        [" Japan", " the flag of the country of the rising sun", " to"],
    )
    sequences = [
        tokenizer(query)["input_ids"] + tokenizer(item, add_special_tokens=False)["input_ids"]
        for item in items
    ]
    keep = 6
    assert len(sequences[0]) > keep and len(sequences[1]) > len(tokenizer(query)["input_ids"]) + keep

    def reference(ids: list[int]) -> float:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        return torch.softmax(logits, dim=-1)[label_ids[-1]].item()  # P(" the"), the default score

    requests = [
        _request("cut", "/v1/score", {"text_1": query, "text_2": items, "truncate_prompt_tokens": keep}),
        _request("whole", "/v1/score", {"text_1": query, "text_2": items, "truncate_prompt_tokens": -1}),
        _request("long", "/v1/rerank", {"query": query, "documents": items, "truncate_prompt_tokens": 1000}),
    ]
    lines = run_batch_file(qwen3_causal, tmp_path, requests, ScoringConfig(label_tokens=labels))
    bodies = {line["custom_id"]: line["response"]["body"] for line in lines}
    _close([d["score"] for d in bodies["cut"]["data"]], [reference(ids[-keep:]) for ids in sequences])
    whole = [reference(ids) for ids in sequences]
    _close([d["score"] for d in bodies["whole"]["data"]], whole)
    _close(sorted(r["relevance_score"] for r in bodies["long"]["results"]), sorted(whole))


def test_truncate_prompt_tokens_on_an_encoder_is_an_error_line(cross_encoder, tmp_path):
    requests = [
        _request("cut", "/v1/score", {"text_1": QUESTION, "text_2": DOCUMENTS, "truncate_prompt_tokens": 4}),
        _request(
            "fits", "/v1/score", {"text_1": QUESTION, "text_2": DOCUMENTS, "truncate_prompt_tokens": 500}
        ),
    ]
    cut, fits = run_batch_file(cross_encoder, tmp_path, requests, ScoringConfig())
    assert cut["response"]["status_code"] == 400 and "truncate_prompt_tokens 4" in cut["error"]["message"]
    assert fits["error"] is None
