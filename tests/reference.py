"""Independent plain Hugging Face reference: one eager forward pass per reference sequence, fp32."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer


@lru_cache(maxsize=16)
def _load(model_dir: str, kind: str):
    auto = AutoModelForCausalLM if kind == "causal" else AutoModelForSequenceClassification
    return auto.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()


@lru_cache(maxsize=16)
def tokenizer(model_dir: str):
    """The model directory's tokenizer."""
    return AutoTokenizer.from_pretrained(model_dir)


def reference_sequence(model_dir, query: str, item: str, item_first: bool = False) -> list[int]:
    """docs/semantics.md#sequence-layout: query with special tokens + item without (or the reverse under item_first)."""
    tok = tokenizer(str(model_dir))
    if item_first:
        return tok(item)["input_ids"] + tok(query, add_special_tokens=False)["input_ids"]
    return tok(query)["input_ids"] + tok(item, add_special_tokens=False)["input_ids"]


def reference_scores(model_dir, kind: str, sequence: list[int], label_ids=(), apply_softmax=False):
    """(scores, pooled) of one sequence from a plain HF forward pass."""
    model = _load(str(model_dir), kind)
    with torch.no_grad():
        ids = torch.tensor([sequence])
        logits = model(ids).logits[0]
        pooled = model.model(ids).last_hidden_state[0, -1].numpy()
    if kind == "causal":
        last = logits[-1]
        if apply_softmax:
            scores = torch.softmax(last[list(label_ids)], -1)
        else:
            scores = torch.log_softmax(last, -1)[list(label_ids)].exp()
    else:
        scores = torch.softmax(logits, -1) if apply_softmax else logits
    return scores.numpy().reshape(-1), pooled


def max_abs_diff(a, b) -> float:
    """Largest absolute elementwise difference (0 for empty arrays)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))
