"""The engine's public entry point: load once, then score groups with prefill-only forwards.

`Scorer.from_pretrained` resolves scoring profiles as the command line does; `predict`, `rank` and `rank_many`
are the pair-level API (CrossEncoder style) over `score`, which takes `Group`s.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from score_batch.engine.attention import PLAN_KWARG
from score_batch.engine.attention.base import Workload
from score_batch.engine.attention.registry import make_backend, select_backend
from score_batch.engine.batching import Batch
from score_batch.engine.compiled import OpaquePlan, compile_backbone
from score_batch.engine.config import EngineConfig, ScoringConfig
from score_batch.engine.errors import ScoringInputError, SettingError
from score_batch.engine.heads import classifier_scores, label_scores, pooled_vectors
from score_batch.engine.model_source import resolve_model_dir
from score_batch.engine.models import LoadedModel, ModelInfo, load_model, load_tokenizer, read_model_info
from score_batch.engine.pairs import PairBatch
from score_batch.engine.planner import PlanLimits, Planner, WorkPlan, default_delimiter, resolve_label_ids
from score_batch.engine.profiles import Profile, resolve_scoring
from score_batch.engine.ranking import top_k_order
from score_batch.engine.types import Group, GroupResult

log = logging.getLogger(__name__)

DEFAULT_BATCH_TOKENS = {"cpu": 4096, "cuda": 65536}  # cpu: see docs/scaling_batch-tokens.png
Text = str | list[int]  # a query or an item: text, or token ids used as given
_ITEM_NUMBER = re.compile(
    r"\bitem \d+\b"
)  # the item's index inside an internal group means nothing to the caller


@dataclass(frozen=True)
class ResolvedSetup:
    """Everything resolved from an EngineConfig and a model directory before weights load."""

    info: ModelInfo
    device: torch.device
    dtype: torch.dtype
    backend: str
    limits: PlanLimits
    label_ids: tuple[int, ...]
    num_scores: int
    packing: str  # "mis" or "single", resolved from "auto"


def resolve_device(name: str) -> torch.device:
    """'auto' → cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SettingError("EngineConfig.device", name, "needs a CUDA device, and none is available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' → bfloat16 on CUDA, float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def resolve_packing(info: ModelInfo, cfg: ScoringConfig) -> str:
    """'auto' → mis when the model allows it, else single; an explicit mis on such a model is refused."""
    if cfg.packing == "mis" and info.mis_refusal and (info.encoder or not cfg.item_first):
        raise SettingError("ScoringConfig.packing", cfg.packing, f"does not apply: {info.mis_refusal}")
    if cfg.packing == "auto":
        return "single" if info.mis_refusal else "mis"
    return cfg.packing


def _pair_max_length(info: ModelInfo, cfg: ScoringConfig, config: EngineConfig) -> int | None:
    """The longest encoder pair (None for decoders), refusing limits that only packing knows."""
    if not info.encoder:
        return None
    packing_only = {
        "max_query_tokens": cfg.max_query_tokens is not None,
        "max_item_tokens": cfg.max_item_tokens is not None,
        "truncate": cfg.truncate == "query-head",
    }
    for name, given in packing_only.items():
        if given:
            raise SettingError(
                f"ScoringConfig.{name}",
                getattr(cfg, name),
                "is set, but separate query and item limits do not apply to an encoder cross-encoder: it is "
                "limited per (query, item) pair by its own maximum length (use ScoringConfig.truncate='item-tail')",
            )
    return min(info.max_length or config.max_pack_tokens, config.max_pack_tokens)


def resolve_setup(info: ModelInfo, config: EngineConfig, tokenizer) -> ResolvedSetup:
    """Check the model against the config and resolve devices, budgets, packing and labels."""
    cfg = config.scoring
    packing = resolve_packing(info, cfg)
    device = resolve_device(config.device)
    label_ids = resolve_label_ids(cfg, tokenizer, info.kind, info.vocab_size)
    if info.kind == "classifier" and (cfg.label_tokens or cfg.label_token_ids):
        log.warning("label tokens are ignored for a SequenceClassification model (its head gives the scores)")
    num_scores = len(label_ids) if info.kind == "causal" else info.num_labels
    if cfg.apply_softmax and num_scores == 1:
        remedy = (
            "use apply_softmax=False for the label token's probability, or give two labels (e.g. ' no', ' yes')"
            if info.kind == "causal"
            else "this classifier has num_labels=1: use apply_softmax=False for its raw logit"
        )
        raise SettingError(
            "ScoringConfig.apply_softmax",
            cfg.apply_softmax,
            f"makes every score 1.0 with a single score per item (a softmax over one value); {remedy}",
        )
    if not -num_scores <= cfg.score_index < num_scores:
        raise SettingError(
            "ScoringConfig.score_index", cfg.score_index, f"is out of range for {num_scores} scores per item"
        )
    limits = PlanLimits(
        max_pack_tokens=config.max_pack_tokens,
        max_batch_tokens=config.max_batch_tokens or DEFAULT_BATCH_TOKENS[device.type],
        delimiter_token_id=default_delimiter(cfg.delimiter_token_id, tokenizer, info.vocab_size),
        vocab_size=info.vocab_size,
        isolate_sequences=info.isolate_sequences,
        pair_max_length=_pair_max_length(info, cfg, config),
        pad_token_id=getattr(tokenizer, "pad_token_id", None) or 0,
        max_positions=None if info.encoder else info.max_length,
    )
    dtype = resolve_dtype(config.dtype, device)
    if config.compile and info.encoder:
        raise SettingError(
            "EngineConfig.compile",
            config.compile,
            f"does not apply to {info.architecture}: only decoder layers are compiled, and an encoder "
            "cross-encoder runs its own attention over padded pairs",
        )
    if info.encoder:
        backend = "hf"  # the model's own attention over padded pairs
    else:
        need = Workload(
            device=device.type,
            dtype=dtype,
            head_dim=info.head_dim,
            softcap=info.attention_softcap is not None,
            sliding_window=info.sliding_window is not None,
            max_pack_tokens=config.max_pack_tokens,
        )
        backend = select_backend(config.backend, need)
    return ResolvedSetup(info, device, dtype, backend, limits, label_ids, num_scores, packing)


def load_planner(model_dir, config: EngineConfig) -> tuple[Planner, ResolvedSetup]:
    """Tokenizer and resolved settings of a model directory (or cached hub id), without loading its weights."""
    model_dir = resolve_model_dir(model_dir)
    info = read_model_info(model_dir, config.trust_remote_code)
    tokenizer = load_tokenizer(model_dir, config.trust_remote_code)
    setup = resolve_setup(info, config, tokenizer)
    return Planner(tokenizer, replace(config.scoring, packing=setup.packing), setup.limits), setup


class Scorer:
    """Scores groups of (query, items) with one loaded model; safe to call repeatedly."""

    def __init__(
        self, model: LoadedModel, planner: Planner, config: EngineConfig, setup: ResolvedSetup
    ) -> None:
        self.model = model
        self.planner = planner
        self.tokenizer = planner.tokenizer
        self.config = config
        self.setup = setup
        self.backend = None if setup.info.encoder else make_backend(setup.backend, setup.device)
        self._label_ids = torch.tensor(setup.label_ids, dtype=torch.long, device=setup.device)
        self.compiled: list[str] = []  # the backbone modules torch.compile runs (EngineConfig.compile)
        if config.compile:
            self.compiled = compile_backbone(model.backbone)
            if not self.compiled:
                raise SettingError(
                    "EngineConfig.compile",
                    config.compile,
                    f"finds no decoder layers with norms, MLPs or attention modules in {setup.info.architecture}",
                )
            log.info(
                "compiling %d modules of %s (norms, MLPs, attention around the kernel); token count dynamic",
                len(self.compiled),
                setup.info.architecture,
            )
        self.profile: Profile | None = None  # the scoring profile from_pretrained applied, if any

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
        config = config or EngineConfig()
        model_dir = resolve_model_dir(model)
        scoring, chosen = resolve_scoring(str(model), model_dir, config.scoring, profile, scoring_overrides)
        if chosen is not None:
            log.info("scoring profile: %s (%s)", chosen.name, chosen.source)
        scorer = cls.load(model_dir, replace(config, scoring=scoring))
        scorer.profile = chosen
        return scorer

    @classmethod
    def load(cls, model: str | Path, config: EngineConfig) -> Scorer:
        """Load a model directory or a cached hub id with exactly `config` (no profile is looked up)."""
        planner, setup = load_planner(model, config)
        loaded = load_model(
            setup.info, setup.dtype, setup.device, config.trust_remote_code, config.allow_pickle
        )
        log.info(
            "loaded %s on %s (%s, backend %s)",
            setup.info.architecture,
            setup.device,
            setup.dtype,
            setup.backend,
        )
        return cls(loaded, planner, config, setup)

    def plan(self, groups: Sequence[Group]) -> WorkPlan:
        """Tokenize, pack and batch groups without running the model."""
        return self.planner.plan(list(groups))

    def score(
        self, groups: Sequence[Group], on_items: Callable[[int], None] | None = None
    ) -> list[GroupResult]:
        """Score every item of every group; failed items carry NaN scores and an error."""
        return self.run(self.plan(groups), on_items)

    def predict(
        self,
        pairs: Sequence[tuple[Text, Text]],
        batch_size_hint: int | None = None,
        return_errors: bool = False,
    ) -> np.ndarray | tuple[np.ndarray, list[str | None]]:
        """The `score` of each (query, item) pair, float32 in input order; NaN where an item failed.

        Pairs with the same query (equal text, or equal token ids) are scored as one group, so the query is
        computed once (multi-item scoring) wherever the pairs sit in the input. batch_size_hint: at most about
        this many pairs are planned and scored at a time (whole groups; a bigger group runs alone); None = all.
        return_errors=True also returns, per pair, None or why it was not scored.
        """
        pairs = list(pairs)
        groups: dict[object, tuple[Text, list[Text], list[int]]] = {}
        for index, pair in enumerate(pairs):
            query, item = _pair(pair, index)
            key = query if isinstance(query, str) else ("ids", tuple(query))
            _, items, positions = groups.setdefault(key, (query, [], []))
            items.append(item)
            positions.append(index)
        scores = np.full(len(pairs), np.nan, np.float32)
        errors: list[str | None] = [None] * len(pairs)
        ordered = list(groups.values())
        results = self._score_chunked([Group(q, items) for q, items, _ in ordered], batch_size_hint)
        for (_, _, positions), result in zip(ordered, results):
            scores[positions] = result.score
            for position, error in zip(positions, result.errors):
                if error is not None:
                    errors[position] = f"pairs[{position}]: {_ITEM_NUMBER.sub('item', error)}"
        _warn_failed(errors)
        return (scores, errors) if return_errors else scores

    def rank(
        self, query: Text, items: Sequence[Text], top_k: int | None = None, return_items: bool = False
    ) -> list[dict]:
        """Items sorted best first, as {"corpus_id": index in items, "score": float} (+ "text" with return_items).

        Equal scores keep input order; top_k keeps the best top_k; items that failed (see `predict`) are left out.
        """
        return self.rank_many([(query, items)], top_k=top_k, return_items=return_items)[0]

    def rank_many(
        self,
        queries_and_items: Sequence[tuple[Text, Sequence[Text]]],
        top_k: int | None = None,
        return_items: bool = False,
        batch_size_hint: int | None = None,
    ) -> list[list[dict]]:
        """`rank` for many queries at once (batched together): one sorted list of records per (query, items)."""
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ScoringInputError(f"top_k must be a positive integer or None, got {top_k!r}")
        groups = [_ranking_group(entry, index) for index, entry in enumerate(queries_and_items)]
        results = self._score_chunked(groups, batch_size_hint)
        rankings = []
        errors: list[str | None] = []
        for number, (group, result) in enumerate(zip(groups, results)):
            order = top_k_order(result.score.tolist(), top_k)
            rankings.append(
                [
                    {"corpus_id": i, "score": float(result.score[i])}
                    | ({"text": group.items[i]} if return_items else {})
                    for i in order
                ]
            )
            errors.extend(
                None if e is None else f"queries_and_items[{number}]: {_ITEM_NUMBER.sub('item', e)}"
                for e in result.errors
            )
        _warn_failed(errors)
        return rankings

    def _score_chunked(self, groups: list[Group], batch_size_hint: int | None) -> list[GroupResult]:
        """score() over runs of whole groups of about batch_size_hint items each (None: all at once)."""
        if batch_size_hint is None:
            return self.score(groups)
        if isinstance(batch_size_hint, bool) or not isinstance(batch_size_hint, int) or batch_size_hint < 1:
            raise ScoringInputError(
                f"batch_size_hint must be a positive integer or None, got {batch_size_hint!r}"
            )
        results: list[GroupResult] = []
        chunk: list[Group] = []
        size = 0
        for group in groups:
            if chunk and size + len(group.items) > batch_size_hint:
                results.extend(self.score(chunk))
                chunk, size = [], 0
            chunk.append(group)
            size += len(group.items)
        if chunk:
            results.extend(self.score(chunk))
        return results

    def run(self, plan: WorkPlan, on_items: Callable[[int], None] | None = None) -> list[GroupResult]:
        """Run a plan's batches and assemble per-group results in input order."""
        cfg = self.config.scoring
        hidden = self.setup.info.hidden_size
        scores = [
            np.full((len(g.item_ids), self.setup.num_scores), np.nan, np.float32) for g in plan.tokenized
        ]
        pooled = [
            np.full((len(g.item_ids), hidden), np.nan, np.float32) if cfg.pooled_hidden_states else None
            for g in plan.tokenized
        ]
        with torch.inference_mode():
            for batch in plan.batches:
                batch_scores, batch_pooled = self._run_batch(batch)
                for row, ref in enumerate(batch.item_refs):
                    scores[ref.group][ref.item] = batch_scores[row]
                    if batch_pooled is not None:
                        pooled[ref.group][ref.item] = batch_pooled[row]
                if on_items is not None:
                    on_items(len(batch.item_refs))
        return [
            GroupResult(
                scores=s,
                score=s[:, cfg.score_index].copy() if s.shape[0] else np.zeros(0, np.float32),
                pooled=p,
                errors=list(g.errors),
            )
            for s, p, g in zip(scores, pooled, plan.tokenized)
        ]

    def _run_batch(self, batch: Batch | PairBatch) -> tuple[np.ndarray, np.ndarray | None]:
        """One prefill-only forward over a ragged batch; heads run on the score rows only."""
        if isinstance(batch, PairBatch):
            return self._run_pairs(batch)
        device = self.setup.device
        input_ids = torch.from_numpy(batch.token_ids).to(device, non_blocking=True)[None]  # [1, num_tokens]
        position_ids = torch.from_numpy(batch.positions).to(device, non_blocking=True)[
            None
        ]  # [1, num_tokens]
        score_rows = torch.from_numpy(batch.score_rows).to(device, non_blocking=True)  # [num_items]
        plan = self.backend.plan(batch, device)
        if self.compiled:
            plan = OpaquePlan(plan)  # compiled attention modules break their graph at attend, untraced
        output = self.model.backbone(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **{PLAN_KWARG: plan}
        )
        rows = output.last_hidden_state[0, score_rows]  # [num_items, hidden]
        cfg = self.config.scoring
        head = self.model.head
        if self.setup.info.kind == "causal":
            scores = label_scores(
                rows,
                head.weight,
                head.bias,
                self._label_ids,
                cfg.apply_softmax,
                self.model.final_logit_softcap,
            )  # [num_items, num_labels]
        else:
            scores = classifier_scores(head(rows), cfg.apply_softmax)  # [num_items, num_labels]
        pooled = pooled_vectors(rows, cfg.normalize).cpu().numpy() if cfg.pooled_hidden_states else None
        return scores.cpu().numpy(), pooled

    def _run_pairs(self, batch: PairBatch) -> tuple[np.ndarray, np.ndarray | None]:
        """An encoder's own forward over padded pairs; pooled = the input of its classification head."""
        device = self.setup.device
        inputs = {
            "input_ids": torch.from_numpy(batch.input_ids).to(device),  # [rows, width]
            "attention_mask": torch.from_numpy(batch.attention_mask).to(device),  # [rows, width]
        }
        if batch.token_type_ids is not None:
            inputs["token_type_ids"] = torch.from_numpy(batch.token_type_ids).to(device)
        captured: list[torch.Tensor] = []
        hook = self.model.backbone.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
        try:
            logits = self.model.model(**inputs).logits  # [rows, num_labels]
        finally:
            hook.remove()
        cfg = self.config.scoring
        scores = classifier_scores(logits, cfg.apply_softmax).cpu().numpy()
        if not cfg.pooled_hidden_states:
            return scores, None
        hidden = captured[0]  # [rows, width, hidden], the backbone's last hidden state
        if getattr(self.model.model.config, "classifier_pooling", "cls") == "mean":
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [rows, width, 1]
            rows = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
        else:
            rows = hidden[:, 0]  # [rows, hidden], the CLS token
        return scores, pooled_vectors(rows, cfg.normalize).cpu().numpy()


def _text(value, where: str) -> Text:
    """A query or item as the engine takes it: a str, or a list of int token ids."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple | np.ndarray) and all(
        isinstance(t, int | np.integer) and not isinstance(t, bool) for t in value
    ):
        return [int(t) for t in value]
    raise ScoringInputError(f"{where} must be a str or a list of int token ids, got {type(value).__name__}")


def _pair(pair, index: int) -> tuple[Text, Text]:
    """One (query, item) of predict's input, checked."""
    if isinstance(pair, str | bytes) or not isinstance(pair, Sequence) or len(pair) != 2:
        raise ScoringInputError(f"pairs[{index}] must be a (query, item) pair, got {pair!r:.80}")
    return _text(pair[0], f"pairs[{index}][0] (the query)"), _text(pair[1], f"pairs[{index}][1] (the item)")


def _ranking_group(entry, index: int) -> Group:
    """One (query, items) of rank_many's input as a Group, checked (a str of items is a common slip)."""
    where = f"queries_and_items[{index}]"
    if isinstance(entry, str | bytes) or not isinstance(entry, Sequence) or len(entry) != 2:
        raise ScoringInputError(f"{where} must be a (query, items) pair, got {entry!r:.80}")
    query, items = entry
    if isinstance(items, str | bytes) or not isinstance(items, Sequence | np.ndarray):
        raise ScoringInputError(f"{where}: items must be a list of items, got {type(items).__name__}")
    return Group(
        _text(query, f"{where} query"), [_text(item, f"{where} items[{i}]") for i, item in enumerate(items)]
    )


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
