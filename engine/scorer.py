"""The engine's public entry point: load once, then score groups with prefill-only forwards."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from engine.attention import PLAN_KWARG
from engine.attention.base import Workload
from engine.attention.registry import make_backend, select_backend
from engine.batching import Batch
from engine.config import EngineConfig, ScoringConfig
from engine.errors import SettingError
from engine.heads import classifier_scores, label_scores, pooled_vectors
from engine.model_source import resolve_model_dir
from engine.models import LoadedModel, ModelInfo, load_model, load_tokenizer, read_model_info
from engine.pairs import PairBatch
from engine.planner import PlanLimits, Planner, WorkPlan, default_delimiter, resolve_label_ids
from engine.types import Group, GroupResult

log = logging.getLogger(__name__)

DEFAULT_BATCH_TOKENS = {"cpu": 4096, "cuda": 65536}  # cpu: see docs/scaling_batch-tokens.png


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
    )
    dtype = resolve_dtype(config.dtype, device)
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

    @classmethod
    def from_pretrained(cls, model_dir, config: EngineConfig | None = None) -> Scorer:
        """Load a local model directory or a hub id from the local cache (and its tokenizer) for scoring."""
        config = config or EngineConfig()
        planner, setup = load_planner(model_dir, config)
        model = load_model(
            setup.info, setup.dtype, setup.device, config.trust_remote_code, config.allow_pickle
        )
        log.info(
            "loaded %s on %s (%s, backend %s)",
            setup.info.architecture,
            setup.device,
            setup.dtype,
            setup.backend,
        )
        return cls(model, planner, config, setup)

    def plan(self, groups: Sequence[Group]) -> WorkPlan:
        """Tokenize, pack and batch groups without running the model."""
        return self.planner.plan(list(groups))

    def score(
        self, groups: Sequence[Group], on_items: Callable[[int], None] | None = None
    ) -> list[GroupResult]:
        """Score every item of every group; failed items carry NaN scores and an error."""
        return self.run(self.plan(groups), on_items)

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
