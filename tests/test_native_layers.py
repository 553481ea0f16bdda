"""The native decoder layers (engine/native) against plain transformers forwards, family by family and feature by feature."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch

from score_batch.engine import EngineConfig, Scorer, ScoringConfig, SettingError
from score_batch.engine.native.ops import TorchOps
from tests.reference import max_abs_diff, reference_scores, reference_sequence
from tests.test_scorer import GROUPS, LABELS, label_ids

EXACT = 1e-5  # fp32, every family × head × backend, against separate plain-HF forwards

ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
}

# (family, kind, config overrides, add_bos): every config feature the native layers implement.
CASES = {
    "qwen3-causal-qk-norm-gqa": ("qwen3", "causal", {}, False),
    "qwen3-classifier": ("qwen3", "classifier", {}, False),
    "qwen3-attention-bias": ("qwen3", "causal", {"attention_bias": True}, False),
    "qwen2-qkv-bias": ("qwen2", "causal", {}, False),
    "qwen2-classifier-sliding-layers": (
        "qwen2",
        "classifier",
        {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
        False,
    ),
    "llama-causal-tied": ("llama", "causal", {"tie_word_embeddings": True}, True),
    "llama-classifier-biases": ("llama", "classifier", {"attention_bias": True, "mlp_bias": True}, True),
    "llama-head-dim-32": ("llama", "causal", {"head_dim": 32}, True),
    "llama-no-gqa": ("llama", "causal", {"num_key_value_heads": 4}, True),
    "mistral-sliding-window": ("mistral", "causal", {"sliding_window": 4}, False),
    "mistral-classifier": ("mistral", "classifier", {}, False),
    **{
        f"rope-{name}": ("llama" if name == "llama3" else "qwen3", "causal", {"rope_scaling": rope}, False)
        for name, rope in ROPE_SCALINGS.items()
    },
}


def _scorer(model_dir, kind, layers="native", backend="split", **engine) -> Scorer:
    scoring = ScoringConfig(label_tokens=LABELS if kind == "causal" else (), pooled_hidden_states=True)
    return Scorer.load(
        model_dir, EngineConfig(device="cpu", backend=backend, layers=layers, scoring=scoring, **engine)
    )


def _worst_against_reference(model_dir, kind, groups, results) -> float:
    worst = 0.0
    for group, result in zip(groups, results):
        for i, item in enumerate(group.items):
            sequence = reference_sequence(model_dir, group.query, item)
            scores, pooled = reference_scores(model_dir, kind, sequence, label_ids(model_dir))
            worst = max(worst, max_abs_diff(scores, result.scores[i]), max_abs_diff(pooled, result.pooled[i]))
    return worst


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", ["split", "sdpa"])
def test_native_layers_equal_plain_transformers(zoo, case, backend):
    family, kind, overrides, add_bos = CASES[case]
    model_dir = zoo.get(family, kind, add_bos=add_bos, **overrides)
    scorer = _scorer(model_dir, kind, backend=backend)
    assert scorer.setup.layers == "native" and scorer.setup.ops == "torch"
    assert type(scorer.model.backbone).__name__ == "NativeDecoder"
    results = scorer.score(GROUPS)
    assert _worst_against_reference(model_dir, kind, GROUPS, results) <= EXACT


def test_sharded_checkpoint_loads_every_shard(zoo, tmp_path):
    from transformers import AutoModelForCausalLM

    source = zoo.get("qwen2", "causal")
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(source).save_pretrained(sharded, max_shard_size="20KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((source / name).read_bytes())
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    native = _scorer(sharded, "causal").score(GROUPS[:3])
    expected = _scorer(source, "causal").score(GROUPS[:3])
    for got, want in zip(native, expected):
        assert np.array_equal(got.scores, want.scores)


def test_bfloat16_load_follows_transformers(zoo):
    model_dir = zoo.get("qwen3", "causal")
    native = _scorer(model_dir, "causal", dtype="bfloat16").score(GROUPS[:3])
    hf = _scorer(model_dir, "causal", layers="transformers", dtype="bfloat16").score(GROUPS[:3])
    assert (
        _scorer(model_dir, "causal", dtype="bfloat16").model.backbone.embed_tokens.weight.dtype
        == torch.bfloat16
    )
    for got, want in zip(native, hf):
        assert max_abs_diff(got.scores, want.scores) <= 2e-2  # two bf16 roundings of different kernels


@pytest.mark.parametrize(
    ("family", "overrides", "why"),
    [
        ("gemma", {}, "model type 'gemma' has no native layers"),
        ("phi3", {}, "model type 'phi3' has no native layers"),
        ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "RoPE type 'dynamic'"),
        ("qwen2", {"hidden_act": "gelu"}, "activation 'gelu'"),
    ],
)
def test_unimplemented_models_keep_transformers_with_one_log_line(zoo, caplog, family, overrides, why):
    model_dir = zoo.get(family, "causal", add_bos=family != "phi3", **overrides)
    with caplog.at_level(logging.INFO, logger="score_batch"):
        scorer = _scorer(model_dir, "causal", layers="auto")
    assert scorer.setup.layers == "transformers" and scorer.setup.ops == "none"
    lines = [r.getMessage() for r in caplog.records if "no native layers" in r.getMessage()]
    assert len(lines) == 1 and why in lines[0], lines
    with pytest.raises(SettingError, match=why.replace("(", r"\(").replace(")", r"\)")):
        _scorer(model_dir, "causal", layers="native")


def test_ops_settings_are_checked(qwen3_causal):
    with pytest.raises(SettingError, match="runs on CUDA only"):
        _scorer(qwen3_causal, "causal", ops="flashinfer")
    with pytest.raises(SettingError, match="cannot be combined with compile"):
        _scorer(qwen3_causal, "causal", ops="flashinfer", compile=True)
    assert _scorer(qwen3_causal, "causal").setup.ops == "torch"  # auto on the CPU


def test_torch_ops_equal_the_transformers_formulas():
    torch.manual_seed(0)
    ops = TorchOps()
    x, residual, weight = torch.randn(7, 16), torch.randn(7, 16), torch.randn(16)
    summed = residual + x
    expected = weight * (summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-6))
    normed, new_residual = ops.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(new_residual, summed) and torch.equal(normed, expected)
    # RoPE in place on strided views of one fused QKV row, as transformers' rotate_half formula gives it.
    qkv = torch.randn(5, 3 * 8)
    q, k = qkv[:, :8], qkv[:, 8:16]
    positions = torch.tensor([0, 1, 2, 1, 2])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4))
    freqs = torch.arange(4).float()[:, None] * inv_freq[None]
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)  # [4, 4]
    cos = torch.cat([freqs.cos()] * 2, -1)[positions][:, None]  # [5, 1, 4]
    sin = torch.cat([freqs.sin()] * 2, -1)[positions][:, None]

    def rotate_half(t):
        return torch.cat([-t[..., 2:], t[..., :2]], -1)

    want_q = q.view(5, 2, 4) * cos + rotate_half(q.view(5, 2, 4)) * sin
    want_k = k.view(5, 2, 4) * cos + rotate_half(k.view(5, 2, 4)) * sin
    untouched = qkv[:, 16:].clone()
    ops.rope(ops.rope_tables(positions, cache, q.dtype), q, k, 4)
    assert torch.equal(q.view(5, 2, 4), want_q) and torch.equal(k.view(5, 2, 4), want_k)
    assert torch.equal(qkv[:, 16:], untouched)


@pytest.mark.slow
def test_scoring_a_native_family_imports_no_transformers_modeling_module(qwen3_causal):
    code = (
        "import sys\n"
        "from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig\n"
        f"s = Scorer.load({str(qwen3_causal)!r}, EngineConfig(device='cpu', scoring=ScoringConfig(label_tokens=(' to', ' the'))))\n"
        "s.score([Group('Tokyo is a city in', [' Japan'])])\n"
        "print(sorted(m for m in sys.modules if m.startswith('transformers.models.') and '.modeling_' in m\n"
        "             and not m.startswith('transformers.models.auto.')))\n"
        "print('transformers.modeling_utils' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[:2] == ["[]", "False"], result.stdout
    assert "Loading weights" not in result.stderr  # no transformers progress bar in a user's notebook


def test_ops_resolution_on_cuda_without_a_gpu():
    from score_batch.engine.model.setup import resolve_ops

    cuda = torch.device("cuda")  # resolve_ops only reads the device type: no GPU needed

    def imports(module):
        return None

    def broken(module):
        return "ModuleNotFoundError: No module named 'flashinfer'"

    assert resolve_ops(EngineConfig(), "native", cuda, torch.bfloat16, imports) == "flashinfer"
    assert resolve_ops(EngineConfig(), "native", cuda, torch.float32, imports) == "torch"  # 16-bit kernels
    assert resolve_ops(EngineConfig(), "native", cuda, torch.bfloat16, broken) == "torch"
    assert resolve_ops(EngineConfig(compile=True), "native", cuda, torch.bfloat16, imports) == "torch"
    assert (
        resolve_ops(EngineConfig(ops="flashinfer"), "transformers", cuda, torch.bfloat16, imports) == "none"
    )
    with pytest.raises(SettingError, match="bfloat16 or float16"):
        resolve_ops(EngineConfig(ops="flashinfer"), "native", cuda, torch.float32, imports)
    with pytest.raises(SettingError, match="cannot import flashinfer"):
        resolve_ops(EngineConfig(ops="flashinfer"), "native", cuda, torch.bfloat16, broken)


def test_transformers_layers_load_without_a_progress_bar(qwen3_causal, capfd):
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()  # earlier in-process CLI runs may have turned it off
    hf_logging.enable_progress_bar()  # as in a user's notebook
    try:
        _scorer(qwen3_causal, "causal", layers="transformers")
        assert "Loading weights" not in capfd.readouterr().err
        assert hf_logging.is_progress_bar_enabled()  # the user's setting is left as it was
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def _resaved(source, target, change):
    """A copy of a model directory whose model.safetensors went through change(tensors)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    change(tensors)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def test_tied_checkpoints_load_their_head_as_transformers_does(zoo, tmp_path):
    source = zoo.get("qwen3", "causal", tie_word_embeddings=True)
    cases = {
        # tie_word_embeddings with a different lm_head.weight saved: transformers keeps it untied
        "own-head": lambda t: t.__setitem__(
            "lm_head.weight", torch.randn_like(t["model.embed_tokens.weight"])
        ),
        # only the head saved: transformers ties the embeddings to it
        "head-only": lambda t: t.__setitem__("lm_head.weight", t.pop("model.embed_tokens.weight")),
    }
    for name, change in cases.items():
        model_dir = _resaved(source, tmp_path / name, change)
        scorer = _scorer(model_dir, "causal", layers="auto")
        assert scorer.setup.layers == "native"
        assert _worst_against_reference(model_dir, "causal", GROUPS[:2], scorer.score(GROUPS[:2])) <= EXACT, (
            name
        )


def test_a_single_file_beside_an_index_wins_as_in_transformers(zoo, tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = _resaved(zoo.get("qwen2", "causal"), tmp_path / "both", lambda t: None)
    stale = AutoModelForCausalLM.from_pretrained(zoo.get("qwen2", "causal"))
    with torch.no_grad():
        for parameter in stale.parameters():
            parameter.add_(1.0)  # other weights, which transformers never reads here
    stale.save_pretrained(tmp_path / "stale", max_shard_size="20KB")
    for shard in (tmp_path / "stale").glob("model*.safetensors*"):
        (model_dir / shard.name).write_bytes(shard.read_bytes())  # old shards and their index beside it
    assert (model_dir / "model.safetensors.index.json").exists()
    scorer = _scorer(model_dir, "causal")
    assert _worst_against_reference(model_dir, "causal", GROUPS[:2], scorer.score(GROUPS[:2])) <= EXACT


def test_flashinfer_ops_norm_q_and_k_heads_where_the_fused_projection_left_them(qwen3_causal, monkeypatch):
    """FlashInferOps (its kernels stood in for on the CPU: tests/flashinfer_stub.py) hand the q/k norms the
    [tokens, heads, head_dim] views of the QKV output, strided, never a copy; hidden states equal TorchOps' in bf16."""
    from score_batch.engine.attention.sdpa import SdpaBackend
    from score_batch.engine.native.load import load_native
    from score_batch.engine.plan.batching import collate
    from score_batch.engine.plan.packing import ItemRef, mis_pack
    from tests.flashinfer_stub import FlashInferStub

    stub = FlashInferStub().install(monkeypatch)
    cpu = torch.device("cpu")
    batch = collate(
        [mis_pack(list(range(5, 17)), [[20, 21, 22], [23], [24, 25]], [ItemRef(0, i) for i in range(3)], 3)]
    )
    hidden = {}
    for ops in ("torch", "flashinfer"):
        backbone, _, spec = load_native(
            qwen3_causal, native_parts(qwen3_causal), "causal", 0, torch.bfloat16, cpu, ops, False
        )
        with torch.inference_mode():
            hidden[ops] = backbone(
                torch.from_numpy(batch.token_ids),
                torch.from_numpy(batch.positions),
                int(batch.positions.max()),
                SdpaBackend(cpu).plan(batch, cpu),
                torch.from_numpy(batch.score_rows),
            ).float()  # [items, hidden]
    width = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim  # a row of the fused QKV output
    heads = [(shape[1:], strides) for _, shape, strides in stub.norm_inputs if len(shape) == 3]
    assert len(heads) == 2 * spec.num_layers  # q and k of every layer, each as one strided view
    assert set(heads) == {
        ((spec.num_heads, spec.head_dim), (width, spec.head_dim, 1)),
        ((spec.num_kv_heads, spec.head_dim), (width, spec.head_dim, 1)),
    }
    torch.testing.assert_close(hidden["flashinfer"], hidden["torch"], rtol=3e-2, atol=3e-2)


def native_parts(model_dir):
    """The safetensors files of a model directory, as load_native takes them."""
    from score_batch.engine.model.source import weight_files

    return weight_files(model_dir)[1]
