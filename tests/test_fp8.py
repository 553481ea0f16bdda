"""FP8 GEMMs' CPU emulation (engine/native/fp8.py): the scales (per output channel, per token), the float8 round
trip within e4m3's rounding, values float8 holds exactly multiplied exactly, every layer projection quantized and
nothing else (embeddings, norms, head), and a tiny model's ranking kept against its bf16 scores."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import torch
from scipy.stats import spearmanr

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig
from score_batch.engine.native.fp8 import FP8_MAX, Fp8Linear, quantize, quantize_linears

E4M3_STEP = 2.0**-4  # half an ulp relative to the value: 3 mantissa bits
LABELS = ScoringConfig(label_tokens=(" to", " the"), apply_softmax=True)


def test_a_row_scale_maps_its_largest_value_to_448_and_the_round_trip_stays_within_e4m3():
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 6)[:, None]
    q, scale = quantize(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (6, 1)
    assert torch.equal(scale[:, 0], x.abs().amax(dim=1) / FP8_MAX)
    back = q.float() * scale
    assert torch.equal(back.abs().amax(dim=1), x.abs().amax(dim=1))  # 448 is exact in e4m3
    subnormal = scale * 2.0**-9  # e4m3's smallest step, below its normal range
    assert ((back - x).abs() <= E4M3_STEP * x.abs() + subnormal).all()
    zero, zero_scale = quantize(torch.zeros(1, 8))
    assert torch.equal(zero.float() * zero_scale, torch.zeros(1, 8))


def test_values_float8_holds_multiply_exactly_and_others_within_a_few_percent():
    exact_w = torch.tensor([[448.0, -2.0, 0.5, 1.0], [448.0, 3.0, -0.25, 6.0]])  # scale 1: held exactly
    exact_x = torch.tensor([[1.0, 2.0, -4.0, 448.0]])  # float32 out: no output rounding
    linear = Fp8Linear(exact_w, torch.tensor([1.0, -1.0]), emulate=True)
    assert torch.equal(linear(exact_x).float(), exact_x.float() @ exact_w.T + torch.tensor([1.0, -1.0]))
    generator = torch.Generator().manual_seed(1)
    w, x = torch.randn(96, 128, generator=generator) * 0.02, torch.randn(3, 7, 128, generator=generator)
    y = Fp8Linear(w, None, emulate=True)(x)  # [3, 7, 96]
    want = x @ w.T
    assert y.shape == want.shape and y.dtype == x.dtype
    assert (y - want).norm() / want.norm() < 0.05


def test_every_layer_projection_is_quantized_and_nothing_else(qwen3_causal):
    scorer = Scorer.load(qwen3_causal, EngineConfig(device="cpu", dtype="bfloat16", scoring=LABELS))
    backbone, head = scorer.model.backbone, scorer.model.head
    layers = len(backbone.layers)
    embedding, head_weight = backbone.embed_tokens.weight.clone(), head.weight.clone()
    assert quantize_linears(backbone, emulate=True) == 4 * layers  # qkv, o, gate_up, down per layer
    assert sum(isinstance(m, Fp8Linear) for m in backbone.modules()) == 4 * layers
    assert torch.equal(backbone.embed_tokens.weight, embedding) and torch.equal(head.weight, head_weight)
    assert quantize_linears(backbone, emulate=True) == 0  # once


def test_a_tiny_model_keeps_its_ranking_under_fp8(qwen3_causal):
    rng = np.random.default_rng(0)
    words = [
        " to",
        " the",
        " flag",
        " of",
        " Japan",
        " city",
        " yes",
        " no",
        " country",
        " United",
        " States",
    ]
    groups = [
        Group("I pledge allegiance", ["".join(rng.choice(words, 3)) for _ in range(24)]) for _ in range(2)
    ]
    config = EngineConfig(device="cpu", dtype="bfloat16", scoring=LABELS)
    bf16 = [r.score for r in Scorer.load(qwen3_causal, config).score(groups)]
    fp8 = Scorer.load(qwen3_causal, config)
    quantize_linears(fp8.model.backbone, emulate=True)
    for got, want in zip((r.score for r in fp8.score(groups)), bf16):
        assert np.isfinite(got).all() and not np.array_equal(got, want)  # it ran, and changed the scores
        assert spearmanr(got, want).statistic > 0.9


def test_fp8_on_the_cpu_exits_2_unless_emulated_and_its_scores_are_never_bf16_ones(qwen3_causal, tmp_path):
    from tests.test_cli import LABEL_FLAGS, ROWS, run_cli, write_jsonl

    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    common = ["--model", qwen3_causal, "--device", "cpu", "--apply-softmax", *LABEL_FLAGS]
    ran = run_cli(data, "-o", tmp_path / "x.parquet", "--dtype", "fp8", *common)
    assert ran.returncode == 2 and "--dtype fp8 needs a GPU of compute capability 9.0" in ran.stderr
    assert "fp8-emulated" in ran.stderr and "Traceback" not in ran.stderr
    keys, reports = {}, {}
    for dtype in ("bfloat16", "fp8-emulated"):
        out, report = tmp_path / f"{dtype}.parquet", tmp_path / f"{dtype}.json"
        ran = run_cli(data, "-o", out, "--report", report, "--dtype", dtype, *common)
        assert ran.returncode == 0, ran.stderr
        keys[dtype] = set(pq.read_table(out).column("score_key").to_pylist())
        reports[dtype] = json.loads(report.read_text())
    assert not keys["bfloat16"] & keys["fp8-emulated"]  # an FP8 score is never reused as a bf16 one
    fp8 = reports["fp8-emulated"]
    assert fp8["dtype"] == "fp8-emulated" and fp8["settings"]["engine"]["dtype"] == "fp8-emulated"
    verify = fp8["verify"]  # on by default for FP8, against the bf16 weights
    assert verify["ok"] and verify["items"] >= 1 and verify["bound"] == 0.1 and "rank_agreement" in verify
    assert reports["bfloat16"]["verify"] is None
