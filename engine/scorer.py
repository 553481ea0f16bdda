"""The engine's facade: load a model once (a packed or pair runner, chosen then), then plan, run and score."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from score_batch.engine.activation import ResolvedActivation
from score_batch.engine.ce_arguments import (
    ce_engine_config,
    ce_scoring,
    ce_spec,
    check_num_labels,
    refuse_arguments,
)
from score_batch.engine.config import EngineConfig, ScoringConfig
from score_batch.engine.crossencoder import CrossEncoderAPI
from score_batch.engine.model.loading import ModelInfo, load_model, load_tokenizer, read_model_info
from score_batch.engine.model.profiles import Profile, resolve_scoring
from score_batch.engine.model.scored_text import scored_config
from score_batch.engine.model.setup import ResolvedSetup, load_planner
from score_batch.engine.model.source import hub_id_of, resolve_model_dir
from score_batch.engine.native.fp8 import quantize_linears
from score_batch.engine.plan.planner import Planner, WorkPlan
from score_batch.engine.run.heads import LogitScoreHead
from score_batch.engine.run.packed_runner import PackedRunner, PlanRun
from score_batch.engine.run.pair_runner import PairRunner
from score_batch.engine.run.results import Finished
from score_batch.engine.run.verify import make_verifier, verify_count
from score_batch.engine.types import Group, GroupResult

log = logging.getLogger(__name__)


class Scorer(CrossEncoderAPI):
    """Scores (query, item) pairs with one loaded model; safe to call repeatedly.

    Scorer("org/model" or a directory, device="cpu") loads it with its scoring profile applied as the CLI does
    (from_pretrained); keywords named like ScoringConfig's fields override the profile, those named like
    EngineConfig's (max_pack_tokens, dtype, backend, …) set the engine; the CrossEncoder arguments a scoring
    user passes are taken (docs/python-api.md), its others refused naming the setting to use.
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
        trust_remote_code: bool | None = None,
        local_files_only: bool | None = None,  # score-batch never downloads
        cache_folder: str | None = None,
        revision: str | None = None,
        model_kwargs: dict | None = None,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        **overrides,
    ) -> None:
        num_labels = refuse_arguments(overrides, model_kwargs)
        # CrossEncoder's defaults (longest-first, a LogitScore, its pair tokens) unless an EngineConfig is given:
        # its ScoringConfig then holds the defaults (truncate "error", label tokens for a CausalLM).
        ce_defaults = config is None
        config = ce_engine_config(config, overrides, device, trust_remote_code, model_kwargs)
        model_dir = resolve_model_dir(model_name_or_path, cache_dir=cache_folder, revision=revision)
        name = hub_id_of(model_dir) or str(model_name_or_path)  # an HF-cache snapshot: its hub id
        info = read_model_info(model_dir, config.trust_remote_code)
        check_num_labels(num_labels, info)
        scoring, chosen = resolve_scoring(name, model_dir, config.scoring, profile, overrides)
        if chosen is not None:
            log.info("scoring profile: %s (%s)", chosen.name, chosen.source)
        scoring, logit_score = ce_scoring(scoring, chosen, overrides, ce_defaults, info, activation_fn)
        tokenizer = load_tokenizer(model_dir, config.trust_remote_code)
        spec, config, text = ce_spec(
            replace(config, scoring=scoring), info, tokenizer, logit_score, ce_defaults,
            warn=ce_defaults and chosen is None, max_length=max_length, prompts=prompts,
            default_prompt_name=default_prompt_name,
        )  # fmt: skip
        planned = load_planner(
            model_dir, config, prove=True, info=info, tokenizer=tokenizer,
            logit_score=spec.logit_score if logit_score else None,  # CrossEncoder's LogitScore, decided above
            text=text,  # the scored text, resolved above into config
        )  # fmt: skip
        self._runner = _load_runner(config, planned, info)
        self._verifier = make_verifier(config.verify, self._runner.setup)
        self.engine_config = config
        self.profile: Profile | None = chosen  # the scoring profile applied, if any
        self._attach_crossencoder(spec if ce_defaults else None, activation_fn, spec)

    @classmethod
    def from_pretrained(
        cls, model: str | Path, config: EngineConfig | None = None, profile: str | None = None, **overrides
    ) -> Scorer:
        """Load a model directory or a cached hub id for scoring, with its scoring profile applied as the CLI does.

        The profile is the first that applies: `profile` (a built-in name or a JSON file); score_batch.json in
        the model directory; a built-in profile whose `models` name the hub id (an HF-cache snapshot's too) or
        the directory. Keywords named like ScoringConfig's fields (apply_softmax=False, …) override the
        profile's values, as flags do; None leaves a value to the profile. CrossEncoder's arguments are as in
        Scorer(). A config whose `scoring` is not the default ScoringConfig() is taken as given: no profile is
        looked up (overrides apply; `profile` with it is an error). Scorer.load never uses a profile.
        """
        return cls(model, config=config, profile=profile, **overrides)

    @classmethod
    def load(
        cls, model: str | Path, config: EngineConfig, planned: tuple[Planner, ResolvedSetup] | None = None
    ) -> Scorer:
        """Load a model directory or a cached hub id with exactly `config` (no profile is looked up); planned:
        the (planner, setup) load_planner already gave for this model and config (not read again)."""
        scorer = cls.__new__(cls)
        # a planned setup's directory was resolved by its caller; else this is the entry that resolves it
        planned = planned or load_planner(resolve_model_dir(model), config, prove=True)
        scorer._runner = _load_runner(config, planned)
        scorer._verifier = make_verifier(config.verify, scorer._runner.setup)
        # the templates load_planner resolved (scored_text), as the planner scores them
        scorer.engine_config = replace(config, scoring=scored_config(config.scoring, planned[1].text))
        scorer.profile = None
        scorer._attach_crossencoder(None, None)
        return scorer

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
    def device(self) -> torch.device:
        """The device the model runs on."""
        return self.setup.device

    @property
    def planner(self) -> Planner:
        """The tokenizer, scoring settings and limits that plan calls (no model needed)."""
        return self._runner.planner

    @planner.setter
    def planner(self, planner: Planner) -> None:
        self._runner.planner = planner

    @property
    def tokenizer(self):
        """The model's Hugging Face tokenizer (transformers' own; its backend encodes the batches)."""
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
        return self.planner.plan(list(groups))

    def run(self, plan: WorkPlan, on_items: Callable[[int], None] | None = None) -> list[GroupResult]:
        """Run a plan's batches and assemble per-group results in input order (a few kept for verify())."""
        results = self._runner.run(plan, on_items)
        self._verifier.observe(plan, results)
        return results

    def verify(self) -> dict | None:
        """EngineConfig.verify's check of the items kept from this Scorer's runs (engine/run/verify.py): items,
        max_abs_diff, bound, ok, failed_items, path, seconds; None when no items are verified."""
        if self._verifier.count <= 0 or self.setup.runner != "packed":
            return None
        return self._verifier.verify(self._runner)

    def start(self, plan: WorkPlan, on_items: Callable[[int], None] | None = None) -> _Observed:
        """Begin running a plan: a packed decoder's first batch launched (its PlanRun launches the rest and gives
        the results), so a caller can launch the next plan before reading this one; an encoder's runs whole."""
        if isinstance(self._runner, PackedRunner):
            return _Observed(self._runner.start(plan, on_items), plan, self._verifier)
        return _Observed(Finished(self._runner.run(plan, on_items)), plan, self._verifier)

    def score(
        self, groups: Sequence[Group], on_items: Callable[[int], None] | None = None
    ) -> list[GroupResult]:
        """Score every item of every group; failed items carry NaN scores and an error."""
        return self.run(self.plan(groups), on_items)


class _Observed:
    """A started plan whose results the Scorer's verifier keeps a few of when they are read, as run() does."""

    def __init__(self, started: PlanRun | Finished, plan: WorkPlan, verifier) -> None:
        self._started, self._plan, self._verifier = started, plan, verifier

    def launch_rest(self) -> None:
        self._started.launch_rest()

    def results(self) -> list[GroupResult]:
        results = self._started.results()
        self._verifier.observe(self._plan, results)
        return results


def _load_runner(
    config: EngineConfig, planned: tuple[Planner, ResolvedSetup], load_info: ModelInfo | None = None
) -> PackedRunner | PairRunner:
    """Load the weights of a planned setup (load_planner's) and build the runner the model needs (chosen once,
    here). load_info: the model's own ModelInfo when the setup's differs (a LogitScore CausalLM runs as a
    one-label scorer whose head is LogitScoreHead; read again when not given)."""
    # FlashInfer's kernels ran once in load_planner(prove=True): auto fell back, explicit failed.
    planner, setup = planned
    logit_score = setup.logit_score
    if logit_score is not None and load_info is None:
        load_info = read_model_info(setup.info.path, config.trust_remote_code)
    loaded = load_model(load_info or setup.info, setup, config)
    if setup.fp8 != "none":  # the layers' projections in FP8, quantized once (the head stays bf16)
        quantize_linears(
            loaded.backbone, emulate=setup.fp8 == "emulated", keep=verify_count(config.verify, setup) > 0
        )
    if logit_score is not None:
        loaded.head = LogitScoreHead(
            loaded.head, logit_score.true_token_id, logit_score.false_token_id, loaded.final_logit_softcap
        )
        loaded.info = setup.info
    ops = f", {setup.ops} ops" if setup.layers == "native" else ""
    head = ", LogitScore head" if logit_score is not None else ""
    where = f"{setup.device} ({setup.dtype}, backend {setup.backend}, {setup.layers} layers{ops}{head})"
    log.info("loaded %s on %s", setup.info.architecture, where)
    if setup.runner == "pairs":
        return PairRunner(loaded, planner, setup)
    return PackedRunner(loaded, planner, setup, config.compile)
