"""An EngineConfig and a model directory → device, budgets, packing, labels, activation, runner."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from score_batch.engine.activation import ResolvedActivation, model_activation_fn, resolve_activation
from score_batch.engine.attention.base import Workload
from score_batch.engine.attention.registry import BACKEND_CLASSES, import_failure, select_backend, why_not
from score_batch.engine.config import EngineConfig, ScoringConfig
from score_batch.engine.errors import SettingError
from score_batch.engine.model.loading import ModelInfo, load_tokenizer, read_model_info
from score_batch.engine.model.scored_text import ScoredText, log_scored_text, resolve_scored_text
from score_batch.engine.model.st_model import LogitScoreSpec, read_cross_encoder, saved_modules
from score_batch.engine.native.fp8 import Fp8Mode, resolve_dtype
from score_batch.engine.plan.planner import (
    PackedPlanner,
    PairPlanner,
    PlanLimits,
    Planner,
    default_delimiter,
    resolve_label_ids,
)

log = logging.getLogger(__name__)

DEFAULT_BATCH_TOKENS = {"cpu": 4096, "cuda": 65536}  # cpu: see docs/scaling_batch-tokens.png
RunnerKind = Literal["packed", "pairs"]  # packed: decoders, our attention; pairs: encoders, padded pairs
PLANNERS: dict[RunnerKind, type[Planner]] = {"packed": PackedPlanner, "pairs": PairPlanner}


@dataclass(frozen=True)
class ResolvedSetup:
    """Everything resolved from an EngineConfig and a model directory before weights load."""

    info: ModelInfo
    device: torch.device
    dtype: torch.dtype
    backend: str  # an attention backend name, or "hf" for encoders (their own attention)
    limits: PlanLimits
    label_ids: tuple[int, ...]
    num_scores: int
    packing: Literal["mis", "single"]  # resolved from "auto"
    activation: ResolvedActivation = ResolvedActivation("none", "not resolved")
    runner: RunnerKind = "packed"
    layers: Literal["native", "transformers"] = "transformers"  # whose decoder layers run: native or HF's
    ops: Literal["torch", "flashinfer", "none"] = "none"  # the native layers' element-wise kernels
    # A CausalLM given no label tokens: its LogitScore (info then reads as a one-label classifier's)
    logit_score: LogitScoreSpec | None = None
    # What `auto` fell back from when its FlashInfer kernels failed their check at load, and why
    # (engine/model/proof.py): "ops flashinfer → torch: <cause>", "backend flashinfer → flex: <cause>"
    fallbacks: tuple[str, ...] = ()
    fp8: Fp8Mode = "none"  # the decoder layers' GEMMs in FP8 (dtype is then bfloat16): scaled_mm or emulated
    # Which text is scored and where its templates came from (engine/model/scored_text.py)
    text: ScoredText = ScoredText(None, None)


def resolve_device(name: str) -> torch.device:
    """'auto' → cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SettingError("EngineConfig.device", name, "needs a CUDA device, and none is available")
    return torch.device(name)


def resolve_packing(info: ModelInfo, cfg: ScoringConfig) -> Literal["mis", "single"]:
    """'auto' → mis when the model allows it, else single; an explicit mis on such a model is refused."""
    if cfg.packing == "mis" and info.mis_refusal and (info.encoder or not cfg.item_first):
        raise SettingError("ScoringConfig.packing", cfg.packing, f"does not apply: {info.mis_refusal}")
    if cfg.packing == "auto":
        return "single" if info.mis_refusal else "mis"
    return cfg.packing


def _pair_max_length(info: ModelInfo, cfg: ScoringConfig, config: EngineConfig, tokenizer) -> int | None:
    """The longest encoder pair (None for decoders), refusing limits that only packing knows: the smallest of
    the model's positions, max_pack_tokens and model_max_length (where CrossEncoder saves max_length)."""
    if not info.encoder:
        return None
    packing_only = {
        "max_query_tokens": cfg.max_query_tokens is not None,
        "max_item_tokens": cfg.max_item_tokens is not None,
        "truncate": cfg.truncate == "query-head",
    }
    problem = (
        "is set, but separate query and item limits do not apply to an encoder cross-encoder: it is limited "
        "per (query, item) pair by its own maximum length (set ScoringConfig.truncate='longest-first' or "
        "ScoringConfig.truncate='item-tail' to cut the pair to fit)"
    )
    for name, given in packing_only.items():
        if given:
            raise SettingError(f"ScoringConfig.{name}", getattr(cfg, name), problem)
    limit = min(info.max_length or config.max_pack_tokens, config.max_pack_tokens)
    model_max = getattr(tokenizer, "model_max_length", None)
    return min(limit, model_max) if isinstance(model_max, int) and model_max > 0 else limit


def _check_scores(info: ModelInfo, cfg: ScoringConfig, num_scores: int, logit_score: bool = False) -> None:
    """Refuse a softmax over one score and a score_index outside the scores."""
    if cfg.apply_softmax and num_scores == 1:
        if info.kind == "causal":
            remedy = (
                "use ScoringConfig.apply_softmax=False for the label token's probability, or give two labels "
                "(ScoringConfig.label_tokens=(' no', ' yes'))"
            )
        elif logit_score:
            remedy = (
                "a CausalLM without labels is scored by its LogitScore, one logit (logit['yes'] - logit['no']): "
                "use ScoringConfig.apply_softmax=False for its sigmoid, or give two labels "
                "(ScoringConfig.label_tokens=(' no', ' yes')) for a softmax over them"
            )
        else:
            remedy = (
                "this classifier has num_labels=1: use ScoringConfig.apply_softmax=False for its raw logit"
            )
        problem = f"makes every score 1.0 with a single score per item (a softmax over one value); {remedy}"
        raise SettingError("ScoringConfig.apply_softmax", cfg.apply_softmax, problem)
    if not -num_scores <= cfg.score_index < num_scores:
        raise SettingError(
            "ScoringConfig.score_index", cfg.score_index, f"is out of range for {num_scores} scores per item"
        )


def _backend(info: ModelInfo, config: EngineConfig, device: torch.device, dtype: torch.dtype) -> str:
    """The attention backend of a decoder; "hf" for an encoder, which runs its own attention over padded pairs."""
    if config.compile and info.encoder:
        problem = f"does not apply to {info.architecture}: only decoder layers are compiled, and an encoder "
        problem += "cross-encoder runs its own attention over padded pairs"
        raise SettingError("EngineConfig.compile", config.compile, problem)
    if info.encoder:
        return "hf"
    return select_backend(config.backend, workload(info, config, device, dtype))


def workload(info: ModelInfo, config: EngineConfig, device: torch.device, dtype: torch.dtype) -> Workload:
    """What a decoder and its settings ask of an attention backend."""
    return Workload(
        device=device.type,
        dtype=dtype,
        head_dim=info.head_dim,
        softcap=info.attention_softcap is not None,
        sliding_window=info.sliding_window is not None,
        max_pack_tokens=config.max_pack_tokens,
    )


def resolve_layers(info: ModelInfo, config: EngineConfig) -> Literal["native", "transformers"]:
    """native when asked for or when auto finds the model fully implemented there; else transformers (logged once)."""
    if config.layers == "transformers":
        return "transformers"
    if info.native_refusal is not None:
        if config.layers == "native":
            raise SettingError(
                "EngineConfig.layers", config.layers, f"cannot run {info.architecture}: {info.native_refusal}"
            )
        log.info(
            "decoder layers: transformers' %s (no native layers: %s)", info.architecture, info.native_refusal
        )
        return "transformers"
    return "native"


FLASHINFER_OPS_DTYPES = (torch.bfloat16, torch.float16)  # its RoPE kernel dispatches on 16-bit types only


def resolve_ops(
    config: EngineConfig,
    layers: str,
    device: torch.device,
    dtype: torch.dtype,
    import_error: Callable[[str], str | None] = import_failure,
) -> Literal["torch", "flashinfer", "none"]:
    """The native layers' kernels: auto → flashinfer on CUDA in 16 bits when it imports (not under compile), else
    torch; importing proves no kernel: engine/model/proof.py runs them at load."""
    from score_batch.engine.native.ops import OPS_MODULE

    if layers != "native":
        if config.ops != "auto":
            log.warning(
                "ops=%s applies to native decoder layers only; this model runs transformers' layers",
                config.ops,
            )
        return "none"
    if config.ops == "torch":
        return "torch"
    problem = None  # why flashinfer cannot run here: an explicit setting fails on it, auto takes torch
    if config.compile:
        problem = "cannot be combined with compile, which compiles the torch ops"
    elif device.type != "cuda":
        problem = f"runs on CUDA only, not on {device.type}"
    elif dtype not in FLASHINFER_OPS_DTYPES:
        problem = f"needs EngineConfig.dtype bfloat16 or float16, not {dtype}"
    elif (failure := import_error(OPS_MODULE)) is not None:
        problem = f"cannot import {OPS_MODULE} ({failure})"
    if problem is not None and config.ops == "flashinfer":
        raise SettingError("EngineConfig.ops", config.ops, problem)
    return "torch" if problem is not None else "flashinfer"


def resolve_setup(
    info: ModelInfo, config: EngineConfig, tokenizer, logit_score: LogitScoreSpec | None = None
) -> ResolvedSetup:
    """Check the model against the config and resolve devices, budgets, packing, labels and activation
    (logit_score: a CausalLM scored by its LogitScore, run as a one-label scorer)."""
    cfg = config.scoring
    if logit_score is not None:
        info = replace(info, kind="classifier", num_labels=1)
    packing = resolve_packing(info, cfg)
    device = resolve_device(config.device)
    label_ids = resolve_label_ids(cfg, tokenizer, info.kind, info.vocab_size)
    _check_classifier_labels(info, cfg, logit_score is not None)
    num_scores = len(label_ids) if info.kind == "causal" else info.num_labels
    _check_scores(info, cfg, num_scores, logit_score is not None)
    # the model's activation_fn where CrossEncoder reads it (config_sentence_transformers.json of a saved one)
    found = model_activation_fn(info.path, saved=saved_modules(info.path) is not None)
    activation = resolve_activation(cfg.activation, info.kind, num_scores, found)
    if info.kind == "causal" and cfg.label_score != "probability":  # the raw label logit, or its sigmoid
        activation = ResolvedActivation(
            "none", f"the label scores are label_score={cfg.label_score} as asked"
        )
    # fp8: bf16 activations with FP8 GEMMs (engine/native/fp8.py)
    dtype, fp8 = resolve_dtype(config.dtype, device)
    backend = _backend(info, config, device, dtype)
    limits = _plan_limits(info, config, tokenizer, device, backend)
    runner: RunnerKind = "pairs" if info.encoder else "packed"
    layers = resolve_layers(info, config)
    ops = resolve_ops(config, layers, device, dtype)
    return ResolvedSetup(
        info, device, dtype, backend, limits, label_ids, num_scores, packing, activation, runner, layers, ops,
        logit_score=logit_score, fp8=fp8,
    )  # fmt: skip


def _plan_limits(
    info: ModelInfo, config: EngineConfig, tokenizer, device: torch.device, backend
) -> PlanLimits:
    """The token budgets, delimiter and limits plans of this model and device use."""
    return PlanLimits(
        max_pack_tokens=config.max_pack_tokens,
        max_batch_tokens=config.max_batch_tokens or DEFAULT_BATCH_TOKENS[device.type],
        delimiter_token_id=default_delimiter(config.scoring.delimiter_token_id, tokenizer, info.vocab_size),
        vocab_size=info.vocab_size,
        isolate_sequences=info.isolate_sequences,
        pair_max_length=_pair_max_length(info, config.scoring, config, tokenizer),
        pad_token_id=getattr(tokenizer, "pad_token_id", None) or 0,
        max_positions=None if info.encoder else info.max_length,
        # The query computed once per group where the backend attends over cached query K/V.
        cache_query=_caches_query(backend),
        unscored_tail_id=info.unscored_tail_id,
    )


def _check_classifier_labels(info: ModelInfo, cfg: ScoringConfig, logit_score: bool) -> None:
    """Label settings a classifier (or a CausalLM run by its LogitScore) ignores are warned of or refused."""
    if info.kind == "classifier" and (cfg.label_tokens or cfg.label_token_ids):
        log.warning("label tokens are ignored for a SequenceClassification model (its head gives the scores)")
    if info.kind == "classifier" and cfg.label_score != "probability":
        raise SettingError(
            "ScoringConfig.label_score",
            cfg.label_score,
            "applies to CausalLM label tokens (ScoringConfig.label_tokens), and none are given: this CausalLM is "
            "scored by its LogitScore"
            if logit_score
            else "applies to CausalLM label tokens; a SequenceClassification model's scores are its head's logits",
        )


def label_free_scoring(
    info: ModelInfo, config: EngineConfig, tokenizer
) -> tuple[EngineConfig, LogitScoreSpec | None]:
    """A CausalLM given no label tokens is scored as CrossEncoder 6.2 scores it: by its LogitScore,
    logit["yes"] − logit["no"] at the last token of the templated query + item (a saved LogitScore's tokens;
    config: its templates resolved, scored_text.resolve_text). (config, None) for labels and classifiers.
    Refused, naming the label tokens, where CrossEncoder's text is not query + item (a chat template that
    could not be applied, a pair encoding that adds tokens between the texts) and no templates or item_first
    say what to score, and where CrossEncoder refuses the model too (no "yes"/"no" tokens)."""
    cfg = config.scoring
    if info.kind != "causal" or cfg.label_tokens or cfg.label_token_ids:
        return config, None
    spec = read_cross_encoder(info.path, tokenizer, info.architecture, info.model_type)
    own_text = cfg.query_template is not None or cfg.item_template is not None or cfg.item_first
    problem = None
    if spec.refusal is not None:
        problem = f"{spec.refusal} (CrossEncoder refuses it too)"
    elif cfg.label_score != "probability":
        problem = f"ScoringConfig.label_score={cfg.label_score!r} applies to label tokens"
    elif spec.chat is not None and not own_text:
        problem = (
            "CrossEncoder renders its pairs through the tokenizer's chat template, which is not applied here"
        )
    elif not own_text and not _pair_is_query_plus_item(tokenizer):
        problem = "its tokenizer's pair encoding is not query + item, the text scored here"
    if problem is not None:
        problem = (
            "is empty, and this CausalLM cannot be scored as CrossEncoder scores it without labels (its "
            f"LogitScore, logit['yes'] - logit['no']): {problem}; give label tokens "
            "(ScoringConfig.label_tokens=(' no', ' yes')) and templates of the text to score, or a profile "
            "(score-batch models lists them)"
        )
        raise SettingError("ScoringConfig.label_tokens", cfg.label_tokens, problem)
    return config, spec.logit_score


def _pair_is_query_plus_item(tokenizer) -> bool:
    """Whether tokenizer(query, item) is the query's encoding followed by the item's without special tokens,
    as packed groups hold them (probed on one pair)."""
    query, item = "Tokyo is a city", " in Japan"
    pair = list(tokenizer(query, item)["input_ids"])
    apart = list(tokenizer(query)["input_ids"]) + list(tokenizer(item, add_special_tokens=False)["input_ids"])
    return pair == apart


def _caches_query(backend: str) -> bool:
    """Whether a backend attends over a group's cached query K/V (its later packs then run without the query)."""
    return backend in BACKEND_CLASSES and BACKEND_CLASSES[backend].capabilities.cached_query


def load_planner(
    model_dir: Path,
    config: EngineConfig,
    prove: bool = False,
    *,
    info: ModelInfo | None = None,
    tokenizer=None,
    logit_score: LogitScoreSpec | None | Literal["read"] = "read",
    text: ScoredText | None = None,
) -> tuple[Planner, ResolvedSetup]:
    """Tokenizer and resolved settings of a model directory its caller resolved, without its weights: the one
    way an engine is built (the job, the Ray driver and Scorer call it). info, tokenizer: when the caller read
    them already (else transformers' tokenizer of the directory); text: the scored text when the caller
    resolved it into config already (Scorer), else resolved here (scored_text.resolve_text); logit_score:
    "read" decides it here (label_free_scoring), else it is taken as decided (Scorer); prove: the setup's
    FlashInfer kernels run once first, so an auto fallback is settled before the planner is built."""
    if info is None:
        info = read_model_info(model_dir, config.trust_remote_code)
    if tokenizer is None:
        tokenizer = load_tokenizer(model_dir, config.trust_remote_code)
    if text is None:
        config, text = resolve_scored_text(config, info, tokenizer)
    log_scored_text(text)
    if logit_score == "read":
        config, logit_score = label_free_scoring(info, config, tokenizer)
        if logit_score is not None:
            true, false = logit_score.true_token_id, logit_score.false_token_id
            how = f"(logit[{true}] - logit[{false}] at the last token), as CrossEncoder scores it"
            log.info("no label tokens: %s is scored by its LogitScore %s", info.architecture, how)
    setup = replace(resolve_setup(info, config, tokenizer, logit_score), text=text)
    if prove:
        setup = prove_setup(setup, config)
    log.info("score activation: %s (%s)", setup.activation.name, setup.activation.reason)
    planner = PLANNERS[setup.runner](tokenizer, replace(config.scoring, packing=setup.packing), setup.limits)
    return planner, setup


NO_JIT = " (no nvcc here: checked with FLASHINFER_DISABLE_JIT=1, FlashInfer's prebuilt kernels only)"


def prove_setup(setup: ResolvedSetup, config: EngineConfig) -> ResolvedSetup:
    """The setup with every FlashInfer kernel it names proven on its device (engine/model/proof.py), or auto's fallback
    (ops → torch; attention → flex, else sdpa) with one warning naming the cause, recorded in fallbacks (and so
    in the run report); an explicit `flashinfer` fails the load with a SettingError (exit 2) naming it. auto
    without a CUDA compiler proves with FLASHINFER_DISABLE_JIT=1: a kernel FlashInfer has not prebuilt fails at
    once instead of a JIT build that cannot succeed (docs/operations.md, FlashInfer without a JIT)."""
    from score_batch.engine.model import proof  # runs kernels: imported only for a load

    fallbacks = list(setup.fallbacks)
    ops, backend, info, device, dtype = setup.ops, setup.backend, setup.info, setup.device, setup.dtype
    if ops == "flashinfer":
        cause = _proven(config.ops, proof.prove_ops, device, dtype, info.hidden_size, info.head_dim)
        if cause is not None:
            ops = _fall_back(config, "ops", "torch", cause, device, fallbacks)
    if backend in BACKEND_CLASSES and BACKEND_CLASSES[backend].capabilities.module == "flashinfer":
        cause = _proven(config.backend, proof.prove_attention, device, dtype, info.head_dim, name=backend)
        if cause is not None:
            flex = why_not("flex", workload(info, config, device, dtype), import_failure) is None
            backend = _fall_back(config, "backend", "flex" if flex else "sdpa", cause, device, fallbacks)
        elif config.backend == "auto" and device.type == "cuda":
            backend = _raced(backend, setup, config)
    if len(fallbacks) == len(setup.fallbacks) and backend == setup.backend:  # proven as resolved
        return setup
    limits = replace(setup.limits, cache_query=_caches_query(backend))  # a fallback may not read cached K/V
    return replace(setup, ops=ops, backend=backend, fallbacks=tuple(fallbacks), limits=limits)


def _raced(backend: str, setup: ResolvedSetup, config: EngineConfig) -> str:
    """auto's backend, or a rival of it (registry.AUTO_RIVALS) that fits, is proven and runs faster on the
    model's widths at load (proof.faster); the figures logged once."""
    from score_batch.engine.attention.registry import AUTO_RIVALS
    from score_batch.engine.model import proof

    info, device, dtype = setup.info, setup.device, setup.dtype
    need = workload(info, config, device, dtype)
    rivals = [name for name in AUTO_RIVALS.get(backend, ()) if why_not(name, need, import_failure) is None]
    proven = [
        name
        for name in rivals
        if _proven("auto", proof.prove_attention, device, dtype, info.head_dim, name=name) is None
    ]
    if not proven:
        return backend
    chosen, seconds = proof.faster([backend, *proven], device, dtype, info.head_dim)
    figures = ", ".join(f"{name} {1e3 * s:.3f} ms" for name, s in seconds.items())
    log.info("attention backend %s: the faster at load (one goal-shape pack's layer: %s)", chosen, figures)
    return chosen


def _proven(asked: str, prove: Callable[..., str | None], *args, name: str = "flashinfer") -> str | None:
    """prove(name, *args): the cause of its failure (the failed builds reset), or None."""
    from score_batch.engine.attention.flashinfer_jit import jit_disabled_without_compiler

    # auto without a compiler: FlashInfer's prebuilt kernels only, a missing one fails at once (no JIT)
    with jit_disabled_without_compiler(asked == "auto") as no_jit:
        cause = prove(name, *args)
    if cause is None:
        return None
    _reset_failed_builds()
    return cause + NO_JIT if no_jit else cause


def _reset_failed_builds() -> None:
    """After a kernel failed its check: FlashInfer 0.6.6 keeps a failed module's build.ninja, so a rerun with the
    environment fixed (CUDA_HOME, link flags) would fail the same way; reset those modules (flashinfer_jit)."""
    try:
        from score_batch.engine.attention.flashinfer_jit import remove_failed_builds

        reset = remove_failed_builds()
    except Exception:  # noqa: BLE001  (no JIT package, a stand-in: nothing to reset)
        return
    if reset:
        log.info("FlashInfer modules whose build failed, reset for the next build: %s", ", ".join(reset))


def _fall_back(config: EngineConfig, field: str, instead: str, cause: str, device, fallbacks: list) -> str:
    """`instead` of flashinfer after one warning (recorded in fallbacks) when config's field was auto; an
    explicit setting fails the load (SettingError)."""
    asked = getattr(config, field)
    if asked != "auto":
        raise SettingError(f"EngineConfig.{field}", asked, f"failed its check on {device} at load: {cause}")
    log.warning(
        "%s=auto: flashinfer failed its check on %s at load (%s); using %s", field, device, cause, instead
    )
    fallbacks.append(f"{field} flashinfer → {instead}: {cause}")
    return instead
