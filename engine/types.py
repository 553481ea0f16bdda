"""The engine's input and output records."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TokenIds = list[int]


@dataclass(frozen=True)
class Group:
    """One query and its items; text or token ids (never mixed within a run)."""

    query: str | TokenIds
    items: list[str | TokenIds] = field(default_factory=list)


@dataclass
class GroupResult:
    """Per-item results of one group; rows of failed items hold NaN and an error message."""

    scores: np.ndarray  # [num_items, num_scores] float32
    score: np.ndarray  # [num_items] float32, scores[:, score_index]
    pooled: np.ndarray | None  # [num_items, hidden] float32, only when asked for
    errors: list[str | None]
