"""engine/activation.py: the math against torch, auto's resolution as CrossEncoder's, and a torch-free import."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from score_batch.engine.activation import activate, model_activation_fn, resolve_activation
from score_batch.engine.errors import SettingError

RAW = np.array([[0.3, -1.2, 2.5], [40.0, -40.0, 0.0], [-100.0, 3.0, 3.0]], np.float32)


@pytest.mark.parametrize("index", [0, 1, -1])
def test_activate_equals_torch(index):
    logits = torch.from_numpy(RAW)
    assert np.array_equal(activate(RAW, "none", index), RAW[:, index])
    np.testing.assert_allclose(activate(RAW, "sigmoid", index), torch.sigmoid(logits)[:, index], atol=1e-7)
    np.testing.assert_allclose(activate(RAW, "softmax", index), torch.softmax(logits, 1)[:, index], atol=1e-7)
    for name in ("none", "sigmoid", "softmax"):
        out = activate(RAW, name, index)
        assert out.dtype == np.float32 and out.shape == (3,)
        assert activate(RAW[:0], name, index).shape == (0,)


def test_a_nan_row_stays_nan_and_others_are_untouched():
    raw = RAW.copy()
    raw[1, 2] = np.nan
    for name in ("sigmoid", "softmax"):
        out = activate(raw, name, 0)
        assert np.isnan(out[1]) == (name == "softmax") and np.isfinite(out[[0, 2]]).all()


def test_auto_resolution(tmp_path):
    assert resolve_activation("auto", "classifier", 1).name == "sigmoid"
    assert resolve_activation("auto", "classifier", 3).name == "softmax"
    assert resolve_activation("auto", "causal", 2).name == "none"
    assert resolve_activation("none", "classifier", 1).name == "none"
    model = ("torch.nn.modules.linear.Identity", "config.json sentence_transformers.activation_fn")
    assert resolve_activation("auto", "classifier", 1, model).name == "none"
    assert resolve_activation("sigmoid", "classifier", 1, model).name == "sigmoid"  # explicit wins
    untrusted = ("my_package.Sharpen", "config.json sentence_transformers.activation_fn")
    assert resolve_activation("auto", "classifier", 1, untrusted).name == "sigmoid"
    with pytest.raises(SettingError, match="does not apply to a CausalLM"):
        resolve_activation("sigmoid", "causal", 2)
    with pytest.raises(SettingError, match="every score 1.0"):
        resolve_activation("softmax", "classifier", 1)
    (tmp_path / "config.json").write_text(
        json.dumps({"sbert_ce_default_activation_function": "torch.nn.Sigmoid"})
    )
    assert model_activation_fn(tmp_path)[0] == "torch.nn.Sigmoid"
    (tmp_path / "config_sentence_transformers.json").write_text(
        json.dumps({"activation_fn": "torch.nn.Identity"})
    )
    assert model_activation_fn(tmp_path) == (
        "torch.nn.Identity",
        "config_sentence_transformers.json activation_fn",
    )


def test_light_engine_modules_import_without_torch():
    code = (
        "import sys\n"
        "import score_batch.engine, score_batch.engine.config, score_batch.engine.model.source\n"
        "import score_batch.engine.model.profiles, score_batch.engine.activation, score_batch.engine.run.ranking\n"
        "import score_batch.engine.model.kind\n"
        "from score_batch.engine import EngineConfig, ScoringConfig, Group, GroupResult, activate\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
