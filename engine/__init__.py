"""Prefill-only multi-item scoring engine."""

from score_batch.engine.config import EngineConfig, ScoringConfig
from score_batch.engine.errors import ScoringInputError, SettingError
from score_batch.engine.ranking import ranks, top_k_order
from score_batch.engine.scorer import Scorer
from score_batch.engine.types import Group, GroupResult

__all__ = [
    "EngineConfig",
    "Group",
    "GroupResult",
    "Scorer",
    "ScoringConfig",
    "ScoringInputError",
    "SettingError",
    "ranks",
    "top_k_order",
]
