"""sentence-transformers' CrossEncoder inputs checked and outputs shaped as CrossEncoder 6.2 does (pure)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch

from score_batch.engine.errors import ScoringInputError
from score_batch.engine.types import Group

log = logging.getLogger(__name__)

Text = str | list[int]  # a query or an item: text, or token ids used as given


def is_singular_input(inputs) -> bool:
    """CrossEncoder's test: one (query, item) pair rather than a list of pairs."""
    if isinstance(inputs, list | tuple):
        return len(inputs) > 0 and not isinstance(inputs[0], list | tuple)
    if isinstance(inputs, np.ndarray) and inputs.dtype.kind in ("U", "O"):
        return inputs.size > 0 and inputs.ndim < 2
    return not isinstance(inputs, Sequence | np.ndarray) or isinstance(inputs, str)


def prefix_groups(
    sequences: list[tuple[int, list[int]]],
) -> list[tuple[list[int], list[tuple[int, list[int]]]]]:
    """Token sequences of one query as engine groups: (shared query ids, [(position, item ids)]). The query is
    the sequences' longest common prefix, so query + item is each sequence exactly (an empty item's score row
    is the query's last token). Sequences are grouped by their first token; an empty sequence stays alone (it
    fails as an empty query)."""
    by_first: dict[int | None, list[tuple[int, list[int]]]] = {}
    for position, ids in sequences:
        by_first.setdefault(ids[0] if ids else None, []).append((position, ids))
    groups = []
    for part in by_first.values():
        common = len(os.path.commonprefix([ids for _, ids in part]))
        groups.append((part[0][1][:common], [(position, ids[common:]) for position, ids in part]))
    return groups


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
    if raw.shape[0]:
        scores = activation_fn(torch.from_numpy(np.ascontiguousarray(raw)).to(device))  # [n, labels]
        if raw.shape[1] == 1 and scores.ndim > 1:
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
    query, item = pair
    return text_of(query, f"pairs[{index}][0] (the query)"), text_of(item, f"pairs[{index}][1] (the item)")


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


def ignore_kwargs(method: str, kwargs: dict) -> None:
    """CrossEncoder's deprecated no-op arguments are accepted; anything else is a TypeError, as there."""
    for name in ("num_workers", "convert_to_numpy", "convert_to_tensor", "apply_softmax"):
        kwargs.pop(name, None)
    if kwargs:
        raise TypeError(f"{method}() got unexpected keyword arguments {sorted(kwargs)}")


def whole(value, least: int) -> bool:
    """Whether value is an int (not a bool) of at least `least`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_batch_size(batch_size) -> None:
    """CrossEncoder refuses a batch_size below 1; ours plans by tokens and otherwise ignores it."""
    if not whole(batch_size, 1):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}.")


def progress(total: int, shown: bool):
    """A tqdm bar over scored items (not shown: one that draws nothing)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Scoring", unit="item", disable=not shown)


def warn_failed(errors: list[str | None]) -> None:
    """Log how many items could not be scored, and the first reason."""
    failed = [e for e in errors if e is not None]
    if failed:
        count = f"{len(failed)} of {len(errors)}"
        log.warning("%s items could not be scored (NaN / left out); first: %s", count, failed[0])


def label_logit(raw: np.ndarray, kind: str, score_index: int) -> np.ndarray:  # [n, labels] → [n] float32
    """A label scorer's logit as LogitScore defines it: logit[true] - logit[false], or logit[true] alone."""
    # From probabilities, their log ratio (a softmax over the labels or the vocabulary divides both by the
    # same sum); from logits, their difference; from sigmoids, their logits.
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
        true = score_index % 2
        return (logs[:, true] - logs[:, 1 - true]).astype(np.float32)
    if labels == 1 and kind != "probability":
        return logs[:, 0].astype(np.float32)
    raise ScoringInputError(
        f"activation_fn applies to a CausalLM label scorer's log-odds, which needs two labels (or one label "
        f"scored as a logit); this model has {labels} label(s) scored as {kind}s: call predict without "
        "activation_fn for its score, or Scorer.score for every label's score"
    )
