"""The public facade: load a model once, then score groups, or `predict`/`rank` pairs as CrossEncoder does.

`Scorer(model, device=...)` resolves scoring profiles as the command line does and takes sentence-transformers'
CrossEncoder constructor arguments; `predict` and `rank` follow CrossEncoder 6.2 (shapes, types, activations,
dict keys, truncation) over `score`, which takes `Group`s. Where no profile, label tokens or templates say
otherwise, pairs are the token sequences CrossEncoder itself would build (engine/st_model.py) and a CausalLM
is scored with its LogitScore (logit["yes"] - logit["no"]). The work happens in a runner chosen once at
load: packed decoders (engine/packed_runner.py) or encoder pairs (engine/pair_runner.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from score_batch.engine.activation import ResolvedActivation, model_activation_fn
from score_batch.engine.config import BACKENDS, EngineConfig, ScoringConfig
from score_batch.engine.crossencoder import (
    LogitScoreHead,
    Text,
    ce_default_activation_fn,
    ce_outputs,
    is_singular_input,
    pair_of,
    prefix_groups,
    ranking_group,
)
from score_batch.engine.errors import ScoringInputError, SettingError
from score_batch.engine.model_source import hub_id_of, resolve_model_dir
from score_batch.engine.models import load_model, load_tokenizer, read_model_info
from score_batch.engine.packed_runner import PackedRunner
from score_batch.engine.pair_runner import PairRunner
from score_batch.engine.planner import Planner, WorkPlan
from score_batch.engine.profiles import Profile, resolve_scoring
from score_batch.engine.setup import (  # noqa: F401 - re-exported for callers of the old module
    DEFAULT_BATCH_TOKENS,
    PLANNERS,
    ResolvedSetup,
    label_free_scoring,
    load_planner,
    resolve_device,
    resolve_dtype,
    resolve_packing,
    resolve_setup,
)
from score_batch.engine.st_model import (
    CrossEncoderSpec,
    pair_roles_failure,
    pair_tokens,
    read_cross_encoder,
)
from score_batch.engine.types import Group, GroupResult

log = logging.getLogger(__name__)

_ITEM_NUMBER = re.compile(
    r"\bitem \d+\b"
)  # the item's index inside an internal group means nothing to the caller
Runner = PackedRunner | PairRunner
# torch.nn activations CrossEncoder may be given, as the `score` column's ScoringConfig.activation.
_ACTIVATION_NAMES = {torch.nn.Sigmoid: "sigmoid", torch.nn.Identity: "none", torch.nn.Softmax: "softmax"}
# CrossEncoder constructor arguments that change nothing here (score-batch reads local files only, runs torch,
# and has no model cards): accepted, logged when given.
_IGNORED = ("token", "local_files_only", "model_card_data", "keep_in_fp32_modules")
# EngineConfig fields a keyword may set without giving an EngineConfig (which would drop CrossEncoder's defaults).
_ENGINE_FIELDS = ("dtype", "max_batch_tokens", "max_pack_tokens", "allow_pickle", "compile", "layers", "ops")
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


class Scorer:
    """Scores (query, item) pairs with one loaded model; safe to call repeatedly.

    Scorer("org/model" or a directory, device="cpu") loads it with its scoring profile applied as the CLI
    does (see from_pretrained); keyword arguments named like ScoringConfig's fields override the profile, and
    those named like EngineConfig's (max_pack_tokens, max_batch_tokens, dtype, …) set the engine.
    CrossEncoder's constructor arguments are accepted too (docs/python-api.md, "Loading").
    """

    def __init__(
        self,
        model_name_or_path: str | Path,
        device: str | None = None,
        *,
        config: EngineConfig | None = None,
        profile: str | None = None,
        max_length: int | None = None,
        activation_fn: Callable | None = None,
        num_labels: int | None = None,
        trust_remote_code: bool | None = None,
        model_kwargs: dict | None = None,
        tokenizer_kwargs: dict | None = None,
        config_kwargs: dict | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        backend: str | None = None,
        modules=None,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        **overrides,
    ) -> None:
        for old, new in _RENAMED.items():
            if old in overrides:
                value = overrides.pop(old)
                if new == "tokenizer_kwargs":
                    tokenizer_kwargs = {**(value or {}), **(tokenizer_kwargs or {})}
                elif new == "model_kwargs":
                    model_kwargs = model_kwargs or value
                elif new == "config_kwargs":
                    config_kwargs = config_kwargs or value
                elif new == "cache_folder":
                    cache_folder = cache_folder or value
                elif new == "activation_fn":
                    activation_fn = activation_fn or value
        if "classifier_dropout" in overrides:  # training only
            overrides.pop("classifier_dropout")
        ignored = {name: overrides.pop(name) for name in _IGNORED if name in overrides}
        given = {name: value for name, value in ignored.items() if value not in (None, False, {}, [])}
        if given:
            log.info("ignored CrossEncoder arguments (no effect in score-batch): %s", ", ".join(given))
        if modules is not None:
            raise ScoringInputError(
                "modules= (a CrossEncoder built from module objects) is not supported: give a model directory"
            )
        # CrossEncoder's defaults (longest-first, a LogitScore, its pair tokens) unless an EngineConfig is given:
        # its ScoringConfig then holds the defaults (truncate "error", label tokens for a CausalLM).
        ce_defaults = config is None
        engine = {name: overrides.pop(name) for name in _ENGINE_FIELDS if name in overrides}
        config = replace(config or EngineConfig(), **{k: v for k, v in engine.items() if v is not None})
        config = _engine_config(config, device, trust_remote_code, backend, model_kwargs)
        config_kwargs = dict(config_kwargs or {})
        if config_kwargs.get("num_labels") is not None and num_labels is None:
            num_labels = config_kwargs.pop("num_labels")
        if config_kwargs:
            log.info(
                "config_kwargs ignored (the model's config.json is used as saved): %s", sorted(config_kwargs)
            )
        model_dir = resolve_model_dir(model_name_or_path, cache_dir=cache_folder, revision=revision)
        name = hub_id_of(model_dir) or str(model_name_or_path)  # an HF-cache snapshot: its hub id
        info = read_model_info(model_dir, config.trust_remote_code)
        scoring, chosen = resolve_scoring(name, model_dir, config.scoring, profile, overrides)
        if chosen is not None:
            log.info("scoring profile: %s (%s)", chosen.name, chosen.source)
        if ce_defaults and "truncate" not in ((chosen.settings if chosen else {}) | _given(overrides)):
            scoring = replace(scoring, truncate="longest-first")  # the Python API truncates as CrossEncoder
        has_labels = bool(scoring.label_tokens or scoring.label_token_ids)
        logit_score = info.kind == "causal" and not has_labels
        fn_name = _ACTIVATION_NAMES.get(type(activation_fn))
        labels = 1 if logit_score else info.num_labels
        if fn_name and overrides.get("activation") is None and (info.kind == "classifier" or logit_score):
            if fn_name != "softmax" or labels > 1:  # the `score` column gets the given activation too
                scoring = replace(scoring, activation=fn_name)
        tokenizer = load_tokenizer(model_dir, config.trust_remote_code)
        tokenizer_kwargs = _apply_tokenizer_kwargs(tokenizer, tokenizer_kwargs)
        spec = read_cross_encoder(
            model_dir,
            tokenizer,
            info.architecture,
            info.model_type,
            max_length=max_length,
            tokenizer_kwargs=tokenizer_kwargs,
            prompts=prompts,
            default_prompt_name=default_prompt_name,
        )
        if spec.max_length is not None:
            tokenizer.model_max_length = spec.max_length  # as CrossEncoder's tokenizer holds it
        for unsupported in spec.unsupported if ce_defaults and chosen is None else ():
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
        if logit_score and not ce_defaults:  # groups' text, query + item: checked as the command line's
            scoring = label_free_scoring(info, replace(config, scoring=scoring), tokenizer)[0].scoring
        prompt_template = ce_defaults and info.encoder and scoring.query_template is None
        if prompt_template and spec.default_prompt:
            scoring = replace(scoring, query_template=spec.default_prompt + "{query}")
        _check_num_labels(num_labels, info, logit_score)
        config = replace(config, scoring=scoring)
        setup = resolve_setup(info, config, tokenizer, spec.logit_score if logit_score else None)
        log.info("score activation: %s (%s)", setup.activation.name, setup.activation.reason)
        planner = PLANNERS[setup.runner](tokenizer, replace(scoring, packing=setup.packing), setup.limits)
        runner = _load_runner(model_dir, config, (planner, setup), info)
        self._attach(runner, config, spec if ce_defaults else None, activation_fn)
        self.profile: Profile | None = chosen  # the scoring profile applied, if any
        self.prompts: dict[str, str] = dict(spec.prompts)  # CrossEncoder's prompts and default_prompt_name
        self.default_prompt_name: str | None = spec.default_prompt_name
        self._prompt_template = prompt_template  # an encoder's prompt goes in as its query_template
        if spec.default_prompt and (failure := self._prompt_failure()):
            log.warning("the default prompt %r is not applied: %s", spec.default_prompt, failure)

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path,
        config: EngineConfig | None = None,
        profile: str | None = None,
        **overrides,
    ) -> Scorer:
        """Load a model directory or a cached hub id for scoring, with its scoring profile applied as the CLI does.

        The profile is the first that applies: `profile` (a built-in name or a JSON file); score_batch.json in
        the model directory; a built-in profile whose `models` name the hub id, the directory, or the hub id
        of an HF-cache snapshot directory. Keyword arguments named like ScoringConfig's fields
        (apply_softmax=False, label_tokens=(" no", " yes"), …) override the profile's values, as flags do;
        None leaves a value to the profile. CrossEncoder's constructor arguments are accepted as in Scorer().

        A config whose `scoring` is not the default ScoringConfig() is taken as given: no profile is looked up
        (keyword overrides still apply, and `profile` with it is an error). `Scorer.load` skips profiles always.
        """
        return cls(model, config=config, profile=profile, **overrides)

    @classmethod
    def load(
        cls, model: str | Path, config: EngineConfig, planned: tuple[Planner, ResolvedSetup] | None = None
    ) -> Scorer:
        """Load a model directory or a cached hub id with exactly `config` (no profile is looked up).

        planned: the (planner, setup) load_planner already gave for this model and config (not read again).
        """
        scorer = cls.__new__(cls)
        scorer._attach(_load_runner(model, config, planned), config, None, None)
        scorer.profile = None
        scorer.prompts, scorer.default_prompt_name, scorer._prompt_template = {}, None, False
        return scorer

    def _attach(
        self,
        runner: Runner,
        config: EngineConfig,
        spec: CrossEncoderSpec | None,
        activation_fn: Callable | None,
    ) -> None:
        """Hold the runner chosen at load, and decide how predict/rank encode text pairs."""
        self._runner = runner
        self.engine_config = config
        self._spec = spec
        self._hf_config = None
        self._activation_fn = activation_fn if activation_fn is not None else self._default_activation_fn()
        self._ce_tokens = self._uses_ce_tokens()

    # --- what was loaded ----------------------------------------------------------------------------

    @property
    def setup(self) -> ResolvedSetup:
        """Everything resolved at load (device, dtype, backend, limits, labels, activation, runner kind)."""
        return self._runner.setup

    @property
    def scoring(self) -> ScoringConfig:
        """The scoring settings in use (profile, overrides and the Python API's default truncation applied)."""
        return self.engine_config.scoring

    @property
    def activation(self) -> ResolvedActivation:
        """The activation of the `score` column and why it was chosen."""
        return self._runner.setup.activation

    @property
    def activation_fn(self) -> Callable | None:
        """The activation predict and rank apply by default (CrossEncoder's activation_fn).

        None for a CausalLM label scorer (labels from a profile or keyword arguments): its `score` needs none.
        """
        return self._activation_fn

    @activation_fn.setter
    def activation_fn(self, value: Callable | None) -> None:
        self._activation_fn = value

    @property
    def num_labels(self) -> int:
        """Scores per pair that predict returns: 1 for one-label heads and every CausalLM scorer, as CrossEncoder."""
        return 1 if self._label_scorer else self.setup.info.num_labels  # a LogitScore runs as one label

    @property
    def max_length(self) -> int | None:
        """The longest pair in tokens: the tokenizer's model_max_length, as CrossEncoder's max_length."""
        return getattr(self.tokenizer, "model_max_length", None)

    max_seq_length = max_length

    @property
    def device(self) -> torch.device:
        """The device the model runs on."""
        return self.setup.device

    @property
    def config(self):
        """The model's transformers config (transformers.PretrainedConfig), as CrossEncoder.config.

        The engine's settings are `engine_config` (an EngineConfig) and `scoring`.
        """
        if self._hf_config is None:
            loaded = getattr(self._runner.model.model, "config", None)
            if loaded is None:  # native decoder layers: no transformers module is built
                from transformers import AutoConfig

                loaded = AutoConfig.from_pretrained(
                    self.setup.info.path,
                    trust_remote_code=self.engine_config.trust_remote_code,
                    local_files_only=True,
                )
            self._hf_config = loaded
        return self._hf_config

    @property
    def planner(self) -> Planner:
        """The tokenizer, scoring settings and limits that plan calls (no model needed)."""
        return self._runner.planner

    @planner.setter
    def planner(self, planner: Planner) -> None:
        self._runner.planner = planner

    @property
    def tokenizer(self):
        """The model's Hugging Face tokenizer."""
        return self._runner.planner.tokenizer

    @property
    def model(self):
        """The loaded model (LoadedModel: the whole module, its backbone and its head)."""
        return self._runner.model

    @property
    def backend(self):
        """The attention backend of a packed decoder; None for an encoder (its own attention)."""
        return self._runner.backend

    @property
    def compiled(self) -> list[str]:
        """The backbone modules torch.compile runs (EngineConfig.compile)."""
        return self._runner.compiled

    # --- groups --------------------------------------------------------------------------------------

    def plan(self, groups: Sequence[Group]) -> WorkPlan:
        """Tokenize, pack and batch groups without running the model."""
        return self._runner.plan(list(groups))

    def run(self, plan: WorkPlan, on_items: Callable[[int], None] | None = None) -> list[GroupResult]:
        """Run a plan's batches and assemble per-group results in input order."""
        return self._runner.run(plan, on_items)

    def score(
        self, groups: Sequence[Group], on_items: Callable[[int], None] | None = None
    ) -> list[GroupResult]:
        """Score every item of every group; failed items carry NaN scores and an error."""
        return self.run(self.plan(groups), on_items)

    # --- CrossEncoder-compatible pairs ---------------------------------------------------------------

    def predict(
        self,
        inputs,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable | None = None,
        apply_softmax: bool | None = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        device=None,
        pool=None,
        chunk_size: int | None = None,
        *,
        batch_size_hint: int | None = None,
        return_errors: bool = False,
        **kwargs,
    ):
        """CrossEncoder.predict: the score of each (query, item) pair, in input order.

        Returns a float32 array of shape (n,) for one-label models and every CausalLM scorer, and (n, labels)
        for multi-label heads; a scalar (or a (labels,) row) for one pair given as a single (query, item); a
        tensor with convert_to_tensor; a list of tensors with convert_to_numpy=False. activation_fn (a
        callable on the logits tensor) defaults to `self.activation_fn`: CrossEncoder's (the model's
        activation_fn, else a sigmoid for one label, else none), or ScoringConfig.activation when that is set.
        A CausalLM with a LogitScore (no labels) is scored as CrossEncoder scores it: its logit is
        logit["yes"] - logit["no"]. A CausalLM label scorer (labels from a profile) returns its `score`;
        with activation_fn, that function of the labels' log-odds (two labels, or one raw logit). Pairs with
        the same query are scored as one group (multi-item scoring). prompt / prompt_name: as CrossEncoder's
        (neither: the default prompt, if any). batch_size, device, pool and chunk_size
        only tune CrossEncoder's own batching and are accepted and ignored (ours plans by tokens);
        batch_size_hint: at most about this many pairs planned at a time. Failed pairs are NaN
        (return_errors=True also returns the reason per pair).
        """
        prompt = self._resolve_prompt(prompt, prompt_name)
        _check_batch_size(batch_size)
        _ignore_kwargs("predict", kwargs)
        singular = is_singular_input(inputs)
        pairs = (
            [inputs] if singular else (inputs.tolist() if isinstance(inputs, np.ndarray) else list(inputs))
        )
        raw, score, errors = self._score_pairs(pairs, batch_size_hint, show_progress_bar, prompt)
        errors = [None if e is None else f"pairs[{i}]: {e}" for i, e in enumerate(errors)]
        _warn_failed(errors)
        values, fn = self._ce_logits(raw, score, activation_fn)
        result = ce_outputs(
            values, fn, bool(apply_softmax), convert_to_numpy, convert_to_tensor, self.setup.device, singular
        )
        return (result, errors) if return_errors else result

    def rank(
        self,
        query: Text,
        documents: Sequence[Text],
        top_k: int | None = None,
        return_documents: bool = False,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable | None = None,
        apply_softmax: bool | None = None,
        convert_to_numpy: bool | None = None,
        convert_to_tensor: bool | None = None,
        device=None,
        pool=None,
        chunk_size: int | None = None,
        **kwargs,
    ) -> list[dict]:
        """CrossEncoder.rank: documents sorted best first as {"corpus_id", "score"} (+ "text" with return_documents).

        Scores are predict's (with the same activation_fn) for one-label models and CausalLM scorers; a
        multi-label head (which CrossEncoder refuses) ranks by the `score` column (the activated score_index
        class), or by activation_fn's score_index column when given. Equal scores keep input order; top_k keeps
        the best top_k; documents that failed are left out. apply_softmax, convert_to_numpy and
        convert_to_tensor have no effect, as in CrossEncoder.
        """
        _ignore_kwargs("rank", kwargs)
        return self.rank_many(
            [(query, documents)],
            top_k=top_k,
            return_documents=return_documents,
            activation_fn=activation_fn,
            show_progress_bar=show_progress_bar,
            _prompts=(prompt_name, prompt),
            _batch_size=batch_size,
        )[0]

    def rank_many(
        self,
        queries_and_documents: Sequence[tuple[Text, Sequence[Text]]],
        top_k: int | None = None,
        return_documents: bool = False,
        batch_size_hint: int | None = None,
        activation_fn: Callable | None = None,
        show_progress_bar: bool | None = None,
        _prompts: tuple[str | None, str | None] = (None, None),
        _batch_size: int = 32,
    ) -> list[list[dict]]:
        """`rank` for many queries at once (scored together): one sorted list of records per (query, documents)."""
        prompt = self._resolve_prompt(_prompts[1], _prompts[0])
        _check_batch_size(_batch_size)
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
            raise ScoringInputError(f"top_k must be a non-negative integer or None, got {top_k!r}")
        groups = [ranking_group(entry, index) for index, entry in enumerate(queries_and_documents)]
        pairs = [(group.query, item) for group in groups for item in group.items]
        raw, score, pair_errors = self._score_pairs(pairs, batch_size_hint, show_progress_bar, prompt)
        values = self._ranking_values(raw, score, activation_fn)
        rankings = []
        errors: list[str | None] = []
        start = 0
        for number, group in enumerate(groups):
            stop = start + len(group.items)
            records = [
                {"corpus_id": i, "score": values[start + i]}
                | ({"text": group.items[i]} if return_documents else {})
                for i in range(len(group.items))
                if not np.isnan(values[start + i])
            ]
            rankings.append(sorted(records, key=lambda record: record["score"], reverse=True)[:top_k])
            errors.extend(
                None if e is None else f"queries_and_documents[{number}]: {e}"
                for e in pair_errors[start:stop]
            )
            start = stop
        _warn_failed(errors)
        return rankings

    # --- helpers -------------------------------------------------------------------------------------

    @property
    def _label_scorer(self) -> bool:
        """A CausalLM scored by label tokens (a profile's or the caller's), not by a LogitScore."""
        return self.setup.info.kind == "causal"

    def _uses_ce_tokens(self) -> bool:
        """Whether predict/rank encode text pairs as CrossEncoder does (engine/st_model.py: pair_tokens).

        For decoders without labels, templates or item_first, under truncate longest-first or error; encoders
        are encoded as CrossEncoder's batches by their pair runner anyway (engine/pairs.py).
        """
        spec, cfg = self._spec, self.scoring
        if spec is None or self.setup.info.encoder or self._label_scorer:
            return False
        if (
            cfg.query_template
            or cfg.item_template
            or cfg.item_first
            or cfg.truncate not in ("longest-first", "error")
        ):
            return False
        if spec.chat is not None:
            failure = pair_roles_failure(self.tokenizer, spec.chat.message_format, spec.chat.template_kwargs)
            if failure is not None:
                log.warning(
                    "CrossEncoder would refuse pairs for this model: its chat template cannot carry a "
                    "query/document pair (%s); pairs are encoded as query + item instead",
                    failure,
                )
                return False
        return True

    def _ce_logits(
        self, raw: np.ndarray, score: np.ndarray, activation_fn: Callable | None
    ) -> tuple[np.ndarray, Callable]:
        """What CrossEncoder's activation runs on ([n, labels]) and the activation, for this model."""
        if not self._label_scorer:
            return raw, activation_fn if activation_fn is not None else self._activation_fn
        if activation_fn is None:
            return score[:, None], torch.nn.Identity()  # [n, 1] the `score` column, as the CLI's
        return self._label_logit(raw)[:, None], activation_fn

    def _label_logit(self, raw: np.ndarray) -> np.ndarray:  # raw: [n, labels] → [n] float32
        """A label scorer's logit as LogitScore defines it: logit[true] - logit[false], or logit[true] alone.

        From the label scores: log-probability ratios for probabilities (a softmax over the labels or the whole
        vocabulary divides both by the same sum), differences of logits, logits of sigmoids.
        """
        cfg = self.scoring
        kind = getattr(cfg, "label_score", "probability")
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
            true = cfg.score_index % 2
            return (logs[:, true] - logs[:, 1 - true]).astype(np.float32)
        if labels == 1 and kind != "probability":
            return logs[:, 0].astype(np.float32)
        raise ScoringInputError(
            f"activation_fn applies to a CausalLM label scorer's log-odds, which needs two labels (or one label "
            f"scored as a logit); this model has {labels} label(s) scored as {kind}s: call predict without "
            "activation_fn for its score, or Scorer.score for every label's score"
        )

    def _ranking_values(
        self, raw: np.ndarray, score: np.ndarray, activation_fn: Callable | None
    ) -> list[float]:
        """The values rank sorts by (rank's doc), as Python floats of float32 values."""
        one_label = raw.ndim == 2 and raw.shape[1] == 1
        if not self._label_scorer and activation_fn is None and not one_label:
            return score.astype(np.float32).tolist()
        values, fn = self._ce_logits(raw, score, activation_fn)
        if not len(values):
            return []
        activated = fn(torch.from_numpy(np.ascontiguousarray(values, np.float32)))  # [n, labels]
        one = activated.ndim == 1 or activated.shape[1] == 1
        column = activated.reshape(-1) if one else activated[:, self.scoring.score_index]
        return column.float().tolist()

    def _default_activation_fn(self) -> Callable | None:
        """CrossEncoder's default activation for this model, or ScoringConfig.activation when set explicitly."""
        if self._label_scorer:
            return None
        spec = self._spec
        model_activation = spec.activation if spec is not None else model_activation_fn(self.setup.info.path)
        return ce_default_activation_fn(
            self.scoring.activation,
            self.setup.info.kind,
            self.setup.num_scores,
            model_activation,
            self.engine_config.trust_remote_code,
        )

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """predict's prompt as CrossEncoder resolves it: prompt, else prompts[prompt_name], else the default."""
        if prompt is not None:
            if prompt_name is not None:
                log.warning(
                    "both prompt and prompt_name given: prompt_name is ignored, as CrossEncoder ignores it"
                )
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ScoringInputError(
                    f"prompt_name {prompt_name!r} is not one of the prompts' names {sorted(self.prompts)}"
                )
            return self.prompts[prompt_name]
        return self.prompts.get(self.default_prompt_name) if self.default_prompt_name is not None else None

    def _prompt_failure(self) -> str | None:
        """Why a prompt cannot go before each query as CrossEncoder puts it, or None."""
        if self._spec is None:
            return "an EngineConfig was given, so pairs are not CrossEncoder's text; use ScoringConfig.query_template"
        if self.setup.info.encoder:
            return None if self._prompt_template else "a query_template is set; put the prompt in it"
        if self._ce_tokens:
            return None
        return "pairs are not CrossEncoder's text here (labels, templates or item_first apply); use query_template"

    def _prompted(self, prompt: str | None) -> tuple[CrossEncoderSpec | None, Planner]:
        """The CrossEncoder spec and the planner that put `prompt` (resolved) before each query."""
        spec, planner = self._spec, self._runner.planner
        applies = self._prompt_failure() is None
        if (prompt or None) == (spec.default_prompt if applies else None):
            return spec, planner  # the prompt applied at load
        if not applies:
            raise ScoringInputError(f"prompt {prompt!r} cannot be applied: {self._prompt_failure()}")
        if self._ce_tokens:
            return replace(spec, default_prompt=prompt or None), planner
        template = prompt + "{query}" if prompt else None
        return spec, replace(planner, cfg=replace(planner.cfg, query_template=template))

    def _score_pairs(
        self,
        pairs: list,
        batch_size_hint: int | None,
        show_progress_bar: bool | None,
        prompt: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        """Raw outputs [n, labels], scores [n] and errors of (query, item) pairs, grouped by query.

        prompt: predict's prompt, resolved (_resolve_prompt); put before each query as CrossEncoder puts it.
        """
        spec, planner = self._prompted(prompt)
        checked = [pair_of(pair, index) for index, pair in enumerate(pairs)]
        raw = np.full((len(pairs), self.setup.num_scores), np.nan, np.float32)
        score = np.full(len(pairs), np.nan, np.float32)
        errors: list[str | None] = [None] * len(pairs)
        text = [i for i, (q, d) in enumerate(checked) if isinstance(q, str) and isinstance(d, str)]
        groups: list[tuple[Text, list[Text], list[int]]] = []
        planned = set()
        if self._ce_tokens and text:
            groups.extend(self._ce_token_groups(spec, checked, text, errors))
            planned.update(text)
        by_query: dict[object, tuple[Text, list[Text], list[int]]] = {}
        for index, (query, item) in enumerate(checked):
            if index in planned:
                continue
            key = query if isinstance(query, str) else ("ids", tuple(query))
            _, items, positions = by_query.setdefault(key, (query, [], []))
            items.append(item)
            positions.append(index)
        others = list(by_query.values())
        progress = _progress(len(pairs)) if show_progress_bar else None
        on_items = progress.update if progress is not None else None
        try:
            results = self._score_chunked(
                [Group(q, items) for q, items, _ in groups], batch_size_hint, on_items, as_given=True
            )
            results += self._score_chunked(
                [Group(q, items) for q, items, _ in others],
                batch_size_hint,
                on_items,
                planner=None if planner is self._runner.planner else planner,
            )
        finally:
            if progress is not None:
                progress.close()
        groups += others
        for (_, _, positions), result in zip(groups, results):
            raw[positions] = result.raw if result.raw is not None else result.scores
            score[positions] = result.score
            for position, error in zip(positions, result.failures):
                if error is not None:
                    errors[position] = _ITEM_NUMBER.sub("item", error)
        return raw, score, errors

    def _ce_token_groups(
        self,
        spec: CrossEncoderSpec,
        checked: list[tuple[Text, Text]],
        text: list[int],
        errors: list[str | None],
    ) -> list[tuple[list[int], list[list[int]], list[int]]]:
        """Text pairs as CrossEncoder's token sequences, in groups sharing their longest common prefix.

        A sequence that cannot run (empty, over the limit under truncate="error", or longer than a pack) gets
        its error here and no group.
        """
        truncate = self.scoring.truncate == "longest-first"
        sequences = pair_tokens(spec, self.tokenizer, [checked[i] for i in text], truncate)
        limits = self.setup.limits
        fits = limits.max_pack_tokens - (0 if self.setup.packing == "single" else 2)  # MIS: two delimiters
        if limits.max_positions is not None:
            fits = min(fits, limits.max_positions)
        by_query: dict[str, list[tuple[int, list[int]]]] = {}
        for index, ids in zip(text, sequences):
            error = None
            if not ids:
                error = "pair is empty after tokenization"
            elif not truncate and self.max_length is not None and len(ids) > self.max_length:
                error = (
                    f"pair has {len(ids)} tokens, over the model's limit of {self.max_length} (set truncate to "
                    "longest-first to cut it as CrossEncoder does)"
                )
            elif len(ids) > fits:
                error = (
                    f"pair has {len(ids)} tokens, more than a pack holds ({fits}); raise max_pack_tokens "
                    "(Scorer(model, max_pack_tokens=…)), or lower max_length"
                )
            if error is not None:
                errors[index] = error
                continue
            by_query.setdefault(checked[index][0], []).append((index, ids))
        groups = []
        for sequences_of_query in by_query.values():
            for query_ids, items in prefix_groups(sequences_of_query):
                groups.append((query_ids, [ids for _, ids in items], [position for position, _ in items]))
        return groups

    def _score_chunked(
        self,
        groups: list[Group],
        batch_size_hint: int | None,
        on_items: Callable[[int], None] | None = None,
        as_given: bool = False,
        planner: Planner | None = None,
    ) -> list[GroupResult]:
        """score() over runs of whole groups of about batch_size_hint items each (None: all at once).

        as_given: the groups are CrossEncoder token sequences, already truncated: planned with
        truncate="error" so that the engine never cuts them again. planner: plans the other groups (default:
        the runner's).
        """
        if batch_size_hint is not None and (
            isinstance(batch_size_hint, bool) or not isinstance(batch_size_hint, int) or batch_size_hint < 1
        ):
            raise ScoringInputError(
                f"batch_size_hint must be a positive integer or None, got {batch_size_hint!r}"
            )
        chunks: list[list[Group]] = [[]]
        size = 0
        for group in groups:
            if chunks[-1] and batch_size_hint is not None and size + len(group.items) > batch_size_hint:
                chunks.append([])
                size = 0
            chunks[-1].append(group)
            size += len(group.items)
        if as_given:
            planner = planner or self._runner.planner
            planner = replace(planner, cfg=replace(planner.cfg, truncate="error"))
        results: list[GroupResult] = []
        for chunk in (chunk for chunk in chunks if chunk):
            results.extend(
                self.score(chunk, on_items) if planner is None else self.run(planner.plan(chunk), on_items)
            )
        return results


def _load_runner(
    model: str | Path,
    config: EngineConfig,
    planned: tuple[Planner, ResolvedSetup] | None = None,
    load_info=None,
) -> Runner:
    """Resolve the setup (unless planned), load the weights and build the runner the model needs (chosen once, here).

    load_info: the model's own ModelInfo when the setup's differs (a LogitScore CausalLM runs as a one-label
    scorer whose head is LogitScoreHead; read again when not given).
    """
    # FlashInfer's kernels run once in load_planner(prove=True): auto falls back, explicit fails (a planned
    # setup comes from the caller's own load_planner(prove=True))
    planner, setup = planned or load_planner(model, config, prove=True)
    logit_score = setup.logit_score
    if logit_score is not None and load_info is None:
        load_info = read_model_info(setup.info.path, config.trust_remote_code)
    loaded = load_model(
        load_info or setup.info,
        setup.dtype,
        setup.device,
        config.trust_remote_code,
        config.allow_pickle,
        setup.layers,
        setup.ops,
    )
    if logit_score is not None:
        loaded.head = LogitScoreHead(
            loaded.head, logit_score.true_token_id, logit_score.false_token_id, loaded.final_logit_softcap
        )
        loaded.info = setup.info
    log.info(
        "loaded %s on %s (%s, backend %s, %s layers%s%s)",
        setup.info.architecture,
        setup.device,
        setup.dtype,
        setup.backend,
        setup.layers,
        f", {setup.ops} ops" if setup.layers == "native" else "",
        ", LogitScore head" if logit_score is not None else "",
    )
    if setup.runner == "pairs":
        return PairRunner(loaded, planner, setup)
    return PackedRunner(loaded, planner, setup, config.compile)


def _engine_config(
    config: EngineConfig,
    device,
    trust_remote_code: bool | None,
    backend: str | None,
    model_kwargs: dict | None,
) -> EngineConfig:
    """The EngineConfig of CrossEncoder-style constructor arguments (device, trust_remote_code, backend, dtype)."""
    if device is not None:
        config = replace(config, device=_device_name(device))
    if trust_remote_code is not None:
        config = replace(config, trust_remote_code=bool(trust_remote_code))
    if backend is not None:
        if backend in BACKENDS:
            config = replace(config, backend=backend)
        elif backend in ("torch", "onnx", "openvino"):
            if backend != "torch":
                log.warning("backend=%r is ignored: score-batch runs the model with torch", backend)
        else:
            raise SettingError(
                "backend",
                backend,
                f"is neither CrossEncoder's (torch, onnx, openvino) nor one of {', '.join(BACKENDS)}",
            )
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


def _apply_tokenizer_kwargs(tokenizer, kwargs: dict | None) -> dict:
    """Set the tokenizer attributes CrossEncoder's tokenizer kwargs set (truncation_side, padding_side)."""
    kwargs = dict(kwargs or {})
    for name in ("truncation_side", "padding_side"):
        if name in kwargs:
            setattr(tokenizer, name, kwargs[name])
    unused = sorted(set(kwargs) - {"truncation_side", "padding_side", "model_max_length"})
    if unused:
        log.info("tokenizer_kwargs ignored (the tokenizer loads from its files): %s", unused)
    return kwargs


def _check_num_labels(num_labels: int | None, info, logit_score: bool) -> None:
    """Refuse a num_labels that differs from the model's head (CrossEncoder would build a new, untrained head)."""
    if num_labels is None or info.kind == "causal":
        return  # a CausalLM scorer has one score whatever num_labels says, as CrossEncoder's LogitScore
    if num_labels != info.num_labels:
        raise SettingError(
            "num_labels",
            num_labels,
            f"differs from the model's head ({info.num_labels} labels): CrossEncoder would attach a new, untrained "
            "head; score-batch scores with the trained one only",
        )


def _given(overrides: dict) -> dict:
    """Keyword overrides that were given (not None)."""
    return {key: value for key, value in overrides.items() if value is not None}


def _device_name(device) -> str:
    """A CrossEncoder-style device argument as EngineConfig.device (auto, cpu or cuda)."""
    text = str(device)
    if text in ("auto", "cpu", "cuda", "cuda:0"):
        return text.removesuffix(":0")
    raise SettingError("EngineConfig.device", text, "is not one of auto, cpu, cuda")


def _ignore_kwargs(method: str, kwargs: dict) -> None:
    """CrossEncoder's deprecated no-op arguments are accepted; anything else is a TypeError, as there."""
    for name in ("num_workers", "convert_to_numpy", "convert_to_tensor", "apply_softmax"):
        kwargs.pop(name, None)
    if kwargs:
        raise TypeError(f"{method}() got unexpected keyword arguments {sorted(kwargs)}")


def _check_batch_size(batch_size) -> None:
    """CrossEncoder refuses a batch_size below 1; ours plans by tokens and otherwise ignores it."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}.")


def _progress(total: int):
    """A tqdm bar over scored items."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Scoring", unit="item")


def _warn_failed(errors: list[str | None]) -> None:
    """Log how many items could not be scored, and the first reason."""
    failed = [e for e in errors if e is not None]
    if failed:
        log.warning(
            "%d of %d items could not be scored (NaN / left out); first: %s",
            len(failed),
            len(errors),
            failed[0],
        )
