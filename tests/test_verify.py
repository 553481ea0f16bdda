"""--verify (engine/run/verify.py): a planted wrong attention kernel (its output scaled by 1.01) is caught — the
report's verify.ok is false and one warning names the items — while the correct kernels stay silent; the
sample is seeded and spread over the run; the default is 0 on the CPU reference path, 16 on a GPU kernel path."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig, SettingError
from score_batch.engine.attention import registry
from score_batch.engine.attention.split import SplitBackend
from score_batch.engine.run.verify import DEFAULT_ITEMS, Verifier, verify_count
from tests.test_cli import LABEL_FLAGS, ROWS, run_cli, write_jsonl

SOFTMAX = ScoringConfig(label_tokens=(" to", " the"), apply_softmax=True)  # scores spread over (0, 1)


class ScaledSplit(SplitBackend):
    """The CPU backend with a planted bug: every attention output 1% too large."""

    def plan(self, batch, device, query_cache=None):
        inner = super().plan(batch, device, query_cache)

        class Scaled:
            def attend(self, *args, **kwargs):
                return inner.attend(*args, **kwargs) * 1.01

        return Scaled()


@pytest.fixture
def planted(monkeypatch):
    monkeypatch.setitem(registry.BACKEND_CLASSES, "split", ScaledSplit)


def _run(tmp_path, model_dir, *flags):
    data, out, report = (
        write_jsonl(tmp_path / "in.jsonl", ROWS),
        tmp_path / "out.parquet",
        tmp_path / "r.json",
    )
    ran = run_cli(
        data, "-o", out, "--report", report, "--device", "cpu", "--apply-softmax", *LABEL_FLAGS, *flags
    )
    assert ran.returncode == 0, ran.stderr
    return json.loads(report.read_text())["verify"], ran.stderr


def test_correct_kernels_stay_silent_and_a_planted_wrong_one_is_caught(qwen3_causal, tmp_path, monkeypatch):
    verify, stderr = _run(tmp_path, qwen3_causal, "--verify", "3")
    assert verify["ok"] is True and verify["items"] == 3 and verify["failed_items"] == []
    assert verify["max_abs_diff"] <= 1e-5 and verify["bound"] == 1e-4 and "verify" not in stderr
    assert verify["path"] == "sdpa, torch ops, float32"
    monkeypatch.setitem(registry.BACKEND_CLASSES, "split", ScaledSplit)
    verify, stderr = _run(tmp_path, qwen3_causal, "--verify", "3", "--overwrite")
    assert verify["ok"] is False and verify["max_abs_diff"] > verify["bound"]
    assert verify["failed_items"] and all(name in stderr for name in verify["failed_items"])
    assert "verify: " in stderr and "differ by up to" in stderr


def test_the_cpu_reference_path_verifies_nothing_by_default(qwen3_causal, tmp_path):
    verify, _ = _run(tmp_path, qwen3_causal)
    assert verify is None


def test_scorer_verify_catches_the_planted_kernel_across_calls(qwen3_causal, planted, caplog):
    scorer = Scorer.load(qwen3_causal, EngineConfig(device="cpu", scoring=SOFTMAX, verify=4))
    for query in ("I pledge allegiance", "Tokyo is a city in"):
        scorer.score([Group(query, [" to", " the flag of", " Japan"])])
    with caplog.at_level(logging.WARNING, logger="score_batch"):
        result = scorer.verify()
    assert result["items"] == 4 and not result["ok"]
    assert {name.split(" group")[0] for name in result["failed_items"]} <= {"call 1", "call 2"}
    assert any("verify: " in r.getMessage() for r in caplog.records)


def test_the_sample_is_seeded_and_spread_over_the_run():
    plan = SimpleNamespace(chunked=None, scored=[SimpleNamespace(reference_sequence=lambda i: [1, i + 2])])
    results = [SimpleNamespace(failures=[None] * 50, scores=np.zeros((50, 1), np.float32))]

    def sample():
        verifier = Verifier(8)
        for _ in range(20):  # 1,000 candidates over 20 calls
            verifier.observe(plan, results)
        return [s.name for s in verifier.samples]

    names = sample()
    assert names == sample() and len(names) == 8  # seeded: the same items each run
    assert len({name.split(" group")[0] for name in names}) > 3  # from many calls, not the first ones only


def test_the_default_is_16_on_a_gpu_kernel_path_only():
    def setup(**changes):
        fields = dict(device=torch.device("cuda"), backend="flashinfer", ops="flashinfer", runner="packed")
        return SimpleNamespace(**{**fields, **changes})

    assert verify_count(None, setup()) == DEFAULT_ITEMS
    assert verify_count(None, setup(backend="sdpa", ops="torch")) == 0
    assert verify_count(None, setup(device=torch.device("cpu"))) == 0
    assert verify_count(None, setup(runner="pairs")) == 0
    assert verify_count(3, setup(device=torch.device("cpu"))) == 3
    with pytest.raises(SettingError, match="EngineConfig.verify"):
        EngineConfig(verify=-1)


def test_the_default_count_is_capped_at_one_percent_of_the_run():
    """16 items of 2 tokens (counted twice) stay within 1% of a run of 6,400 tokens; of 640, one item does."""
    for run_tokens, kept in ((6_400, 16), (640, 1), (3_200, 8)):
        plan = SimpleNamespace(
            chunked=None,
            stats=SimpleNamespace(packed_tokens=run_tokens),
            scored=[SimpleNamespace(reference_sequence=lambda i: [1, 2])],
        )
        verifier = Verifier(16, capped=True)
        verifier.observe(plan, [SimpleNamespace(failures=[None] * 40, scores=np.zeros((40, 1), np.float32))])
        assert len(verifier._within_budget()) == kept


def test_the_python_api_takes_verify_as_an_engine_keyword(qwen3_causal):
    scorer = Scorer(qwen3_causal, device="cpu", verify=2, label_tokens=(" to", " the"))
    assert scorer.engine_config.verify == 2
    scorer.score([Group("I pledge allegiance", [" to", " the flag of", " Japan"])])
    result = scorer.verify()
    assert result["items"] == 2 and result["ok"] and result["max_abs_diff"] <= 1e-5
