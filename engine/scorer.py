"""The public facade: load a model once, then score groups, or `predict`/`rank` pairs as CrossEncoder does.

`Scorer(model, device=...)` resolves scoring profiles as the command line does; `predict` and `rank` follow
sentence-transformers' CrossEncoder (shapes, types, activations, dict keys) over `score`, which takes `Group`s.
The work happens in a runner chosen once at load: packed decoders (engine/packed_runner.py) or encoder pairs
(engine/pair_runner.py).
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
from score_batch.engine.config import EngineConfig
from score_batch.engine.crossencoder import (
    Text,
    ce_default_activation_fn,
    ce_outputs,
    is_singular_input,
    pair_of,
    ranking_group,
)
from score_batch.engine.errors import ScoringInputError, SettingError
from score_batch.engine.model_source import resolve_model_dir
from score_batch.engine.models import load_model
from score_batch.engine.packed_runner import PackedRunner
from score_batch.engine.pair_runner import PairRunner
from score_batch.engine.planner import Planner, WorkPlan
from score_batch.engine.profiles import Profile, resolve_scoring
from score_batch.engine.setup import (  # noqa: F401 - re-exported for callers of the old module
    DEFAULT_BATCH_TOKENS,
    ResolvedSetup,
    load_planner,
    resolve_device,
    resolve_dtype,
    resolve_packing,
    resolve_setup,
)
from score_batch.engine.types import Group, GroupResult

log = logging.getLogger(__name__)

_ITEM_NUMBER = re.compile(
    r"\bitem \d+\b"
)  # the item's index inside an internal group means nothing to the caller
Runner = PackedRunner | PairRunner


class Scorer:
    """Scores (query, item) pairs with one loaded model; safe to call repeatedly.

    Scorer("org/model" or a directory, device="cpu") loads it with its scoring profile applied as the CLI
    does (see from_pretrained); keyword arguments named like ScoringConfig's fields override the profile.
    """

    def __init__(
        self,
        model_name_or_path: str | Path,
        device: str | None = None,
        *,
        config: EngineConfig | None = None,
        profile: str | None = None,
        **scoring_overrides,
    ) -> None:
        config = config or EngineConfig()
        if device is not None:
            config = replace(config, device=_device_name(device))
        model_dir = resolve_model_dir(model_name_or_path)
        scoring, chosen = resolve_scoring(
            str(model_name_or_path), model_dir, config.scoring, profile, scoring_overrides
        )
        if chosen is not None:
            log.info("scoring profile: %s (%s)", chosen.name, chosen.source)
        self._attach(
            _load_runner(model_dir, replace(config, scoring=scoring)), replace(config, scoring=scoring)
        )
        self.profile: Profile | None = chosen  # the scoring profile applied, if any

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path,
        config: EngineConfig | None = None,
        profile: str | None = None,
        **scoring_overrides,
    ) -> Scorer:
        """Load a model directory or a cached hub id for scoring, with its scoring profile applied as the CLI does.

        The profile is the first that applies: `profile` (a built-in name or a JSON file); score_batch.json in
        the model directory; a built-in profile whose `models` name the hub id or the directory. Keyword
        arguments named like ScoringConfig's fields (apply_softmax=False, label_tokens=(" no", " yes"), …)
        override the profile's values, as flags do; None leaves a value to the profile.

        A config whose `scoring` is not the default ScoringConfig() is taken as given: no profile is looked up
        (keyword overrides still apply, and `profile` with it is an error). `Scorer.load` skips profiles always.
        """
        return cls(model, config=config, profile=profile, **scoring_overrides)

    @classmethod
    def load(
        cls, model: str | Path, config: EngineConfig, planned: tuple[Planner, ResolvedSetup] | None = None
    ) -> Scorer:
        """Load a model directory or a cached hub id with exactly `config` (no profile is looked up).

        planned: the (planner, setup) load_planner already gave for this model and config (not read again).
        """
        scorer = cls.__new__(cls)
        scorer._attach(_load_runner(model, config, planned), config)
        scorer.profile = None
        return scorer

    def _attach(self, runner: Runner, config: EngineConfig) -> None:
        """Hold the runner chosen at load."""
        self._runner = runner
        self.config = config

    # --- what was loaded ----------------------------------------------------------------------------

    @property
    def setup(self) -> ResolvedSetup:
        """Everything resolved at load (device, dtype, backend, limits, labels, activation, runner kind)."""
        return self._runner.setup

    @property
    def activation(self) -> ResolvedActivation:
        """The activation of the `score` column and why it was chosen."""
        return self._runner.setup.activation

    @property
    def planner(self) -> Planner:
        """The tokenizer, scoring settings and limits that plan calls (no model needed)."""
        return self._runner.planner

    @planner.setter
    def planner(self, planner: Planner) -> None:
        self._runner.planner = planner

    @property
    def tokenizer(self):
        """The model's tokenizer."""
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
    ):
        """CrossEncoder.predict: the score of each (query, item) pair, in input order.

        Returns a float32 array of shape (n,) for one-label models and CausalLM label scorers (their `score`:
        the score_index label's probability) and (n, labels) otherwise (CausalLM: with an activation_fn,
        e.g. torch.nn.Identity(), the label probabilities); a scalar (or a (labels,) row) for one pair given as a single
        (query, item); a tensor with convert_to_tensor; a list of
        tensors with convert_to_numpy=False. activation_fn (a callable on the logits tensor) defaults to the
        model's CrossEncoder activation (its config's activation_fn, else a sigmoid for one label, else none),
        or to ScoringConfig.activation when that is set. Pairs with the same query are scored as one group
        (multi-item scoring). batch_size, device, pool and chunk_size only tune CrossEncoder's own batching
        and are accepted and ignored (ours plans by tokens); batch_size_hint: at most about this many pairs
        planned at a time. Failed pairs are NaN (return_errors=True also returns the reason per pair).
        """
        _refuse_prompts(prompt_name, prompt)
        _check_batch_size(batch_size)
        singular = is_singular_input(inputs)
        pairs = (
            [inputs] if singular else (inputs.tolist() if isinstance(inputs, np.ndarray) else list(inputs))
        )
        raw, score, errors = self._score_pairs(pairs, batch_size_hint, show_progress_bar)
        if self.setup.info.kind == "causal" and activation_fn is None and not apply_softmax:
            raw = score[
                :, None
            ]  # [n, 1] a label-token reranker's relevance: the `score` column, as the CLI's
        fn = activation_fn if activation_fn is not None else self._default_activation_fn()
        result = ce_outputs(
            raw, fn, bool(apply_softmax), convert_to_numpy, convert_to_tensor, self.setup.device, singular
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
    ) -> list[dict]:
        """CrossEncoder.rank: documents sorted best first as {"corpus_id", "score"} (+ "text" with return_documents).

        Scores are predict's (the model's CrossEncoder activation, or activation_fn) for one-label models;
        a multi-label head (which CrossEncoder refuses) ranks by the `score` column (the activated score_index
        class), or by activation_fn's score_index column when given. Equal scores keep input order; top_k keeps
        the best top_k; documents that failed are left out. apply_softmax, convert_to_numpy and
        convert_to_tensor have no effect, as in CrossEncoder.
        """
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
        _refuse_prompts(*_prompts)
        _check_batch_size(_batch_size)
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
            raise ScoringInputError(f"top_k must be a non-negative integer or None, got {top_k!r}")
        groups = [ranking_group(entry, index) for index, entry in enumerate(queries_and_documents)]
        results = self._score_chunked(groups, batch_size_hint, show_progress_bar)
        rankings = []
        errors: list[str | None] = []
        for number, (group, result) in enumerate(zip(groups, results)):
            values = self._ranking_scores(result, activation_fn)
            records = [
                {"corpus_id": i, "score": values[i]} | ({"text": group.items[i]} if return_documents else {})
                for i in range(len(group.items))
                if not np.isnan(values[i])
            ]
            rankings.append(sorted(records, key=lambda record: record["score"], reverse=True)[:top_k])
            errors.extend(
                None if e is None else f"queries_and_documents[{number}]: {_ITEM_NUMBER.sub('item', e)}"
                for e in result.failures
            )
        _warn_failed(errors)
        return rankings

    # --- helpers -------------------------------------------------------------------------------------

    def _ranking_scores(self, result: GroupResult, activation_fn: Callable | None) -> list[float]:
        """The values rank sorts by (module doc of rank), as Python floats of float32 values."""
        raw = result.raw if result.raw is not None else result.scores
        one_label = raw.ndim == 2 and raw.shape[1] == 1
        if activation_fn is None and not one_label:
            return result.score.tolist()
        fn = activation_fn if activation_fn is not None else self._default_activation_fn()
        values = fn(torch.from_numpy(np.ascontiguousarray(raw, np.float32)))  # [n, labels]
        column = values[:, 0] if one_label else values[:, self.config.scoring.score_index]
        return column.float().tolist()

    def _default_activation_fn(self) -> Callable:
        """CrossEncoder's default activation for this model, or ScoringConfig.activation when set explicitly."""
        return ce_default_activation_fn(
            self.config.scoring.activation,
            self.setup.info.kind,
            self.setup.num_scores,
            model_activation_fn(self.setup.info.path),
        )

    def _score_pairs(
        self, pairs: list, batch_size_hint: int | None, show_progress_bar: bool | None
    ) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        """Raw outputs [n, labels], scores [n] and errors of (query, item) pairs, grouped by query."""
        groups: dict[object, tuple[Text, list[Text], list[int]]] = {}
        for index, pair in enumerate(pairs):
            query, item = pair_of(pair, index)
            key = query if isinstance(query, str) else ("ids", tuple(query))
            _, items, positions = groups.setdefault(key, (query, [], []))
            items.append(item)
            positions.append(index)
        raw = np.full((len(pairs), self.setup.num_scores), np.nan, np.float32)
        score = np.full(len(pairs), np.nan, np.float32)
        errors: list[str | None] = [None] * len(pairs)
        ordered = list(groups.values())
        results = self._score_chunked(
            [Group(q, items) for q, items, _ in ordered], batch_size_hint, show_progress_bar
        )
        for (_, _, positions), result in zip(ordered, results):
            raw[positions] = result.raw if result.raw is not None else result.scores
            score[positions] = result.score
            for position, error in zip(positions, result.failures):
                if error is not None:
                    errors[position] = f"pairs[{position}]: {_ITEM_NUMBER.sub('item', error)}"
        _warn_failed(errors)
        return raw, score, errors

    def _score_chunked(
        self, groups: list[Group], batch_size_hint: int | None, show_progress_bar: bool | None = None
    ) -> list[GroupResult]:
        """score() over runs of whole groups of about batch_size_hint items each (None: all at once)."""
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
        progress = _progress(sum(len(g.items) for g in groups)) if show_progress_bar else None
        try:
            on_items = progress.update if progress is not None else None
            results: list[GroupResult] = []
            for chunk in chunks:
                if chunk:
                    results.extend(self.score(chunk, on_items) if on_items else self.score(chunk))
            return results
        finally:
            if progress is not None:
                progress.close()


def _load_runner(
    model: str | Path, config: EngineConfig, planned: tuple[Planner, ResolvedSetup] | None = None
) -> Runner:
    """Resolve the setup (unless planned), load the weights and build the runner the model needs (chosen once, here)."""
    planner, setup = planned or load_planner(model, config)
    loaded = load_model(
        setup.info,
        setup.dtype,
        setup.device,
        config.trust_remote_code,
        config.allow_pickle,
        setup.layers,
        setup.ops,
    )
    log.info(
        "loaded %s on %s (%s, backend %s, %s layers%s)",
        setup.info.architecture,
        setup.device,
        setup.dtype,
        setup.backend,
        setup.layers,
        f", {setup.ops} ops" if setup.layers == "native" else "",
    )
    if setup.runner == "pairs":
        return PairRunner(loaded, planner, setup)
    return PackedRunner(loaded, planner, setup, config.compile)


def _device_name(device) -> str:
    """A CrossEncoder-style device argument as EngineConfig.device (auto, cpu or cuda)."""
    text = str(device)
    if text in ("auto", "cpu", "cuda", "cuda:0"):
        return text.removesuffix(":0")
    raise SettingError("EngineConfig.device", text, "is not one of auto, cpu, cuda")


def _refuse_prompts(prompt_name: str | None, prompt: str | None) -> None:
    """CrossEncoder prompts change the input text; say what to use instead of ignoring them."""
    if prompt_name is not None or prompt is not None:
        raise ScoringInputError(
            "prompt and prompt_name are not supported; put the text around queries and items in "
            "ScoringConfig.query_template / item_template (e.g. Scorer(model, query_template='Query: {query}'))"
        )


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
