"""Which text a run scores, resolved once for the command line, Scorer and its CrossEncoder face.

The order (docs/semantics.md, "Which text is scored"), first that applies:

1. templates given: ScoringConfig.query_template / item_template (flags or keywords over a profile's), or
   item_first — used as given, nothing of the model's is added;
2. the model's own CrossEncoder text, as sentence-transformers' CrossEncoder renders it: the tokenizer's chat
   template (query/document messages; a saved modality_config decides whether it applies), rendered once with
   stand-in texts and split into a query and an item template (the default prompt, if any, as its system
   message); else the default prompt (prompts / default_prompt_name, saved or given) before each query;
3. query + item as given.

The templates of 2 are checked on probe pairs against CrossEncoder's own token sequences (st_model.pair_tokens):
`exact` says whether every probe gave the same tokens (the seam between the two templates is chosen so).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from score_batch.engine.activation import json_object
from score_batch.engine.config import EngineConfig, ScoringConfig
from score_batch.engine.model.st_model import (
    CrossEncoderSpec,
    chat_conversation,
    pair_roles_failure,
    pair_tokens,
    read_cross_encoder,
    saved_max_length,
)
from score_batch.engine.text.encode import encode_texts

if TYPE_CHECKING:
    from score_batch.engine.model.loading import ModelInfo

log = logging.getLogger(__name__)

# (the command line spells the settings as its flags: cli/score.py)
OVERRIDE = "ScoringConfig.query_template and ScoringConfig.item_template override"
# Stand-in contents that locate the query and the document in a rendered chat template (two pairs: the
# template must render both the same way around them).
STAND_INS = (("sbqueryalpha", "sbdocumentalpha"), ("sbquerybravo", "sbdocumentbravo"))
# Probe contents for the seam check: words, spaces and newlines at either end, punctuation, digits, empty.
PROBE_QUERIES = (
    "alpha",
    "What is the capital of California?",
    " leading space",
    "trailing space ",
    "a\n",
    "42",
)
PROBE_ITEMS = ("bravo", " Sacramento", "San Jose is a city.", "", "line\n", "7 items", "\nnext")
MAX_SEAMS = 96  # split points of the text between query and document tried at most
CE_CONFIG = "config_sentence_transformers.json"


# given: the caller's templates; item-first: the caller's order; chat, prompt: the model's CrossEncoder text
Source = Literal["given", "item-first", "chat", "prompt", "plain"]


@dataclass(frozen=True)
class ScoredText:
    """The templates a run wraps queries and items in, and where they came from."""

    query_template: str | None
    item_template: str | None
    source: Source = "plain"
    # The templated tokens equal CrossEncoder's own token sequences on every probe pair (None: not checked)
    exact: bool | None = None
    mismatch: str | None = None  # the first probe pair whose tokens differ, in words

    @property
    def native(self) -> bool:
        """The model's own CrossEncoder text (its chat template or default prompt), not the caller's."""
        return self.source in ("chat", "prompt")

    def describe(self) -> str:
        """The run's log line: which text is scored."""
        shown = f"query template {self.query_template!r}, item template {self.item_template!r}"
        if self.source == "chat":
            return f"scoring with the tokenizer's chat template ({shown}); {OVERRIDE}"
        if self.source == "prompt":
            return f"scoring with the model's default prompt before each query ({shown}); {OVERRIDE}"
        if self.source == "given":
            return f"scoring with the templates given ({shown})"
        if self.source == "item-first":
            return f"scoring item + query (item_first; {shown})"
        return f"scoring query + item as given (no template); {OVERRIDE}"


def resolve_text(
    cfg: ScoringConfig, spec: CrossEncoderSpec | None, tokenizer, encoder: bool = False
) -> ScoredText:
    """The text a run scores (module doc's order) for a scoring config, the model read as CrossEncoder reads
    it (spec; None: nothing of the model's applies) and its tokenizer."""
    if cfg.query_template is not None or cfg.item_template is not None:
        return ScoredText(cfg.query_template, cfg.item_template, "given")
    if cfg.item_first:
        return ScoredText(None, None, "item-first")
    if spec is None:
        return ScoredText(None, None, "plain")
    return native_text(spec, tokenizer, encoder)


def native_text(spec: CrossEncoderSpec, tokenizer, encoder: bool = False) -> ScoredText:
    """The model's own CrossEncoder text as templates: its chat template (spec.default_prompt as the system
    message), else its default prompt before the query, else query + item; checked against pair_tokens."""
    if spec.chat is not None and not encoder:
        failure = pair_roles_failure(tokenizer, spec.chat.message_format, spec.chat.template_kwargs)
        parts = None if failure else _chat_parts(tokenizer, spec)
        if parts is not None:
            return _split_chat(spec, tokenizer, *parts)
        # a chat model's template (no query/document roles: CrossEncoder refuses it) is said, not warned of;
        # a reranker template that cannot be split is warned of
        level = logging.INFO if failure else logging.WARNING
        why = failure or "it does not render each text once, the query before the document"
        log.log(
            level,
            "the tokenizer's chat template is not applied to packed groups (the command line, Scorer.score): "
            "%s; they score query + item",
            why,
        )
    if spec.default_prompt:
        text = ScoredText(spec.default_prompt + "{query}", None, "prompt")
    else:
        text = ScoredText(None, None, "plain")
    if encoder:  # the pair runner encodes pairs as CrossEncoder does
        return text
    return _checked(text, spec, tokenizer)


def scored_config(cfg: ScoringConfig, text: ScoredText) -> ScoringConfig:
    """The scoring config with the resolved templates in it."""
    return replace(cfg, query_template=text.query_template, item_template=text.item_template)


def resolve_scored_text(
    config: EngineConfig, info: ModelInfo, tokenizer, spec: CrossEncoderSpec | None = None
) -> tuple[EngineConfig, ScoredText]:
    """The config with the text it scores resolved into its templates (scored_text's order), and that text;
    spec: the directory read as CrossEncoder reads it (read here when not given; the maximum length a saved
    CrossEncoder config gives is then set on the tokenizer, as CrossEncoder's holds it). A directory
    without a chat template or a sentence-transformers config is not read (its text is query + item)."""
    cfg = config.scoring
    given = cfg.query_template is not None or cfg.item_template is not None or cfg.item_first
    if spec is None:
        if (length := saved_max_length(info.path)) is not None:
            tokenizer.model_max_length = length  # as CrossEncoder's tokenizer holds it (Scorer: ce_spec)
        if not given and has_crossencoder_text(Path(info.path)):
            spec = read_cross_encoder(info.path, tokenizer, info.architecture, info.model_type)
    text = resolve_text(cfg, spec, tokenizer, info.encoder)
    return replace(config, scoring=scored_config(config.scoring, text)), text


def has_crossencoder_text(model_dir: Path) -> bool:
    """Whether a model directory may hold text of its own for CrossEncoder: a chat template (a file, or in
    tokenizer_config.json) or a sentence-transformers config (prompts, a modality)."""
    files = ("chat_template.jinja", "chat_template.json", CE_CONFIG, "modules.json")
    if (
        any((model_dir / name).is_file() for name in files)
        or (model_dir / "additional_chat_templates").is_dir()
    ):
        return True
    return "chat_template" in json_object(model_dir / "tokenizer_config.json")


def log_scored_text(text: ScoredText) -> None:
    """The run's line naming the text it scores, and a warning where CrossEncoder's own tokens differ."""
    log.info("%s", text.describe())
    if text.exact is False and text.native:
        log.warning(
            "the model's CrossEncoder text applied as templates does not tokenize as CrossEncoder does (%s): "
            "scores here can differ from CrossEncoder.predict's and Scorer.predict's; give the templates "
            "(ScoringConfig.query_template and ScoringConfig.item_template) to choose the text",
            text.mismatch,
        )
    elif text.exact is False and text.source == "plain":
        log.warning(
            "the tokenizer's pair encoding is not query + item (%s): Scorer.predict and CrossEncoder score "
            "the pair encoding, packed groups (the command line, Scorer.score) query + item",
            text.mismatch,
        )


def _chat_parts(tokenizer, spec: CrossEncoderSpec) -> tuple[str, str, str] | None:
    """The chat template's render as (head, middle, tail) around the query and the document, the same for
    both stand-in pairs; None when it does not render each once, query first."""
    found = set()
    for query, document in STAND_INS:
        conversation = chat_conversation((query, document), spec.chat.message_format, spec.default_prompt)
        text = str(tokenizer.apply_chat_template(conversation, tokenize=False, **spec.chat.template_kwargs))
        if text.count(query) != 1 or text.count(document) != 1 or text.index(query) > text.index(document):
            return None
        head, rest = text.split(query)
        middle, tail = rest.split(document)
        found.add((head, middle, tail))
    return found.pop() if len(found) == 1 else None


def _split_chat(spec: CrossEncoderSpec, tokenizer, head: str, middle: str, tail: str) -> ScoredText:
    """The chat render split into a query template (head + query + the middle's start) and an item template
    (the middle's rest + item + tail) at the first seam whose tokens equal CrossEncoder's on every probe."""
    heads = [head]
    bos = getattr(tokenizer, "bos_token", None)
    if bos and head.startswith(bos):  # the tokenizer adds its BOS to the query itself
        heads.insert(0, head[len(bos) :])
    reference = pair_tokens(spec, tokenizer, list(product(PROBE_QUERIES, PROBE_ITEMS)), truncate=False)
    first = None
    for start, seam in product(heads, _seams(middle, tokenizer)):
        text = ScoredText(start + "{query}" + middle[:seam], middle[seam:] + "{item}" + tail, "chat")
        checked = _checked(text, spec, tokenizer, reference)
        if checked.exact:
            return checked
        first = first or checked
    return first


def _seams(middle: str, tokenizer) -> list[int]:
    """Split points of the text between query and document, likeliest token boundaries first: after each
    newline or special token (the last first), then its end and its start, then every other."""
    specials = [s for s in getattr(tokenizer, "all_special_tokens", []) or [] if s]
    ends = {i + 1 for i, c in enumerate(middle) if c == "\n"}
    for special in specials:
        at = middle.find(special)
        while at >= 0:
            ends.add(at + len(special))
            at = middle.find(special, at + 1)
    order = sorted(ends, reverse=True) + [len(middle), 0]
    order += [i for i in range(len(middle) - 1, 0, -1) if i not in ends]
    return list(dict.fromkeys(order))[:MAX_SEAMS]


def _checked(
    text: ScoredText, spec: CrossEncoderSpec, tokenizer, reference: list | None = None
) -> ScoredText:
    """text with `exact` set: whether query tokens (templated, with special tokens) + item tokens (templated,
    without) equal CrossEncoder's token sequence of every probe pair (st_model.pair_tokens)."""
    pairs = list(product(PROBE_QUERIES, PROBE_ITEMS))
    if reference is None:
        reference = pair_tokens(spec, tokenizer, pairs, truncate=False)
    queries = encode_texts(tokenizer, text.query_template, "{query}", list(PROBE_QUERIES), True).ids
    items = encode_texts(tokenizer, text.item_template, "{item}", list(PROBE_ITEMS), False).ids
    for index, ((query, item), expected) in enumerate(zip(pairs, reference)):
        got = queries[index // len(PROBE_ITEMS)] + items[index % len(PROBE_ITEMS)]
        if list(got) != list(expected):
            why = f"the pair ({query!r}, {item!r}) gives {len(got)} tokens here, {len(expected)} in CrossEncoder"
            if len(got) == len(expected):
                why = f"the pair ({query!r}, {item!r}) tokenizes differently here than in CrossEncoder"
            return replace(text, exact=False, mismatch=why)
    return replace(text, exact=True)
