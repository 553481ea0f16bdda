"""A model directory read the way sentence-transformers 6.2's CrossEncoder reads it (no torch, no weights).

CrossEncoder takes its modules from modules.json when config_sentence_transformers.json says
`"model_type": "CrossEncoder"`; otherwise a `*ForCausalLM` becomes `Transformer(text-generation)` +
`LogitScore(true="yes", false="no")`, anything else a `Transformer(sequence-classification)`.
`read_cross_encoder` says what CrossEncoder would build (CrossEncoderSpec); `pair_tokens` encodes (query,
document) pairs to the exact token ids CrossEncoder's batch would feed its model:

- the maximum length: the constructor's `max_length` (or `model_max_length` in the saved Transformer
  config), else the tokenizer's `model_max_length` capped at `max_position_embeddings`;
- the text: with a `message` modality (a saved modality_config, or the tokenizer's chat template), the
  messages `[{"role": "query", …}, {"role": "document", …}]` rendered by the chat template, cut from the
  right at the maximum length with the template's suffix written back over the last tokens; otherwise the
  tokenizer's own pair encoding, `tokenizer([(query, document), …], truncation="longest_first")`;
- the score: a LogitScore's `logit[true] - logit[false]` at the last token (`logit[true]` without a
  false token); a classifier's logits;
- the activation: engine/activation.py's model_activation_fn, else Sigmoid for one label, else Identity;
- the prompt: the constructor's `prompts` / `default_prompt_name` merged with the saved ones (ce_prompts),
  before the query's text, or first as a system message under a chat template.

What CrossEncoder would apply that score-batch does not (other modules, lower-casing, query expansion) is
named in CrossEncoderSpec.unsupported.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from score_batch.engine.activation import json_object, model_activation_fn
from score_batch.engine.errors import SettingError
from score_batch.engine.text.truncation import UNLIMITED

log = logging.getLogger(__name__)

TRANSFORMER = "Transformer"
LOGIT_SCORE = "LogitScore"
# The Transformer module's config file, and the legacy names CrossEncoder still tries in order.
TRANSFORMER_CONFIGS = tuple(
    f"sentence_{name}_config.json"
    for name in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
)
# sentence_transformers.base.modality: model types whose chat templates take flat message content,
# the pair roles and the probes that check that a chat template renders both roles.
FLAT_MESSAGE_MODEL_TYPES = ("apertus", "deepseek_v3", "gpt_oss", "seed_oss")
STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
PAIR_ROLES = ("query", "document")
PAIR_ROLE_PROBES = (("alpha", "bravo"), ("charlie", "bravo"), ("alpha", "foxtrot"))
# Keys of apply_chat_template that size the tokenization (never template variables).
CHAT_SIZE_KEYS = ("padding", "truncation", "max_length", "return_tensors")


@dataclass(frozen=True)
class LogitScoreSpec:
    """A LogitScore module: the score is logit[true] - logit[false] at the last token (logit[true] alone)."""

    true_token_id: int
    false_token_id: int | None


@dataclass(frozen=True)
class ChatFormat:
    """Pairs rendered through the chat template as query/document messages."""

    message_format: Literal["flat", "structured"]
    template_kwargs: dict = field(default_factory=dict)  # processing_kwargs["chat_template"] (no size keys)
    restore_suffix: bool = True  # write the template's tail back over a truncated row's last tokens


@dataclass(frozen=True)
class CrossEncoderSpec:
    """What CrossEncoder 6.2 builds from a model directory (module doc)."""

    logit_score: LogitScoreSpec | None
    max_length: int | None  # the tokenizer's model_max_length as CrossEncoder sets it
    activation: tuple[str, str] | None  # the activation_fn the model's files name: (dotted path, where)
    chat: ChatFormat | None  # None: the tokenizer's pair encoding
    text_kwargs: dict = field(default_factory=dict)  # processing_kwargs "common" + "text" (truncation, …)
    default_prompt: str | None = None  # prepended to each query (CrossEncoder's default_prompt_name)
    prompts: dict = field(default_factory=dict)  # CrossEncoder's prompts: name → text (ce_prompts)
    default_prompt_name: str | None = None
    unsupported: tuple[str, ...] = ()  # what CrossEncoder would apply that score-batch does not
    refusal: str | None = None  # why CrossEncoder itself refuses the directory, or None


def read_cross_encoder(
    model_dir: str | Path,
    tokenizer,
    architecture: str,
    model_type: str,
    *,
    max_length: int | None = None,
    prompts: dict | None = None,
    default_prompt_name: str | None = None,
) -> CrossEncoderSpec:
    """Read a model directory as CrossEncoder(model_dir, max_length=…, prompts=…) would (tokenizer: read only)."""
    path = Path(model_dir)
    st_config = json_object(path / "config_sentence_transformers.json")
    modules = saved_modules(path)
    saved = modules is not None
    unsupported: list[str] = []
    if saved:
        transformer_config, logit_score, refusal = _saved_modules(path, modules, unsupported)
        causal = transformer_config.get("transformer_task") == "text-generation" or logit_score is not None
    else:
        transformer_config, logit_score, refusal = {}, None, None
        causal = architecture.endswith("ForCausalLM")
        if causal:
            logit_score, refusal = _default_logit_score(tokenizer)
    if causal and logit_score is None and refusal is None:
        refusal = "modules.json has a text-generation Transformer without a LogitScore module"
    if transformer_config.get("do_lower_case"):
        unsupported.append("do_lower_case (the Transformer lower-cases its input)")
    if transformer_config.get("query_expansion"):
        unsupported.append("query_expansion")
    processing = transformer_config.get("processing_kwargs") or {}
    text_kwargs = {**(processing.get("common") or {}), **(processing.get("text") or {})}
    text_kwargs = {k: v for k, v in text_kwargs.items() if k not in ("return_tensors", "padding")}
    # (this order: which error wins)
    chat = _chat_format(tokenizer, model_type, transformer_config, processing)
    prompts, prompt_name = ce_prompts(st_config if saved else {}, prompts, default_prompt_name)
    return CrossEncoderSpec(
        logit_score=logit_score,
        max_length=ce_max_length(tokenizer, path, _given_max_length(transformer_config, max_length)),
        activation=model_activation_fn(path, saved=saved),
        chat=chat,
        text_kwargs=text_kwargs,
        default_prompt=(prompts[prompt_name] or None) if prompt_name else None,
        prompts=prompts,
        default_prompt_name=prompt_name,
        unsupported=tuple(unsupported),
        refusal=refusal,
    )


def saved_modules(model_dir: str | Path) -> list | None:
    """A saved CrossEncoder's modules.json (config_sentence_transformers.json says model_type CrossEncoder),
    or None: only then does CrossEncoder 6.2 read its modules and its config_sentence_transformers.json."""
    path = Path(model_dir)
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    st_config = json_object(path / "config_sentence_transformers.json")
    if not isinstance(modules, list) or st_config.get("model_type", "SentenceTransformer") != "CrossEncoder":
        return None
    return modules


def saved_max_length(model_dir: str | Path) -> int | None:
    """The maximum length a saved CrossEncoder's Transformer config gives its tokenizer (processor kwargs'
    model_max_length, a legacy max_seq_length), read without the tokenizer; None where it gives none."""
    modules = saved_modules(model_dir)
    if modules is None:
        return None
    value = _given_max_length(_saved_modules(Path(model_dir), modules, [])[0], None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _given_max_length(transformer_config: dict, max_length: int | None):
    """The model_max_length CrossEncoder gives its tokenizer: max_length, else the saved processor kwargs'."""
    if max_length is not None:
        return max_length
    saved = transformer_config.get("processor_kwargs") or transformer_config.get("tokenizer_args") or {}
    return saved.get("model_max_length", transformer_config.get("max_seq_length"))


def _saved_modules(
    path: Path, modules: list, unsupported: list[str]
) -> tuple[dict, LogitScoreSpec | None, str | None]:
    """A saved CrossEncoder's modules.json: its Transformer's config, its LogitScore (or why it has none);
    the modules score-batch does not apply go into unsupported."""
    transformer_config: dict = {}
    logit_score = refusal = None
    types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)]
    for module, name in zip(modules, types):
        if name == TRANSFORMER:  # its config file, or the first legacy name CrossEncoder still tries
            module_dir = path / str(module.get("path", ""))
            configs = (json_object(module_dir / file) for file in TRANSFORMER_CONFIGS)
            transformer_config = next((config for config in configs if config), {})
        elif name == LOGIT_SCORE:
            settings = json_object(path / str(module.get("path", "")) / "config.json")
            true_id, false_id = settings.get("true_token_id"), settings.get("false_token_id")
            if isinstance(true_id, int):
                logit_score = LogitScoreSpec(true_id, None if false_id is None else int(false_id))
            else:
                refusal = f"its LogitScore module ({module.get('path')}/config.json) has no true_token_id"
        else:
            unsupported.append(f"a {name or '?'} module (modules.json)")
    if TRANSFORMER not in types:
        unsupported.append("no Transformer module first in modules.json")
    return transformer_config, logit_score, refusal


def _default_logit_score(tokenizer) -> tuple[LogitScoreSpec | None, str | None]:
    """CrossEncoder's default LogitScore of a CausalLM without modules.json ("yes" and "no"), or why not."""
    true_id, false_id = _token_id(tokenizer, "yes"), _token_id(tokenizer, "no")
    if true_id is None or false_id is None:
        return None, (
            "its tokenizer has no 'yes' and/or 'no' tokens, which CrossEncoder's default LogitScore module "
            "scores with"
        )
    return LogitScoreSpec(true_id, false_id), None


def ce_prompts(
    saved_config: dict, given: dict | None, default_name: str | None
) -> tuple[dict[str, str], str | None]:
    """CrossEncoder's prompts and default prompt name: the given ones first, the saved ones for what they
    leave. A saved prompt fills a name not given (or given as None); a name still None is ""; the default name
    must be one of the prompts' names (CrossEncoder raises ValueError otherwise)."""
    merged = dict(given or {})
    saved_prompts = saved_config.get("prompts")
    for name, text in (saved_prompts if isinstance(saved_prompts, dict) else {}).items():
        if merged.get(name) is None:
            merged[name] = text
    merged = {name: "" if text is None else str(text) for name, text in merged.items()}
    if default_name is None:
        default_name = saved_config.get("default_prompt_name")
    if default_name is not None and default_name not in merged:
        raise SettingError(
            "default_prompt_name", default_name, f"is not one of the prompts' names {sorted(merged)}"
        )
    return merged, default_name


def ce_max_length(tokenizer, model_dir: Path, given: int | None) -> int | None:
    """The tokenizer's model_max_length as CrossEncoder leaves it: `given` as is, else capped at the positions."""
    if given is not None:
        return int(given)
    limit = getattr(tokenizer, "model_max_length", None)
    positions = json_object(Path(model_dir) / "config.json").get("max_position_embeddings")
    if isinstance(positions, int) and positions != -1:
        limit = positions if limit is None else min(limit, positions)
    return None if limit is None or limit >= UNLIMITED else int(limit)


def pair_tokens(
    spec: CrossEncoderSpec, tokenizer, pairs: Sequence[tuple[str, str]], truncate: bool
) -> list[list[int]]:
    """The token ids CrossEncoder feeds its model for each (query, document) pair (module doc); truncate=False
    encodes without truncation (the caller checks the lengths against spec.max_length)."""
    if not pairs:
        return []
    prompt = spec.default_prompt or ""
    truncation = "longest_first" if truncate else False
    if spec.chat is None:
        given = spec.text_kwargs.get("truncation", truncation)
        kwargs = {**spec.text_kwargs, "truncation": given if truncate else False}
        # The prompt goes before the query.
        encoding = tokenizer([[prompt + query, document] for query, document in pairs], **kwargs)
        return [list(ids) for ids in encoding["input_ids"]]
    conversations = [chat_conversation(pair, spec.chat.message_format, prompt) for pair in pairs]
    text_kwargs = dict(spec.text_kwargs)
    top_level = {key: text_kwargs.pop(key) for key in CHAT_SIZE_KEYS if key in text_kwargs}
    top_level["truncation"] = top_level.get("truncation", truncation) if truncate else False
    rows = _chat_ids(tokenizer, conversations, spec.chat.template_kwargs, text_kwargs, **top_level)
    limit = top_level.get("max_length") or getattr(tokenizer, "model_max_length", None)
    if truncate and spec.chat.restore_suffix and top_level["truncation"] not in (False, "do_not_truncate"):
        for row, conversation in zip(rows, conversations):
            if limit is not None and len(row) >= limit:
                suffix = chat_suffix(tokenizer, conversation, spec.chat.template_kwargs, text_kwargs)
                keep = min(len(suffix), len(row))
                if keep:
                    row[len(row) - keep :] = suffix[len(suffix) - keep :]
    return rows


def _chat_ids(tokenizer, conversations: list, template_kwargs: dict, text_kwargs: dict, **size) -> list:
    """Conversations rendered by the chat template and tokenized as CrossEncoder's Transformer does (size:
    padding, truncation, max_length as its processing kwargs give them): a list of token ids each."""
    encoding = tokenizer.apply_chat_template(
        conversations, tokenize=True, return_dict=True, tokenizer_kwargs=text_kwargs, common_kwargs={},
        **size, **template_kwargs,
    )  # fmt: skip
    return [list(ids) for ids in encoding["input_ids"]]


def pair_messages(pair: tuple[str, str], message_format: str) -> list[dict]:
    """A (query, document) pair as CrossEncoder's query/document messages."""
    structured = message_format != "flat"
    return [{"role": role, "content": _content(text, structured)} for role, text in zip(PAIR_ROLES, pair)]


def chat_conversation(pair: tuple[str, str], message_format: str, prompt: str | None) -> list[dict]:
    """A pair's messages as CrossEncoder renders them: a prompt first as a system message, then the pair's."""
    messages = pair_messages(pair, message_format)
    if not prompt:
        return messages
    return [{"role": "system", "content": _content(prompt, message_format != "flat")}, *messages]


def _content(text: str, structured: bool) -> str | list[dict]:
    """A message's content: the text itself (flat), or one text part (structured)."""
    return [{"type": "text", "text": text}] if structured else text


def chat_suffix(tokenizer, conversation: list[dict], template_kwargs: dict, text_kwargs: dict) -> list[int]:
    """The chat template's tail after the content: the common token suffix of two renders with fillers."""
    renders = []
    for filler in ("0", "1 2 3 4"):
        skeleton = [
            message
            if message.get("role") == "system"
            else {**message, "content": _content(filler, isinstance(message.get("content"), list))}
            for message in conversation
        ]
        unsized = {"padding": False, "truncation": False}
        renders += _chat_ids(tokenizer, [skeleton], template_kwargs, text_kwargs, **unsized)
    first, second = renders
    count = len(os.path.commonprefix([first[::-1], second[::-1]]))  # their common suffix's length
    return first[len(first) - count :] if 0 < count < min(len(first), len(second)) else []


def pair_roles_failure(tokenizer, message_format: str, template_kwargs: dict) -> str | None:
    """Why the chat template cannot carry a query/document pair (CrossEncoder then refuses), or None."""
    if getattr(tokenizer, "chat_template", None) is None:
        return "the model has no chat template"
    try:
        base, *varied = [
            str(
                tokenizer.apply_chat_template(
                    pair_messages(pair, message_format), tokenize=False, **template_kwargs
                )
            )
            for pair in PAIR_ROLE_PROBES
        ]
    except Exception as error:  # any template error: CrossEncoder reports it the same way
        return f"it raised {type(error).__name__}: {error}"
    dropped = [role for role, render in zip(PAIR_ROLES, varied) if render == base]
    if dropped:
        return f"the {' and '.join(repr(r) for r in dropped)} content does not reach the rendered prompt"
    return None


def _chat_format(tokenizer, model_type: str, transformer_config: dict, processing: dict) -> ChatFormat | None:
    """The chat rendering CrossEncoder's Transformer uses for text pairs, or None (pair encoding)."""
    template = getattr(tokenizer, "chat_template", None)
    modality = transformer_config.get("modality_config")
    if isinstance(modality, dict):
        message = modality.get("message")
        if not isinstance(message, dict):
            return None
        requested = message.get("format", "auto")
    elif template is None:  # inferred as CrossEncoder does for a directory without a saved modality_config
        return None
    else:
        requested = "auto"
    if requested in ("flat", "structured"):
        message_format = requested
    elif model_type in FLAT_MESSAGE_MODEL_TYPES:
        message_format = "flat"
    elif not isinstance(template, str) or not template:
        message_format = "structured"
    else:
        message_format = "structured" if any(p in template for p in STRUCTURED_PATTERNS) else "flat"
    kwargs = dict(processing.get("chat_template") or {})
    restore = bool(kwargs.pop("restore_suffix", True))
    for key in CHAT_SIZE_KEYS:
        kwargs.pop(key, None)
    return ChatFormat(message_format, kwargs, restore)


def _token_id(tokenizer, token: str) -> int | None:
    """tokenizer.convert_tokens_to_ids(token), as CrossEncoder looks its yes/no tokens up."""
    try:
        value = tokenizer.convert_tokens_to_ids(token)
    except (KeyError, ValueError, TypeError):
        return None
    return value if isinstance(value, int) else None
