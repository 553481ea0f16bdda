"""The CrossEncoder constructor arguments the Scorer takes (Scorer.__init__), and CrossEncoder 6.2's
predict/rank inputs checked and outputs shaped as there (pure)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import fields, replace

import numpy as np
import torch

from score_batch.engine.config import EngineConfig, ScoringConfig
from score_batch.engine.errors import ScoringInputError, SettingError
from score_batch.engine.model.loading import ModelInfo
from score_batch.engine.model.profiles import Profile
from score_batch.engine.model.scored_text import ScoredText, resolve_scored_text
from score_batch.engine.model.setup import label_free_scoring
from score_batch.engine.model.st_model import CrossEncoderSpec, read_cross_encoder
from score_batch.engine.types import Group

log = logging.getLogger(__name__)

Text = str | list[int]  # a query or an item: text, or token ids used as given

# torch.nn activations CrossEncoder may be given, as the `score` column's ScoringConfig.activation.
ACTIVATION_NAMES = {torch.nn.Sigmoid: "sigmoid", torch.nn.Identity: "none", torch.nn.Softmax: "softmax"}
# EngineConfig fields a keyword may set without giving an EngineConfig (which would drop CrossEncoder's defaults).
ENGINE_FIELDS = tuple(
    f.name for f in fields(EngineConfig) if f.name not in ("scoring", "device", "trust_remote_code")
)
_TOKENIZER = (
    "use Scorer(..., max_length=…) for the length and truncate=… (ScoringConfig.truncate) for the cut"
)
_CONFIG = "the model's config.json is used as saved (Scorer(..., score_index=…) picks the scored label)"
# CrossEncoder's constructor arguments (6.2's and older names) the Scorer does not take, and what to use.
REFUSED = {
    "num_labels": "the model's own head is scored (Scorer(..., score_index=…) picks the `score` label)",
    "config_kwargs": _CONFIG,
    "config_args": _CONFIG,
    "processor_kwargs": _TOKENIZER,
    "tokenizer_kwargs": _TOKENIZER,
    "tokenizer_args": _TOKENIZER,
    "modules": "give a model directory or a cached hub id as model_name_or_path",
    "model_name": "give the model as model_name_or_path",
    "token": "score-batch reads a directory or the local Hugging Face cache only (Scorer(..., cache_folder=…))",
    "automodel_args": "use Scorer(..., model_kwargs={'dtype': …}) or dtype=… (EngineConfig.dtype)",
    "keep_in_fp32_modules": "use Scorer(..., dtype='float32') (EngineConfig.dtype) for the whole model",
    "cache_dir": "use Scorer(..., cache_folder=…)",
    "default_activation_function": "use Scorer(..., activation_fn=…)",
    "model_card_data": "score-batch writes no model card",
    "classifier_dropout": "score-batch only scores: dropout is off",
}


def refuse_arguments(overrides: dict, model_kwargs: dict | None) -> int | None:
    """Refuse, in one line naming what to use instead, a CrossEncoder argument the Scorer does not take (its
    default value, which changes nothing, is taken); returns num_labels, checked against the head once loaded."""
    for name in [name for name, value in overrides.items() if name in REFUSED and _unset(value)]:
        del overrides[name]
    num_labels = overrides.pop("num_labels", None)
    if overrides.get("backend") == "torch":  # CrossEncoder's default: the model runs in torch here too
        del overrides["backend"]
    elif overrides.get("backend") in ("onnx", "openvino"):
        raise ScoringInputError(
            f"CrossEncoder's backend={overrides['backend']!r} is not taken: score-batch runs the model in torch "
            "(backend=… names the attention backend: auto, flashinfer, flex, split, sdpa)"
        )
    for name in overrides:
        if name in REFUSED:
            raise ScoringInputError(f"{name} is not taken: {REFUSED[name]}")
    given = model_kwargs or {}
    if "torch_dtype" in given and given.get("dtype", given["torch_dtype"]) != given["torch_dtype"]:
        raise ScoringInputError("model_kwargs' dtype and torch_dtype (its older name) differ: give one")
    for key in given:
        if key not in ("dtype", "torch_dtype"):
            raise ScoringInputError(
                f"model_kwargs[{key!r}] is not taken: only its dtype is (EngineConfig.dtype); score-batch loads "
                "and places the model itself (Scorer(..., backend=…, layers=…) choose how it runs)"
            )
    return num_labels


def check_num_labels(num_labels: int | None, info: ModelInfo) -> None:
    """CrossEncoder's num_labels is taken when it is the head's own, or for a CausalLM (one LogitScore score
    whatever it says, as CrossEncoder's); checked before any weights load."""
    if num_labels is not None and info.kind != "causal" and num_labels != info.num_labels:
        raise ScoringInputError(f"num_labels={num_labels} is not taken: {REFUSED['num_labels']}")


def _unset(value) -> bool:
    """CrossEncoder's default of an argument (None, False, an empty dict): nothing asked."""
    return value is None or value is False or (isinstance(value, dict) and not value)


def ce_engine_config(
    config: EngineConfig | None,
    overrides: dict,
    device,
    trust_remote_code: bool | None,
    model_kwargs: dict | None,
) -> EngineConfig:
    """The EngineConfig of the CrossEncoder arguments and of EngineConfig's fields among overrides (taken out)."""
    engine = {name: overrides.pop(name) for name in ENGINE_FIELDS if name in overrides}
    config = replace(config or EngineConfig(), **{k: v for k, v in engine.items() if v is not None})
    if device is not None:  # CrossEncoder-style: auto, cpu, cuda or cuda:0
        if str(device) not in ("auto", "cpu", "cuda", "cuda:0"):
            raise SettingError("EngineConfig.device", str(device), "is not one of auto, cpu, cuda")
        config = replace(config, device=str(device).removesuffix(":0"))
    if trust_remote_code is not None:
        config = replace(config, trust_remote_code=bool(trust_remote_code))
    if (dtype := (model_kwargs or {}).get("dtype", (model_kwargs or {}).get("torch_dtype"))) is not None:
        name = str(dtype).removeprefix("torch.")
        if name not in ("auto", "float32", "bfloat16", "float16"):
            raise SettingError("model_kwargs dtype", dtype, "is not one of float32, bfloat16, float16, auto")
        config = replace(config, dtype=name)
    return config


def ce_scoring(
    scoring: ScoringConfig, chosen: Profile | None, overrides: dict, ce_defaults: bool, info: ModelInfo, fn
) -> tuple[ScoringConfig, bool]:
    """The scoring CrossEncoder's defaults and activation_fn (fn) give; whether a CausalLM needs LogitScore."""
    given = {key for key, value in overrides.items() if value is not None}
    if ce_defaults and "truncate" not in set(chosen.settings if chosen else {}) | given:
        scoring = replace(scoring, truncate="longest-first")  # the Python API truncates as CrossEncoder
    logit_score = info.kind == "causal" and not (scoring.label_tokens or scoring.label_token_ids)
    fn_name = ACTIVATION_NAMES.get(type(fn))
    labels = 1 if logit_score else info.num_labels
    if fn_name and overrides.get("activation") is None and (info.kind == "classifier" or logit_score):
        if fn_name != "softmax" or labels > 1:  # the `score` column gets the given activation too
            scoring = replace(scoring, activation=fn_name)
    return scoring, logit_score


def ce_spec(
    config: EngineConfig,
    info: ModelInfo,
    tokenizer,
    logit_score: bool,
    ce_defaults: bool,
    *,
    warn: bool,
    **read,
) -> tuple[CrossEncoderSpec, EngineConfig, ScoredText]:
    """The directory read as CrossEncoder reads it (read: its keywords), and the config with its scored text."""
    spec = read_cross_encoder(info.path, tokenizer, info.architecture, info.model_type, **read)
    if spec.max_length is not None:
        tokenizer.model_max_length = spec.max_length  # as CrossEncoder's tokenizer holds it
    for unsupported in spec.unsupported if warn else ():
        log.warning(
            "the model's CrossEncoder configuration has %s, which score-batch does not apply; its scores can "
            "differ from CrossEncoder's",
            unsupported,
        )
    if logit_score and spec.logit_score is None:
        raise ScoringInputError(
            f"{info.architecture} needs label tokens to score: {spec.refusal} (CrossEncoder refuses it too); "
            "give label_tokens=(' no', ' yes') or a profile (score-batch models lists them)"
        )
    config, text = resolve_scored_text(config, info, tokenizer, spec)
    if logit_score and not ce_defaults:  # groups' text: checked as the command line's
        config = label_free_scoring(info, config, tokenizer)[0]
    return spec, config, text


def is_singular_input(inputs) -> bool:
    """CrossEncoder's test: one (query, item) pair rather than a list of pairs."""
    if isinstance(inputs, list | tuple):
        return len(inputs) > 0 and not isinstance(inputs[0], list | tuple)
    if isinstance(inputs, np.ndarray) and inputs.dtype.kind in ("U", "O"):
        return inputs.size > 0 and inputs.ndim < 2
    return not isinstance(inputs, Sequence | np.ndarray) or isinstance(inputs, str)


def prefix_groups(
    sequences: list[tuple[int, list[int]]],
) -> list[tuple[list[int], list[tuple[int, list[int]]]]]:
    """One query's token sequences as (shared query ids, [(position, item ids)]) groups by first token."""
    # The query is the sequences' longest common prefix, so query + item is each sequence exactly (an empty
    # item's score row is the query's last token); an empty sequence stays alone (it fails as an empty query).
    by_first: dict[int | None, list[tuple[int, list[int]]]] = {}
    for position, ids in sequences:
        by_first.setdefault(ids[0] if ids else None, []).append((position, ids))
    groups = []
    for part in by_first.values():
        common = len(os.path.commonprefix([ids for _, ids in part]))
        groups.append((part[0][1][:common], [(position, ids[common:]) for position, ids in part]))
    return groups


def ce_outputs(
    raw: np.ndarray,  # [n, labels] float32 raw outputs, NaN rows for failed pairs
    activation_fn: Callable,
    apply_softmax: bool,
    convert_to_numpy: bool,
    convert_to_tensor: bool,
    device: torch.device,
    singular: bool,
):
    """CrossEncoder.predict's post-processing and return types over raw outputs."""
    if raw.shape[0]:
        scores = activation_fn(torch.from_numpy(np.ascontiguousarray(raw)).to(device))  # [n, labels]
        if raw.shape[1] == 1 and scores.ndim > 1:
            scores = scores.squeeze(-1)  # [n]
        if apply_softmax and scores.ndim > 1:
            scores = torch.nn.functional.softmax(scores, dim=1)
    else:
        scores = torch.tensor([], device=device)
    if convert_to_tensor:
        out = scores
    elif convert_to_numpy:
        out = scores.float().cpu().numpy() if len(scores) else np.array([])
    else:
        out = list(scores)
    return out[0] if singular else out


def text_of(value, where: str) -> Text:
    """A query or item as the engine takes it: a str, or a list of int token ids."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple | np.ndarray) and all(
        isinstance(t, int | np.integer) and not isinstance(t, bool) for t in value
    ):
        return [int(t) for t in value]
    raise ScoringInputError(f"{where} must be a str or a list of int token ids, got {type(value).__name__}")


def pair_of(pair, index: int) -> tuple[Text, Text]:
    """One (query, item) of predict's input, checked."""
    if isinstance(pair, str | bytes) or not isinstance(pair, Sequence | np.ndarray) or len(pair) != 2:
        raise ScoringInputError(f"pairs[{index}] must be a (query, item) pair, got {pair!r:.80}")
    query, item = pair
    return text_of(query, f"pairs[{index}][0] (the query)"), text_of(item, f"pairs[{index}][1] (the item)")


def ranking_group(entry, index: int) -> Group:
    """One (query, documents) of rank_many's input as a Group, checked (a str of documents is a common slip)."""
    where = f"queries_and_documents[{index}]"
    if isinstance(entry, str | bytes) or not isinstance(entry, Sequence) or len(entry) != 2:
        raise ScoringInputError(f"{where} must be a (query, documents) pair, got {entry!r:.80}")
    query, documents = entry
    if isinstance(documents, str | bytes) or not isinstance(documents, Sequence | np.ndarray):
        raise ScoringInputError(
            f"{where}: documents must be a list of documents, got {type(documents).__name__}"
        )
    return Group(
        text_of(query, f"{where} query"),
        [text_of(doc, f"{where} documents[{i}]") for i, doc in enumerate(documents)],
    )


def ignore_kwargs(method: str, kwargs: dict) -> None:
    """CrossEncoder's deprecated no-op arguments are accepted; anything else is a TypeError, as there."""
    for name in ("num_workers", "convert_to_numpy", "convert_to_tensor", "apply_softmax"):
        kwargs.pop(name, None)
    if kwargs:
        raise TypeError(f"{method}() got unexpected keyword arguments {sorted(kwargs)}")


def whole(value, least: int) -> bool:
    """Whether value is an int (not a bool) of at least `least`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_batch_size(batch_size) -> None:
    """CrossEncoder refuses a batch_size below 1; ours plans by tokens and otherwise ignores it."""
    if not whole(batch_size, 1):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}.")


def warn_failed(errors: list[str | None]) -> None:
    """Log how many items could not be scored, and the first reason."""
    failed = [e for e in errors if e is not None]
    if failed:
        count = f"{len(failed)} of {len(errors)}"
        log.warning("%s items could not be scored (NaN / left out); first: %s", count, failed[0])


def label_logit(raw: np.ndarray, kind: str, score_index: int) -> np.ndarray:  # [n, labels] → [n] float32
    """A label scorer's logit as LogitScore defines it: logit[true] - logit[false], or logit[true] alone."""
    # From probabilities, their log ratio (a softmax over the labels or the vocabulary divides both by the
    # same sum); from logits, their difference; from sigmoids, their logits.
    values = raw.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "probability":
            logs = np.log(values)
        elif kind == "sigmoid":
            logs = np.log(values) - np.log1p(-values)
        else:
            logs = values
    labels = values.shape[1]
    if labels == 2:
        true = score_index % 2
        return (logs[:, true] - logs[:, 1 - true]).astype(np.float32)
    if labels == 1 and kind != "probability":
        return logs[:, 0].astype(np.float32)
    raise ScoringInputError(
        f"activation_fn applies to a CausalLM label scorer's log-odds, which needs two labels (or one label "
        f"scored as a logit); this model has {labels} label(s) scored as {kind}s: call predict without "
        "activation_fn for its score, or Scorer.score for every label's score"
    )
