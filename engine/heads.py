"""Score-row hidden states → scores and pooled vectors (pure tensor functions)."""

from __future__ import annotations

import torch


def label_probabilities(logits: torch.Tensor, label_ids: torch.Tensor, apply_softmax: bool) -> torch.Tensor:
    """CausalLM scores from full-vocabulary logits [n, vocab] → [n, num_labels] float32.

    Default: exp(log_softmax(logits))[labels]; with apply_softmax: softmax over the label logits only.
    """
    logits = logits.float()
    if apply_softmax:
        return torch.softmax(logits[:, label_ids], dim=-1)
    return torch.log_softmax(logits, dim=-1)[:, label_ids].exp()


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
