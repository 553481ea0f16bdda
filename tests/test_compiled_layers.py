"""EngineConfig.compile: compiled norms, MLPs and attention modules score as eager does, compiling a bounded number
of times over any number of batch sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig
from score_batch.engine.errors import SettingError
from score_batch.engine.run.compiled import OpaquePlan, compilable_modules

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the quick brown fox jumps over the lazy dog Tokyo is a city in Japan red running shoes".split()


def _groups(count: int, items: int, query_words: int) -> list[tuple[str, list[str]]]:
    """count queries of query_words words with items items each (item lengths vary)."""
    out = []
    for q in range(count):
        query = " ".join(WORDS[(q + i) % len(WORDS)] for i in range(query_words))
        out.append((query, [" ".join(WORDS[(q + i) % len(WORDS) :][: 1 + (i % 5)]) for i in range(items)]))
    return out


def test_compile_must_be_a_bool():
    with pytest.raises(SettingError, match=r"EngineConfig\.compile"):
        EngineConfig(compile="yes")


def test_compile_is_refused_for_an_encoder(zoo):
    with pytest.raises(SettingError, match=r"EngineConfig\.compile.*does not apply"):
        Scorer.load(zoo.get("bert", "classifier"), EngineConfig(device="cpu", compile=True))


def test_compiled_modules_are_the_layers_pieces_around_attention(qwen3_causal):
    from transformers import AutoModelForCausalLM

    backbone = AutoModelForCausalLM.from_pretrained(qwen3_causal).model
    names = [name for name, _ in compilable_modules(backbone)]
    layers = len(backbone.layers)
    per_layer = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    assert sorted(names) == sorted([f"layers.{i}.{n}" for i in range(layers) for n in per_layer] + ["norm"])


def test_opaque_plan_delegates_attend():
    class Plan:
        def attend(self, query, key, value, scaling, sliding_window, softcap=None):
            return (query, scaling, sliding_window, softcap)

    x = torch.zeros(1)
    assert OpaquePlan(Plan()).attend(x, x, x, 0.5, 7, 2.0) == (x, 0.5, 7, 2.0)


def test_torch_dynamo_is_imported_only_when_compiling_is_asked_for():
    code = (
        "import sys\n"
        "import score_batch.engine.scorer, score_batch.engine.run.compiled as c\n"
        "print('torch._dynamo' in sys.modules)\n"
        "class Plan:\n"
        "    def attend(self, *args): return args\n"
        "plan = c.OpaquePlan(Plan())\n"
        "print('torch._dynamo' in sys.modules, isinstance(plan, c.OpaquePlan), plan.attend(1, 2, 3, 4, 5))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.split("\n")[:2] == ["False", "True True (1, 2, 3, 4, 5, None)"], result.stdout


# Graphs once every batch size has run: transformers' layers give RMSNorm, MLP, attention before the
# kernel and after it (static, then dynamic at the 2nd size); the native layers add the norm with its
# fused residual, the q/k head norms and the last layer's score-rows-only variants.
GRAPH_BOUNDS = {"transformers": 5, "native": 11}


@pytest.mark.slow
@pytest.mark.usefixtures("compiling")
@pytest.mark.parametrize("layers", ["native", "transformers"])
def test_compiled_scores_equal_eager_over_many_batch_sizes_with_bounded_compiles(qwen3_causal, layers):
    scoring = ScoringConfig(label_tokens=(" no", " yes"), pooled_hidden_states=True)
    eager = Scorer.load(qwen3_causal, EngineConfig(device="cpu", layers="transformers", scoring=scoring))
    compiled = Scorer.load(
        qwen3_causal, EngineConfig(device="cpu", compile=True, layers=layers, scoring=scoring)
    )
    assert compiled.setup.layers == layers
    assert len(compiled.compiled) == 4 * len(compiled.model.backbone.layers) + 1
    shapes = [(1, 1, 3), (1, 4, 6), (2, 5, 9), (3, 7, 4), (1, 12, 14), (4, 3, 11), (2, 9, 2)]
    graphs = []
    sizes = set()
    before = counters["stats"]["unique_graphs"]
    for count, items, query_words in shapes:
        groups = [Group(q, i) for q, i in _groups(count, items, query_words)]
        plan = compiled.plan(groups)
        assert len(plan.batches) == 1
        sizes.add(plan.batches[0].num_tokens)
        got, want = compiled.run(plan), eager.run(eager.plan(groups))
        for g, w in zip(got, want):
            assert np.abs(g.scores - w.scores).max() <= 1e-4
            assert np.abs(g.pooled - w.pooled).max() <= 1e-4
        graphs.append(counters["stats"]["unique_graphs"] - before)
    assert len(sizes) == len(shapes)  # every batch has its own token count
    # A bounded number of graphs, all there after the second batch size: no compile per batch size.
    assert graphs[-1] <= GRAPH_BOUNDS[layers], graphs
    assert graphs[1] == graphs[-1], graphs
