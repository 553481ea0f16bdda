"""Prefill-only multi-item scoring engine."""

from engine.config import EngineConfig, ScoringConfig
from engine.errors import ScoringInputError, SettingError
from engine.ranking import ranks, top_k_order
from engine.scorer import Scorer
from engine.types import Group, GroupResult

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
