"""Prefill-only multi-item scoring engine.

Light names (configs, errors, records, rankings) import without torch; `Scorer` and the other heavy names
load torch and transformers on first use, so the command line starts fast.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "EngineConfig": "score_batch.engine.config",
    "ScoringConfig": "score_batch.engine.config",
    "ScoringInputError": "score_batch.engine.errors",
    "SettingError": "score_batch.engine.errors",
    "ranks": "score_batch.engine.run.ranking",
    "top_k_order": "score_batch.engine.run.ranking",
    "Group": "score_batch.engine.types",
    "GroupResult": "score_batch.engine.types",
    "activate": "score_batch.engine.activation",
    "ResolvedActivation": "score_batch.engine.activation",
    "Scorer": "score_batch.engine.scorer",
    "ResolvedSetup": "score_batch.engine.model.setup",
    "load_planner": "score_batch.engine.model.setup",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import an exported name's module on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'score_batch.engine' has no attribute {name!r}")
    return getattr(import_module(module), name)
