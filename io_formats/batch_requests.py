"""OpenAI-style batch files, as `vllm run-batch` reads them for /v1/score and /v1/rerank.

Request lines in (`custom_id`, `method`, `url`, `body`), response lines out (`id`, `custom_id`,
`response`, `error`). This module only parses requests into queries and items and builds response
records from scores; it never imports engine/ (job/runners/batch_file_run.py runs the scoring). The mapping
and what is not supported are in docs/openai-batch.md.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from score_batch.io_formats.jsonl import BOM, file_lines, nonblank_lines, too_deep
from score_batch.io_formats.listing import InputFile
from score_batch.io_formats.rows import value_kind

STDIN = "-"  # the INPUT that is standard input
ENVELOPE = ("custom_id", "url", "body")  # the keys of a request line
SCORE_URLS = ("/v1/score", "/score")
RERANK_URLS = ("/v1/rerank", "/rerank", "/v2/rerank")
# The score body's (queries, items) field pairs, as vLLM's ScoreRequest variants name them.
SCORE_FIELDS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))
# Body fields a request may not set (non-null): an error line each.
UNSUPPORTED_FIELDS = {"mm_processor_kwargs": "multimodal inputs are not supported"}
# Per-request activation switches, in the order vLLM reads them (get_use_activation: the first one set wins;
# softmax and activation are vLLM's deprecated spellings of use_activation).
ACTIVATION_FIELDS = ("softmax", "activation", "use_activation")
# TEI's TruncationDirection as its serde aliases spell it (router/src/http/types.rs).
TEI_DIRECTIONS = ("Right", "right", "Left", "left")
DETECT_LIMIT = 64 << 20  # bytes of the first non-blank line read to detect the format
_JSON_TYPES = {  # rows.value_kind → the JSON type's name in messages
    None: "null",
    "bool": "a boolean",
    "int": "a number",
    "float": "a number",
    "text": "a string",
    "list": "an array",
    "object": "an object",
}


@dataclass(frozen=True)
class BatchError:
    """Why a request line got no scores; http: the line was a request (response carries status 400)."""

    code: str
    message: str
    http: bool = True


@dataclass
class BatchRequest:
    """One request line: where it is, its id, and its work (queries and items) or its error."""

    index: int  # 0-based position among the request lines (= output line)
    line: int  # 1-based line number in the input file
    custom_id: Any = None  # as given (echoed even when it is not a string)
    endpoint: str | None = None  # "score" | "rerank"
    item_field: str = ""  # the body field holding the items (text_2, documents, ...), for messages
    items: list[str] = field(default_factory=list)  # one per response entry, in request order
    queries: list[str] = field(default_factory=list)  # per item, its query (text_1 or the query)
    top_n: int = 0  # rerank: keep the best top_n results (0: all)
    return_documents: bool = True  # rerank: include each document's text
    use_activation: bool | None = None  # None: the run's own score; False: the raw value; True: activated
    truncate_prompt_tokens: int | None = None  # cut each (query, item) pair to N tokens; None: off
    # vLLM's, for truncate_prompt_tokens: left keeps the last N, right the first N
    truncation_side: str = "left"
    max_tokens_per_query: int = 0  # vLLM: the query text cut to its first N tokens (0: off)
    max_tokens_per_doc: int = 0  # vLLM: each item text cut to its first N tokens (0: off)
    # TEI: cut an over-long pair to the model's limit (longest first) instead of failing
    truncate: bool = False
    truncation_direction: str = "right"  # TEI, with truncate: right cuts the ends, left the starts
    error: BatchError | None = None


def looks_like_openai_batch(file: InputFile) -> bool:
    """True when a JSONL input file (on any store, or the stdin spool) has a first non-blank line (BOM and CRLF
    allowed) that is a JSON object with custom_id, url and body; anything unreadable is not."""
    try:  # a bounded readline: a file that is one huge line is not read whole
        with io.BufferedReader(file.open()) as handle:
            raw = handle.readline(DETECT_LIMIT).removeprefix(BOM)
            while raw and not raw.strip():
                raw = handle.readline(DETECT_LIMIT)
        record = json.loads(raw.decode("utf-8")) if raw and too_deep(raw) is None else None
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(record, dict) and all(key in record for key in ENVELOPE)


@dataclass(frozen=True)
class BatchFileReader:
    """An OpenAI-style batch file (a listed JSONL input file on any store, or the stdin spool) → requests."""

    file: InputFile

    def requests(self) -> Iterator[BatchRequest]:
        """The request lines in order, parsed; blank lines are skipped, bad lines carry an error."""
        for index, (line, raw) in enumerate(nonblank_lines(file_lines(self.file))):
            yield parse_request(raw, line, index)


def parse_request(raw: bytes | str, line: int, index: int) -> BatchRequest:
    """Parse one request line; problems become the request's error (never an exception)."""
    request = BatchRequest(index=index, line=line)
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as error:
        request.error = BatchError(
            "invalid_json", f"line {line}: not valid UTF-8 ({error.reason})", http=False
        )
        return request
    deep = too_deep(text)
    if deep is not None:
        request.error = BatchError("invalid_json", f"line {line}: {deep}", http=False)
        return request
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as error:
        request.error = BatchError("invalid_json", f"line {line}: not valid JSON ({error})", http=False)
        return request
    if not isinstance(record, dict):
        request.error = _bad_envelope(line, f"a request must be a JSON object, not {_json_type(record)}")
        return request
    request.custom_id = record.get("custom_id")
    problem = _envelope_problem(record)
    if problem is not None:
        request.error = _bad_envelope(line, problem)
        return request
    url, body = record["url"], record["body"]
    try:
        if url in SCORE_URLS:
            request.endpoint = "score"
            _parse_score(request, body)
        elif url in RERANK_URLS:
            request.endpoint = "rerank"
            _parse_rerank(request, body)
        else:
            supported = ", ".join((*SCORE_URLS, *RERANK_URLS))
            raise _BodyError(f"url {url!r} is not supported (supported: {supported})", "unsupported_url")
    except _BodyError as error:
        request.error = BatchError(error.code, f"line {line}: {error}")
        request.queries, request.items = [], []
    return request


def _bad_envelope(line: int, problem: str) -> BatchError:
    return BatchError("invalid_request", f"line {line}: {problem}", http=False)


def _envelope_problem(record: dict) -> str | None:
    """What is wrong with a request's custom_id, method, url or body (None: a well-formed request)."""
    for key in ENVELOPE:
        if key not in record:
            return f"the request has no {key!r}"
    if not isinstance(record["custom_id"], str):
        return f"custom_id must be a string, not {_json_type(record['custom_id'])}"
    method = record.get("method", "POST")
    if not isinstance(method, str) or method.upper() != "POST":
        return f"method must be 'POST', not {method!r}"
    if not isinstance(record["url"], str):
        return f"url must be a string, not {_json_type(record['url'])}"
    if not isinstance(record["body"], dict):
        return f"body must be a JSON object, not {_json_type(record['body'])}"
    return None


class _BodyError(Exception):
    """A bad request body: becomes an error line with status 400."""

    def __init__(self, message: str, code: str = "invalid_body") -> None:
        super().__init__(message)
        self.code = code


def _switch(body: dict, name: str) -> bool | None:
    """body.NAME as true or false (None: absent or null); any other value is refused."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise _BodyError(f"body.{name} must be true or false, not {_json_type(value)}")
    return value


def _parse_switches(request: BatchRequest, body: dict) -> None:
    """The per-request settings both endpoints share: activation and truncation (vLLM's and TEI's names)."""
    for name, why in UNSUPPORTED_FIELDS.items():
        if body.get(name) is not None:
            raise _BodyError(f"body.{name} is not supported: {why}", "unsupported_parameter")
    switches = {name: _switch(body, name) for name in (*ACTIVATION_FIELDS, "raw_scores")}
    given = [(name, switches[name]) for name in ACTIVATION_FIELDS if switches[name] is not None]
    use_activation = given[0][1] if given else None
    raw_scores = switches["raw_scores"]
    if raw_scores is not None:  # TEI: raw_scores true is use_activation false
        if use_activation is not None and use_activation == raw_scores:
            raise _BodyError(
                f"body.raw_scores {json.dumps(raw_scores)} contradicts body.{given[0][0]} "
                f"{json.dumps(use_activation)}"
            )
        use_activation = not raw_scores
    request.use_activation = use_activation
    truncate = body.get("truncate_prompt_tokens")
    if truncate is not None:
        if not isinstance(truncate, int) or isinstance(truncate, bool) or truncate < -1 or truncate == 0:
            raise _BodyError(
                "body.truncate_prompt_tokens must be a positive integer (tokens kept) or -1 (the model's "
                f"limit), not {truncate!r}"
            )
        request.truncate_prompt_tokens = None if truncate == -1 else truncate
    _parse_truncation(request, body)


def _parse_truncation(request: BatchRequest, body: dict) -> None:
    """vLLM's truncation_side, max_tokens_per_query and max_tokens_per_doc; TEI's truncate and
    truncation_direction (docs/openai-batch.md, Truncation). null is the default, as an absent field."""
    side = body.get("truncation_side")
    if side is not None:
        if side not in ("left", "right"):
            raise _BodyError(f"body.truncation_side must be 'left' or 'right', not {side!r}")
        request.truncation_side = side
    for name in ("max_tokens_per_query", "max_tokens_per_doc"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _BodyError(
                f"body.{name} must be a non-negative integer (0: no cut), not {json.dumps(value)}",
            )
        setattr(request, name, value)
    request.truncate = bool(_switch(body, "truncate"))
    direction = body.get("truncation_direction")
    if direction is not None:
        if direction not in TEI_DIRECTIONS:
            raise _BodyError(
                f"body.truncation_direction must be 'Right' or 'Left' (or 'right', 'left'), not {direction!r}",
            )
        request.truncation_direction = direction.lower()
    if request.truncate and request.truncate_prompt_tokens is not None:
        raise _BodyError(
            "body.truncate (TEI's cut to the model's limit) together with body.truncate_prompt_tokens (vLLM's "
            "cut to N tokens) is not supported: give one",
            "unsupported_parameter",
        )


def _parse_score(request: BatchRequest, body: dict) -> None:
    """text_1 (one or N) against text_2 (N): 1:1, 1:N or N:N pairs, as vLLM's score endpoint."""
    _parse_switches(request, body)
    present = [pair for pair in SCORE_FIELDS if pair[0] in body and pair[1] in body]
    if not present:
        partial = [name for pair in SCORE_FIELDS for name in pair if name in body]
        if partial:
            first = next(pair for pair in SCORE_FIELDS if partial[0] in pair)
            missing = first[1] if first[0] in body else first[0]
            raise _BodyError(f"body has {partial[0]!r} but no {missing!r}")
        raise _BodyError("body needs text_1 and text_2 (or queries and documents)")
    first_field, second_field = present[0]
    firsts = _texts(body[first_field], first_field)
    seconds = _texts(body[second_field], second_field)
    for name, texts in ((first_field, firsts), (second_field, seconds)):
        if not texts:
            raise _BodyError(f"body.{name} is empty: give at least one text")
    if len(firsts) > 1 and len(firsts) != len(seconds):
        raise _BodyError(
            f"body.{first_field} has {len(firsts)} texts and body.{second_field} {len(seconds)}: "
            "lengths must be 1:1, 1:N or N:N"
        )
    request.item_field = second_field
    request.items, request.queries = seconds, firsts * len(seconds) if len(firsts) == 1 else firsts


def _parse_rerank(request: BatchRequest, body: dict) -> None:
    """One query against its documents; results sorted best first, top_n kept (TEI's texts/return_text too)."""
    _parse_switches(request, body)
    documents_field = "texts" if "texts" in body and "documents" not in body else "documents"
    for name in ("query", documents_field):
        if name not in body:
            raise _BodyError(f"body has no {name!r}")
    query = body["query"]
    if not isinstance(query, str):
        raise _BodyError(f"body.query must be a string, not {_json_type(query)}")
    documents = _texts(body[documents_field], documents_field)
    if not documents:
        raise _BodyError(f"body.{documents_field} is empty: give at least one document")
    top_n = 0 if body.get("top_n") is None else body["top_n"]
    if not isinstance(top_n, int) or isinstance(top_n, bool):
        raise _BodyError(f"body.top_n must be an integer, not {_json_type(top_n)}")
    return_documents = True
    for name in ("return_text", "return_documents"):  # TEI's name, then vLLM/Cohere's (it wins)
        value = _switch(body, name)
        if value is not None:
            return_documents = value
    request.item_field = documents_field
    request.queries, request.items = [query] * len(documents), documents
    request.top_n = max(top_n, 0)
    request.return_documents = return_documents


def _texts(value: Any, name: str) -> list[str]:
    """A string or a list of strings as a list; anything else (multimodal parts, token ids) is refused."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        for position, text in enumerate(value):
            if not isinstance(text, str):
                raise _BodyError(
                    f"body.{name}[{position}] must be a string, not {_json_type(text)} "
                    "(multimodal and token-id inputs are not supported)"
                )
        return list(value)
    raise _BodyError(f"body.{name} must be a string or a list of strings, not {_json_type(value)}")


def _json_type(value: Any) -> str:
    """The JSON type name of a parsed value, for messages."""
    return _JSON_TYPES[value_kind(value)]


# Responses ----------------------------------------------------------------------------------------


def response_line(
    request: BatchRequest,
    scores: list[float] | None,
    failures: list,
    prompt_tokens: int,
    model: str,
    created: int,
) -> tuple[str, BatchError | None]:
    """A request's output line and its error (None when it succeeded): an error line when it has one or an item
    failed (failures: per item its error or None), else vLLM's ScoreResponse (one entry per item, in request
    order) or RerankResponse (sorted by relevance, ties in document order, top_n kept); scores None (a dry
    run): no line."""
    failed = [p for p, e in enumerate(failures) if e is not None]
    error = request.error
    if error is None and failed:
        error = BatchError(
            "invalid_input",
            f"line {request.line}: {len(failed)} of {len(failures)} inputs could not be scored; "
            f"{request.item_field}[{failed[0]}]: {failures[failed[0]]}",
        )
    if error is not None:
        return _line(request, 400 if error.http else None, None, error), error
    if scores is None:
        return "", None
    if request.endpoint == "rerank":
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep document order
        texts = request.items if request.return_documents else [None] * len(scores)
        body = {
            "id": f"rerank-{request.index}",
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            "results": [
                {"index": i, "document": {"text": texts[i]}, "relevance_score": _finite(scores[i])}
                for i in order[: request.top_n or None]
            ],
        }
    else:
        body = {
            "id": f"score-{request.index}",
            "object": "list",
            "created": created,
            "model": model,
            "data": [{"index": i, "object": "score", "score": _finite(s)} for i, s in enumerate(scores)],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            },
        }
    return _line(request, 200, body, None), None


def _line(request: BatchRequest, status: int | None, body: dict | None, error: BatchError | None) -> str:
    """One output line (status None: no response, the line was not a request); ids from the request's position."""
    response = None
    if status is not None:
        response = {"status_code": status, "request_id": f"score-batch-req-{request.index}", "body": body}
    record = {"id": f"score-batch-{request.index}", "custom_id": request.custom_id, "response": response}
    error = None if error is None else {"code": error.code, "message": error.message}
    return json.dumps({**record, "error": error}, ensure_ascii=False) + "\n"


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
