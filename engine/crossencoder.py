"""CrossEncoder conventions for Scorer.predict / rank: input shapes, default activations, output types."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module

import numpy as np
import torch
from score_batch.engine.errors import ScoringInputError
from score_batch.engine.types import Group

Text = str | list[int]  # a query or an item: text, or token ids used as given


def is_singular_input(inputs) -> bool:
    """CrossEncoder's test: one (query, item) pair rather than a list of pairs."""
    if isinstance(inputs, list | tuple):
        return len(inputs) > 0 and not isinstance(inputs[0], list | tuple)
    if isinstance(inputs, np.ndarray) and inputs.dtype.kind in ("U", "O"):
        return inputs.size > 0 and inputs.ndim < 2
    return not isinstance(inputs, Sequence | np.ndarray) or isinstance(inputs, str)


def ce_default_activation_fn(
    requested: str, kind: str, num_labels: int, model_activation: tuple[str, str] | None
) -> Callable:
    """The activation CrossEncoder applies to this model's logits by default (ScoringConfig.activation wins)."""
    if kind == "causal" or requested == "none":
        return torch.nn.Identity()
    if requested == "sigmoid":
        return torch.nn.Sigmoid()
    if requested == "softmax":
        return torch.nn.Softmax(dim=-1)
    if model_activation is not None and model_activation[0].startswith("torch."):
        module, _, name = model_activation[0].rpartition(".")
        return getattr(import_module(module), name)()  # as CrossEncoder: torch.* paths are trusted
    return torch.nn.Sigmoid() if num_labels == 1 else torch.nn.Identity()


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
    num_labels = raw.shape[1]
    if raw.shape[0]:
        scores = activation_fn(torch.from_numpy(np.ascontiguousarray(raw)).to(device))  # [n, labels]
        if num_labels == 1 and scores.ndim > 1:
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
    return text_of(pair[0], f"pairs[{index}][0] (the query)"), text_of(
        pair[1], f"pairs[{index}][1] (the item)"
    )


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
