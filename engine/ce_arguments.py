"""sentence-transformers' CrossEncoder constructor arguments as the Scorer's settings (Scorer.__init__), and
CrossEncoder 6.2's predict/rank inputs checked and outputs shaped as there (pure)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch

from score_batch.choices import BACKENDS
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
# CrossEncoder constructor arguments that change nothing here (score-batch reads local files only, runs torch,
# and has no model cards): accepted, logged when given.
_IGNORED = ("token", "local_files_only", "model_card_data", "keep_in_fp32_modules")
# EngineConfig fields a keyword may set without giving an EngineConfig (which would drop CrossEncoder's defaults).
_ENGINE_FIELDS = (
    "dtype",
    "max_batch_tokens",
    "max_pack_tokens",
    "allow_pickle",
    "compile",
    "layers",
    "ops",
    "verify",
)
# Older CrossEncoder names of its arguments, as its own decorator maps them.
_RENAMED = {
    "model_name": "model_name_or_path",
    "automodel_args": "model_kwargs",
    "tokenizer_args": "tokenizer_kwargs",
    "processor_kwargs": "tokenizer_kwargs",
    "config_args": "config_kwargs",
    "cache_dir": "cache_folder",
    "default_activation_function": "activation_fn",
}
# The constructor arguments ce_arguments takes and returns, in order.
_ARGUMENTS = ("model_kwargs", "tokenizer_kwargs", "config_kwargs", "cache_folder", "activation_fn")


def ce_arguments(overrides: dict, *values, num_labels: int | None = None, modules=None) -> tuple:
    """CrossEncoder's constructor arguments as `_ARGUMENTS` + num_labels: older names mapped, and no-ops taken
    out of overrides (the constructor's other keywords)."""
    if modules is not None:
        raise ScoringInputError(
            "modules= (a CrossEncoder built from module objects) is not supported: give a model directory"
        )
    named = dict(zip(_ARGUMENTS, values))
    for old, new in _RENAMED.items():
        if old in overrides:
            value = overrides.pop(old)
            if new == "tokenizer_kwargs":
                named[new] = {**(value or {}), **(named[new] or {})}
            elif new in named:
                named[new] = named[new] or value
    overrides.pop("classifier_dropout", None)  # training only
    ignored = {name: overrides.pop(name) for name in _IGNORED if name in overrides}
    given = {name: value for name, value in ignored.items() if value not in (None, False, {}, [])}
    if given:
        log.info("ignored CrossEncoder arguments (no effect in score-batch): %s", ", ".join(given))
    config_kwargs = named["config_kwargs"] = dict(named["config_kwargs"] or {})
    if config_kwargs.get("num_labels") is not None and num_labels is None:
        num_labels = config_kwargs.pop("num_labels")
    if config_kwargs:
        log.info(
            "config_kwargs ignored (the model's config.json is used as saved): %s", sorted(config_kwargs)
        )
    return (*named.values(), num_labels)


def ce_engine_config(
    config: EngineConfig | None,
    overrides: dict,
    device,
    trust_remote_code: bool | None,
    backend: str | None,
    model_kwargs: dict | None,
) -> EngineConfig:
    """The EngineConfig of CrossEncoder-style constructor arguments (device, trust_remote_code, backend,
    dtype) and of EngineConfig's fields among the constructor's keywords (overrides: taken out of it)."""
    engine = {name: overrides.pop(name) for name in _ENGINE_FIELDS if name in overrides}
    config = replace(config or EngineConfig(), **{k: v for k, v in engine.items() if v is not None})
    if device is not None:  # CrossEncoder-style: auto, cpu, cuda or cuda:0
        if str(device) not in ("auto", "cpu", "cuda", "cuda:0"):
            raise SettingError("EngineConfig.device", str(device), "is not one of auto, cpu, cuda")
        config = replace(config, device=str(device).removesuffix(":0"))
    if trust_remote_code is not None:
        config = replace(config, trust_remote_code=bool(trust_remote_code))
    if backend in BACKENDS:
        config = replace(config, backend=backend)
    elif backend in ("onnx", "openvino"):
        log.warning("backend=%r is ignored: score-batch runs the model with torch", backend)
    elif backend not in (None, "torch"):
        problem = f"is neither CrossEncoder's (torch, onnx, openvino) nor one of {', '.join(BACKENDS)}"
        raise SettingError("backend", backend, problem)
    kwargs = dict(model_kwargs or {})
    dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
    if dtype is not None:
        name = str(dtype).removeprefix("torch.")
        if name not in ("auto", "float32", "bfloat16", "float16"):
            raise SettingError("model_kwargs dtype", dtype, "is not one of float32, bfloat16, float16, auto")
        config = replace(config, dtype=name)
    if kwargs:
        log.info("model_kwargs ignored (score-batch loads and places the model itself): %s", sorted(kwargs))
    return config


def apply_tokenizer_kwargs(tokenizer, kwargs: dict | None) -> dict:
    """Set the tokenizer attributes CrossEncoder's tokenizer kwargs set (truncation_side, padding_side)."""
    kwargs = dict(kwargs or {})
    for name in ("truncation_side", "padding_side"):
        if name in kwargs:
            setattr(tokenizer, name, kwargs[name])
    unused = sorted(set(kwargs) - {"truncation_side", "padding_side", "model_max_length"})
    if unused:
        log.info("tokenizer_kwargs ignored (the tokenizer loads from its files): %s", unused)
    return kwargs


def check_num_labels(num_labels: int | None, info) -> None:
    """Refuse a num_labels that differs from the model's head (CrossEncoder would build a new, untrained head)."""
    # A CausalLM scorer has one score whatever num_labels says, as CrossEncoder's LogitScore.
    if num_labels is not None and info.kind != "causal" and num_labels != info.num_labels:
        problem = f"differs from the model's head ({info.num_labels} labels): CrossEncoder would attach a "
        problem += "new, untrained head; score-batch scores with the trained one only"
        raise SettingError("num_labels", num_labels, problem)


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
    config: EngineConfig, info: ModelInfo, tokenizer, tokenizer_kwargs, logit_score: bool, ce_defaults: bool,
    *, warn: bool, **read,
) -> tuple[CrossEncoderSpec, EngineConfig, ScoredText]:  # fmt: skip
    """The model directory read as CrossEncoder reads it (read: read_cross_encoder's keywords; what it does
    not apply is warned of with warn), its tokenizer set as CrossEncoder's (a CausalLM without the LogitScore
    it needs is refused); the config with the text it scores resolved into its templates (the command line's
    order: engine/model/scored_text.py), and that text."""
    kwargs = apply_tokenizer_kwargs(tokenizer, tokenizer_kwargs)
    spec = read_cross_encoder(
        info.path, tokenizer, info.architecture, info.model_type, tokenizer_kwargs=kwargs, **read
    )
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
    """Token sequences of one query as engine groups: (shared query ids, [(position, item ids)]). The query is
    the sequences' longest common prefix, so query + item is each sequence exactly (an empty item's score row
    is the query's last token). Sequences are grouped by their first token; an empty sequence stays alone (it
    fails as an empty query)."""
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


def progress(total: int, shown: bool):
    """A tqdm bar over scored items (not shown: one that draws nothing)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Scoring", unit="item", disable=not shown)


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
