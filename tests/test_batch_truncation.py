"""Batch-file truncation against the rules vLLM and TEI document for their request fields.

vLLM (/v1/score, /v1/rerank): max_tokens_per_query / max_tokens_per_doc cut the query text / each document
text to its first N tokens, before any score template (vllm/entrypoints/pooling/scoring: utils.py
truncate_text_to_tokens, io_processor.py get_score_prompt; vLLM PR #38827), and truncation_side chooses which
N tokens truncate_prompt_tokens keeps (protocol.py: "'right' keeps the first N tokens. 'left' keeps the last
N tokens.").
TEI (/rerank): truncate cuts an over-long (query, text) pair to the model's max_input_length with the
tokenizers library's longest_first truncation in truncation_direction (core/src/tokenization.rs encode_input;
router/src/http/types.rs TruncationDirection, "Left"/"left"/"Right"/"right").

The rules are written out below as the references, and scores are compared with plain Hugging Face forward
passes of the sequences the rules give.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from score_batch.engine import ScoringConfig
from score_batch.io_formats.batch_requests import parse_request
from tests.test_batch_dropin import run_batch_file

LABELS = (" to", " the")
QUERY = "Tokyo is a city in the east of Japan and the capital of the country"
DOCUMENTS = [
    " the flag of the United States of America",
    " Japan",
    " wireless noise cancelling headphones with long battery life, red running shoes for women",
]


# --------------------------------------------------------------------------------------------- the rules


def vllm_truncate_text_to_tokens(text: str, tokenizer, max_tokens: int) -> str:
    """vLLM's rule for max_tokens_per_query / max_tokens_per_doc, transcribed from
    vllm/entrypoints/pooling/scoring/utils.py truncate_text_to_tokens: the text's own tokens (no special
    tokens); over max_tokens, the text up to the end offset of token max_tokens."""
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if len(encoding["input_ids"]) <= max_tokens:
        return text
    char_end = encoding["offset_mapping"][max_tokens - 1][1]
    return text[:char_end]


def tokenizers_longest_first(first: list, second: list, max_length: int, direction: str) -> tuple[list, list]:
    """The tokenizers library's LongestFirst pair truncation (tokenizers/src/utils/truncation.rs
    truncate_encodings), which TEI applies with max_length = max_input_length less the pair's special tokens
    (TokenizerImpl::post_process); direction "right" cuts ends, "left" starts."""
    n1, n2 = len(first), len(second)
    if n1 + n2 <= max_length:
        return first, second
    swap = n1 > n2
    if swap:
        n1, n2 = n2, n1
    n2 = n1 if n1 > max_length else max(n1, max_length - n1)
    if n1 + n2 > max_length:
        n1 = max_length // 2
        n2 = n1 + max_length % 2
    if swap:
        n1, n2 = n2, n1

    def keep(ids: list, n: int) -> list:
        return ids[:n] if direction == "right" else ids[len(ids) - n :]

    return keep(first, n1), keep(second, n2)


# --------------------------------------------------------------------------------------------- helpers


def _request(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _run(model_dir: Path, tmp_path: Path, requests: list, scoring: ScoringConfig, **engine) -> dict:
    """The batch file's response lines (each checked against vLLM's schema) by custom_id."""
    return {
        line["custom_id"]: line for line in run_batch_file(model_dir, tmp_path, requests, scoring, **engine)
    }


def _scores(line: dict) -> list[float]:
    assert line["error"] is None, line
    body = line["response"]["body"]
    if "data" in body:
        return [d["score"] for d in body["data"]]
    return [r["relevance_score"] for r in sorted(body["results"], key=lambda r: r["index"])]


def _close(got, expected, tolerance: float = 1e-5) -> None:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape and np.max(np.abs(got - expected)) <= tolerance, (got, expected)


class Causal:
    """Plain Hugging Face P(" the") at the last token of a token sequence (the run's default score)."""

    def __init__(self, model_dir: Path) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.label = self.tokenizer(LABELS[-1], add_special_tokens=False)["input_ids"][0]

    def ids(self, query: str, item: str) -> list[int]:
        """The run's sequence layout: the query with the tokenizer's special tokens, the item without."""
        return (
            self.tokenizer(query)["input_ids"] + self.tokenizer(item, add_special_tokens=False)["input_ids"]
        )

    def score(self, ids: list[int]) -> float:
        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0, -1].float()
        return torch.softmax(logits, dim=-1)[self.label].item()


@pytest.fixture(scope="module")
def causal(qwen3_causal) -> Causal:
    return Causal(qwen3_causal)


@pytest.fixture(scope="module")
def encoder(zoo) -> Path:
    return zoo.get("bert", "classifier", num_labels=1)


def _encoder_logit(model_dir: Path, **encoded) -> float:
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        tensors = {k: torch.tensor([v]) for k, v in encoded.items() if k != "special_tokens_mask"}
        return model(**tensors).logits[0, 0].item()


# ------------------------------------------------------------------------------ vLLM max_tokens_per_*


def test_max_tokens_per_doc_and_query_cut_the_texts_first_tokens(qwen3_causal, causal, tmp_path):
    tok = causal.tokenizer
    n_doc, n_query = 3, 4
    assert all(len(tok(d, add_special_tokens=False)["input_ids"]) != n_doc for d in DOCUMENTS)
    requests = [
        _request("doc", "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": n_doc}),
        _request("query", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS, "max_tokens_per_query": n_query}),
        _request(
            "both", "/v1/score",
            {"text_1": [QUERY] * 3, "text_2": DOCUMENTS, "max_tokens_per_query": n_query, "max_tokens_per_doc": n_doc},
        ),
        _request("off", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS, "max_tokens_per_doc": 0}),
    ]  # fmt: skip
    lines = _run(qwen3_causal, tmp_path, requests, ScoringConfig(label_tokens=LABELS))
    query_cut = vllm_truncate_text_to_tokens(QUERY, tok, n_query)
    docs_cut = [vllm_truncate_text_to_tokens(d, tok, n_doc) for d in DOCUMENTS]
    assert len(tok(query_cut, add_special_tokens=False)["input_ids"]) == n_query and QUERY.startswith(
        query_cut
    )
    assert [d for d in docs_cut if d not in DOCUMENTS]  # some documents were cut, " Japan" was not
    _close(_scores(lines["doc"]), [causal.score(causal.ids(QUERY, d)) for d in docs_cut])
    _close(_scores(lines["query"]), [causal.score(causal.ids(query_cut, d)) for d in DOCUMENTS])
    _close(_scores(lines["both"]), [causal.score(causal.ids(query_cut, d)) for d in docs_cut])
    _close(_scores(lines["off"]), [causal.score(causal.ids(QUERY, d)) for d in DOCUMENTS])
    # rerank results return the documents as the request gave them (vLLM returns request.documents)
    texts = {r["index"]: r["document"]["text"] for r in lines["doc"]["response"]["body"]["results"]}
    assert texts == dict(enumerate(DOCUMENTS))


def test_max_tokens_count_the_text_not_the_templates(qwen3_causal, causal, tmp_path):
    """vLLM cuts the texts before its score template wraps them: the run's templates are never cut."""
    scoring = ScoringConfig(
        label_tokens=LABELS, query_template="Query: {query}\n", item_template="Doc: {item}\nA:"
    )
    requests = [
        _request("t", "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": 2})
    ]
    lines = _run(qwen3_causal, tmp_path, requests, scoring)
    tok = causal.tokenizer
    expected = []
    for document in DOCUMENTS:
        cut = vllm_truncate_text_to_tokens(document, tok, 2)
        expected.append(causal.score(causal.ids(f"Query: {QUERY}\n", f"Doc: {cut}\nA:")))
    _close(_scores(lines["t"]), expected)


def test_max_tokens_per_doc_on_an_encoder_as_vllms_cross_encoder(encoder, tmp_path):
    """vLLM's cross-encoder path: the texts cut, then the pair encoded with truncation only_second at
    len(query tokens) + max_tokens_per_doc + the pair's special tokens (io_processor.py get_score_prompt)."""
    tok = AutoTokenizer.from_pretrained(encoder)
    n = 2
    requests = [
        _request("e", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS, "max_tokens_per_doc": n, "use_activation": False}),
    ]  # fmt: skip
    lines = _run(encoder, tmp_path, requests, ScoringConfig())
    expected = []
    for document in DOCUMENTS:
        prompt_2 = vllm_truncate_text_to_tokens(document, tok, n)
        query_tokens = tok.encode(QUERY, add_special_tokens=False)
        max_length = len(query_tokens) + n + tok.num_special_tokens_to_add(pair=True)
        encoded = tok(text=QUERY, text_pair=prompt_2, truncation="only_second", max_length=max_length)
        expected.append(_encoder_logit(encoder, **encoded))
    _close(_scores(lines["e"]), expected)


def test_max_tokens_limits_are_checked_per_request(qwen3_causal, tmp_path):
    """vLLM refuses a negative limit and one at or over the model's length (400); here: that request's error
    line, the others scored."""
    requests = [
        _request("too-big", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS, "max_tokens_per_doc": 64}),
        _request("fine", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS, "max_tokens_per_query": 63}),
        _request("negative", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS, "max_tokens_per_query": -1}),
    ]
    lines = _run(qwen3_causal, tmp_path, requests, ScoringConfig(label_tokens=LABELS), max_pack_tokens=64)
    assert lines["too-big"]["error"]["code"] == "invalid_body"
    assert "must be less than the model's length (64)" in lines["too-big"]["error"]["message"]
    assert lines["too-big"]["response"]["status_code"] == 400
    assert lines["negative"]["error"]["code"] == "invalid_body"
    assert lines["fine"]["error"] is None


# ------------------------------------------------------------------------- vLLM truncation_side


def test_truncation_side_right_keeps_the_first_tokens(qwen3_causal, causal, tmp_path):
    sequences = [causal.ids(QUERY, d) for d in DOCUMENTS]
    keep = len(causal.ids(QUERY, "")) + 2  # the whole query and two item tokens
    requests = [
        _request("right", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS, "truncate_prompt_tokens": keep, "truncation_side": "right"}),
        _request("left", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS, "truncate_prompt_tokens": keep, "truncation_side": "left"}),
        _request("query-only", "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS, "truncate_prompt_tokens": 3, "truncation_side": "right"}),
    ]  # fmt: skip
    lines = _run(qwen3_causal, tmp_path, requests, ScoringConfig(label_tokens=LABELS))
    _close(_scores(lines["right"]), [causal.score(ids[:keep]) for ids in sequences])
    _close(_scores(lines["left"]), [causal.score(ids[-keep:]) for ids in sequences])
    failed = lines["query-only"]
    assert (
        failed["error"]["code"] == "invalid_input"
        and "keeps only tokens of the query" in failed["error"]["message"]
    )


# ------------------------------------------------------------------------------------- TEI truncate


@pytest.mark.parametrize("direction", ["Right", "left"])
def test_tei_truncate_on_an_encoder_cuts_the_pair_longest_first(encoder, tmp_path, direction):
    """A pair over the run's length (max_pack_tokens 24 here: TEI's max_input_length) is cut longest first in
    the direction asked; pairs that fit are untouched; without truncate the over-long pair is an error line."""
    tok = AutoTokenizer.from_pretrained(encoder)
    length = 24
    body = {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}
    requests = [
        _request("cut", "/rerank", {**body, "truncate": True, "truncation_direction": direction}),
        _request("refused", "/rerank", {**body, "truncate": False}),
        _request("default", "/rerank", body),
    ]
    lines = _run(encoder, tmp_path, requests, ScoringConfig(), max_pack_tokens=length)
    expected = []
    special = tok.num_special_tokens_to_add(pair=True)
    cls, sep = tok.convert_tokens_to_ids("[CLS]"), tok.convert_tokens_to_ids("[SEP]")
    for document in DOCUMENTS:
        query_ids = tok(QUERY, add_special_tokens=False)["input_ids"]
        doc_ids = tok(document, add_special_tokens=False)["input_ids"]
        q, d = tokenizers_longest_first(query_ids, doc_ids, length - special, direction.lower())
        ids = [cls, *q, sep, *d, sep]  # the tiny BERT's pair template: [CLS] A [SEP] B [SEP]
        types = [0] * (len(q) + 2) + [1] * (len(d) + 1)
        expected.append(
            _encoder_logit(encoder, input_ids=ids, token_type_ids=types, attention_mask=[1] * len(ids))
        )
        if len(query_ids) + len(doc_ids) + special <= length:
            assert (q, d) == (query_ids, doc_ids)
    assert any(len(tok(QUERY, d)["input_ids"]) > length for d in DOCUMENTS)
    _close(_scores(lines["cut"]), expected)
    for name in ("refused", "default"):  # TEI's default is the server's auto_truncate (off): refused
        assert lines[name]["error"]["code"] == "invalid_input"


@pytest.mark.parametrize("direction", ["right", "Left"])
def test_tei_truncate_on_a_decoder(llama_causal, tmp_path, direction):
    """A decoder (BOS in front): TEI's kept tokens, scored as the plain forward pass of [bos] + query + text."""
    causal = Causal(llama_causal)
    tok = causal.tokenizer
    length = 20  # max_pack_tokens 22 less the two MIS delimiters
    requests = [_request("cut", "/rerank", {"query": QUERY, "texts": DOCUMENTS, "truncate": True, "truncation_direction": direction})]  # fmt: skip
    lines = _run(llama_causal, tmp_path, requests, ScoringConfig(label_tokens=LABELS), max_pack_tokens=22)
    expected = []
    for document in DOCUMENTS:
        query_ids = tok(QUERY, add_special_tokens=False)["input_ids"]
        doc_ids = tok(document, add_special_tokens=False)["input_ids"]
        q, d = tokenizers_longest_first(
            query_ids, doc_ids, length - 1, direction.lower()
        )  # <s> $A $B: one special
        expected.append(causal.score([tok.bos_token_id, *q, *d]))
    assert any(len(causal.ids(QUERY, d)) > length for d in DOCUMENTS)
    _close(_scores(lines["cut"]), expected)


def test_tei_truncate_with_templates_is_an_error_only_where_a_cut_is_needed(qwen3_causal, causal, tmp_path):
    scoring = ScoringConfig(label_tokens=LABELS, query_template="Q: {query}\n", item_template="D: {item}")
    requests = [
        _request("long", "/rerank", {"query": QUERY, "texts": DOCUMENTS, "truncate": True}),
        _request("short", "/rerank", {"query": "Tokyo", "texts": [" Japan"], "truncate": True}),
    ]
    lines = _run(qwen3_causal, tmp_path, requests, scoring, max_pack_tokens=24)
    assert (
        lines["long"]["error"]["code"] == "invalid_input" and "templates" in lines["long"]["error"]["message"]
    )
    _close(_scores(lines["short"]), [causal.score(causal.ids("Q: Tokyo\n", "D:  Japan"))])


def test_tei_text_cut_that_does_not_reencode_is_refused():
    """An encoder takes text: a cut whose text does not encode back to TEI's tokens is refused, not guessed."""
    from score_batch.engine.plan.pair_truncation import _tei_text_pair

    class Encoding:  # TEI kept [CLS] "Tok" [SEP] "Ja" [SEP] (made up: no text encodes to token 999)
        ids = [1, 999, 2, 998, 2]
        sequence_ids = [None, 0, None, 1, None]
        offsets = [(0, 0), (0, 3), (0, 0), (0, 2), (0, 0)]

    def tokenizer(first, second):
        return {"input_ids": [1, 5, 2, 6, 2]}

    refused = _tei_text_pair("Tokyo", "Japan", Encoding(), "right", tokenizer)
    assert isinstance(refused, str) and "do not encode to those tokens" in refused


# ------------------------------------------------------------------------------------------- parsing


def _line(body: dict, url: str = "/rerank") -> str:
    return json.dumps({"custom_id": "x", "url": url, "body": {"query": "q", "texts": ["d"], **body}})


@pytest.mark.parametrize(
    "body, code, needle",
    [
        ({"max_tokens_per_doc": -1}, "invalid_body", "non-negative integer"),
        ({"max_tokens_per_query": "3"}, "invalid_body", "non-negative integer"),
        ({"max_tokens_per_doc": True}, "invalid_body", "non-negative integer"),
        ({"max_tokens_per_doc": 2.5}, "invalid_body", "non-negative integer"),
        ({"truncate": "yes"}, "invalid_body", "true or false"),
        ({"truncate": True, "truncation_direction": "up"}, "invalid_body", "'Right' or 'Left'"),
        ({"truncation_direction": "RIGHT"}, "invalid_body", "'Right' or 'Left'"),
        ({"truncation_side": "middle"}, "invalid_body", "'left' or 'right'"),
        ({"truncate": True, "truncate_prompt_tokens": 5}, "unsupported_parameter", "give one"),
    ],
)
def test_truncation_fields_refused(body, code, needle):
    request = parse_request(_line(body), 3, 0)
    assert request.error is not None and request.error.code == code and needle in request.error.message


def test_truncation_fields_parsed():
    request = parse_request(
        _line(
            {
                "max_tokens_per_doc": 7,
                "max_tokens_per_query": 0,
                "truncate": True,
                "truncation_direction": "Left",
            }
        ),
        1,
        0,
    )
    assert request.error is None
    assert (request.max_tokens_per_doc, request.max_tokens_per_query) == (7, 0)
    assert request.truncate is True and request.truncation_direction == "left"
    defaults = parse_request(
        _line({"truncate": None, "truncation_direction": None, "max_tokens_per_doc": None}), 1, 0
    )
    assert defaults.error is None and defaults.truncate is False and defaults.truncation_direction == "right"
    assert defaults.max_tokens_per_doc == 0 and defaults.truncation_side == "left"
    side = parse_request(
        _line({"truncate_prompt_tokens": 4, "truncation_side": "right"}, url="/v1/rerank"), 1, 0
    )
    assert side.truncation_side == "right" and side.truncate_prompt_tokens == 4
