"""One load path: load_planner builds every engine (Scorer's too); a run resolves its model directory once."""

from __future__ import annotations

import pytest

import score_batch.engine.model.source as model_source
import score_batch.engine.scorer as scorer_module
from score_batch.engine import EngineConfig, Scorer, ScoringConfig
from score_batch.engine.model.setup import load_planner
from tests.test_cli import LABEL_FLAGS, ROWS, run_cli, write_jsonl


def _counting(monkeypatch, module, name) -> list:
    """Replace module.name with a wrapper that records each call's result."""
    calls, original = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(result := original(*args, **kwargs))
        return result

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.mark.parametrize("config", [None, EngineConfig(scoring=ScoringConfig(label_tokens=(" to", " the")))])
def test_scorer_builds_its_engine_with_load_planner(qwen3_causal, monkeypatch, config):
    built = _counting(monkeypatch, scorer_module, "load_planner")
    scorer = Scorer(qwen3_causal, device="cpu", config=config)
    assert len(built) == 1
    planner, setup = built[0]
    assert scorer.planner is planner and scorer.setup is setup
    # the same planner and setup as load_planner gives for the scorer's settings
    again, again_setup = load_planner(qwen3_causal, scorer.engine_config)
    assert again.cfg == planner.cfg and again.limits == planner.limits
    assert again_setup.label_ids == setup.label_ids and again_setup.logit_score == setup.logit_score


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_run_resolves_its_model_directory_once(qwen3_causal, monkeypatch, tmp_path, dry_run):
    resolved = _counting(monkeypatch, model_source, "_find_model_dir")
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    extra = ["--dry-run"] if dry_run else []
    result = run_cli(data, "-o", tmp_path / "out.jsonl", "--model", qwen3_causal, *LABEL_FLAGS, *extra)
    assert result.returncode == 0, result.stderr
    assert resolved == [qwen3_causal]
