"""Score-row hidden states → scores and pooled vectors (pure tensor functions, bounded memory), and LogitScoreHead."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from score_batch.engine.config import ScoringConfig

HEAD_BUDGET_BYTES = 64 * 2**20  # most memory the LM head's logits may take at once


# raw [n, scores] float32, scores [n, scores] float32, pooled [n, hidden] float32 or None
HeadOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def score_and_pool(
    rows: torch.Tensor | None,  # [n, hidden] score-row hidden states (an encoder's: its pooled rows)
    cfg: ScoringConfig,
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    label_ids: torch.Tensor | None = None,  # [num_labels] int64: a CausalLM's label tokens
    softcap: float | None = None,
    logits: torch.Tensor | None = None,  # [n, num_labels] a classifier's logits its own forward gave
) -> HeadOutputs:
    """Score rows → (raw, scores, pooled): a CausalLM's label scores (label_ids given: head is its LM head, raw
    = scores), else a classifier's logits (`logits`, or head(rows)) and their scores; pooled: the rows as
    float32 (L2-normalized under cfg.normalize) when cfg.pooled_hidden_states, else None."""
    if label_ids is not None:
        bias = getattr(head, "bias", None)
        raw = scores = label_scores(
            rows, head.weight, bias, label_ids, cfg.apply_softmax, softcap, label_score=cfg.label_score
        )  # [n, num_labels]
    else:
        raw = (head(rows) if logits is None else logits).float()  # [n, num_labels]
        scores = classifier_scores(raw, cfg.apply_softmax)
    pooled = pooled_vectors(rows, cfg.normalize) if cfg.pooled_hidden_states else None
    return raw, scores, pooled


def label_scores(
    rows: torch.Tensor,  # [n, hidden] score-row hidden states
    weight: torch.Tensor,  # [vocab, hidden] LM head
    bias: torch.Tensor | None,  # [vocab]
    label_ids: torch.Tensor,  # [num_labels] int64
    apply_softmax: bool,
    softcap: float | None,
    budget_bytes: int = HEAD_BUDGET_BYTES,
    label_score: str = "probability",
) -> torch.Tensor:  # [n, num_labels] float32
    """CausalLM label scores without [n, vocab] logits for the whole batch (docs/semantics.md, Label scores).
    label_score "probability" (default): P(label) = exp(logit[label] - logsumexp(logits)), the log-sum-exp
    over the vocabulary in chunks of rows whose logits fit budget_bytes; with apply_softmax, the softmax over
    the label logits only. "logit": the label tokens' logits (soft-capped when the model caps its final
    logits); "sigmoid": the sigmoid of each. The last three need only the head's label rows."""
    if label_score not in ("probability", "logit", "sigmoid"):
        raise ValueError(f"label_score must be probability, logit or sigmoid, not {label_score!r}")
    if apply_softmax or label_score != "probability":
        label_bias = None if bias is None else bias[label_ids]
        logits = head_logits(rows, weight[label_ids], label_bias, softcap)  # [n, num_labels] float32
        if label_score == "logit":
            return logits
        if label_score == "sigmoid":
            return torch.sigmoid(logits)
        return torch.softmax(logits, dim=-1)
    out = torch.empty(rows.shape[0], label_ids.shape[0], dtype=torch.float32, device=rows.device)
    # Rows whose logits (model dtype, then float32) fit the budget; at least one.
    step = max(1, budget_bytes // (weight.shape[0] * (rows.element_size() + 4)))
    for start in range(0, rows.shape[0], step):
        logits = head_logits(rows[start : start + step], weight, bias, softcap)  # [step, vocab] float32
        out[start : start + step] = (logits[:, label_ids] - logits.logsumexp(dim=-1, keepdim=True)).exp()
    return out


def head_logits(
    rows: torch.Tensor,  # [n, hidden]
    weight: torch.Tensor,  # [columns, hidden]
    bias: torch.Tensor | None,  # [columns]
    softcap: float | None,
) -> torch.Tensor:  # [n, columns] float32
    """The LM head on some rows (in the model's dtype, as transformers computes it), soft-capped, as float32."""
    return soft_cap(F.linear(rows, weight, bias), softcap).float()


def classifier_scores(logits: torch.Tensor, apply_softmax: bool) -> torch.Tensor:
    """Classifier scores: the head's logits [n, num_labels], optionally softmaxed, as float32."""
    logits = logits.float()
    return torch.softmax(logits, dim=-1) if apply_softmax else logits


def pooled_vectors(hidden: torch.Tensor, normalize: bool) -> torch.Tensor:
    """LAST-pooled hidden states [n, hidden] as float32, optionally L2-normalized."""
    hidden = hidden.float()
    return torch.nn.functional.normalize(hidden, dim=-1) if normalize else hidden


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Final-logit soft-capping (Gemma 2 style): cap * tanh(logits / cap); identity when cap is None."""
    return logits if cap is None else torch.tanh(logits / cap) * cap


class LogitScoreHead(torch.nn.Module):
    """sentence-transformers' LogitScore on score rows: logit[true] - logit[false] (or logit[true]), [n, 1];
    the LM head's two rows only, in the model's dtype as its own forward computes them, soft-capped when the
    model caps its final logits (the runner upcasts the difference to float32 as CrossEncoder does)."""

    def __init__(self, lm_head: torch.nn.Module, true_id: int, false_id: int | None, softcap: float | None):
        super().__init__()
        ids = [true_id] + ([] if false_id is None else [false_id])
        self.weight = torch.nn.Parameter(lm_head.weight.detach()[ids].clone(), requires_grad=False)
        bias = getattr(lm_head, "bias", None)
        self.bias = (
            None if bias is None else torch.nn.Parameter(bias.detach()[ids].clone(), requires_grad=False)
        )
        self.softcap = softcap
        self.pair = false_id is not None

    def forward(self, rows: torch.Tensor) -> torch.Tensor:  # rows: [n, hidden] → [n, 1]
        logits = soft_cap(F.linear(rows, self.weight, self.bias), self.softcap)  # [n, 1|2]
        return logits[:, :1] - logits[:, 1:2] if self.pair else logits[:, :1]
