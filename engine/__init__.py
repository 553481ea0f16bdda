"""Prefill-only multi-item scoring engine."""

from engine.config import EngineConfig, ScoringConfig
from engine.errors import ScoringInputError
from engine.scorer import Scorer
from engine.types import Group, GroupResult

__all__ = ["EngineConfig", "Group", "GroupResult", "Scorer", "ScoringConfig", "ScoringInputError"]
