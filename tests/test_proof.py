"""FlashInfer proven at load (engine/model/proof.py), on the CPU against a stub package with FlashInfer's contracts
(tests/flashinfer_stub.py): correct kernels pass; a JIT build that fails and a wrong kernel make auto fall back
with one warning naming the cause, recorded in the setup and the run report; an explicit flashinfer exits 2."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from score_batch.engine import EngineConfig, ScoringConfig, SettingError
from score_batch.engine.attention.flashinfer import FlashInferBackend
from score_batch.engine.model.proof import prove_attention, prove_ops
from score_batch.engine.model.setup import load_planner, prove_setup
from score_batch.errors import exit_code
from tests.flashinfer_stub import NO_NVCC, FlashInferStub
from tests.test_cli import LABEL_FLAGS, ROWS, run_cli, write_jsonl

CPU = torch.device("cpu")
LABELS = ScoringConfig(label_tokens=(" to", " the"))


@pytest.fixture
def stub(monkeypatch) -> FlashInferStub:
    return FlashInferStub().install(monkeypatch)


def _no_nvcc(module: str) -> None:
    raise RuntimeError(NO_NVCC)


def _cuda_like_setup(model_dir):
    """The tiny model's setup as CUDA would resolve it (FlashInfer ops and attention, bf16), on the CPU."""
    _, setup = load_planner(
        model_dir, EngineConfig(device="cpu", dtype="bfloat16", backend="sdpa", scoring=LABELS)
    )
    return dataclasses.replace(setup, ops="flashinfer", backend="flashinfer")


def test_correct_kernels_pass_and_every_module_runs(stub):
    assert prove_ops("flashinfer", CPU, torch.bfloat16, hidden_size=64, head_dim=32) is None
    assert prove_attention("flashinfer", CPU, torch.bfloat16, head_dim=32) is None
    assert {"norm", "rope", "activation", "batch_prefill"} <= set(stub.built)
    # q/k norm reads the heads of the fused QKV output through their strides: no copy is made for the kernel
    # (the q norm alone, then the q/k norms + RoPE in place: q's heads and k's head)
    heads = [(shape, strides) for _, shape, strides in stub.norm_inputs if len(shape) == 3]
    row = (2 + 2 * 1) * 32
    assert heads == [((5, 2, 32), (row, 32, 1)), ((5, 2, 32), (row, 32, 1)), ((5, 1, 32), (row, 32, 1))]


def test_a_cpu_setup_runs_no_kernel(stub, qwen3_causal):
    _, setup = load_planner(qwen3_causal, EngineConfig(device="cpu", scoring=LABELS))
    assert (setup.ops, setup.backend) == ("torch", "split")
    assert prove_setup(setup, EngineConfig(device="cpu")) is setup and stub.built == []


def test_a_jit_build_that_fails_makes_auto_fall_back_with_one_warning_each(stub, qwen3_causal, caplog):
    stub.build = _no_nvcc
    with caplog.at_level(logging.WARNING, logger="score_batch.engine.model.proof"):
        proven = prove_setup(_cuda_like_setup(qwen3_causal), EngineConfig(device="cpu", dtype="bfloat16"))
    assert (proven.ops, proven.backend) == ("torch", "flex")  # flex runs this workload: auto's next choice
    ops, backend = proven.fallbacks
    assert ops.startswith("ops flashinfer → torch: rms_norm: RuntimeError: Ninja build failed")
    assert backend.startswith("backend flashinfer → flex: flashinfer attention: RuntimeError: Ninja build")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all("Could not find nvcc" in w for w in warnings)
    assert warnings[0].startswith("ops=auto: flashinfer failed its check") and warnings[0].endswith(
        "using torch"
    )
    assert warnings[1].startswith("backend=auto: flashinfer failed") and warnings[1].endswith("using flex")


@pytest.mark.parametrize(
    ("wrong", "field", "cause"),
    [
        ("rmsnorm", "ops", "rms_norm of q/k heads differs from torch's by up to"),
        ("silu_and_mul", "ops", "silu_mul differs from torch's by up to"),
        ("prefill", "backend", "flashinfer attention differs from float32 sdpa's by up to"),
    ],
)
def test_a_wrong_kernel_makes_auto_fall_back(stub, qwen3_causal, wrong, field, cause):
    stub.wrong = {wrong}
    proven = prove_setup(_cuda_like_setup(qwen3_causal), EngineConfig(device="cpu", dtype="bfloat16"))
    assert (proven.ops, proven.backend) == (
        ("torch", "flashinfer") if field == "ops" else ("flashinfer", "flex")
    )
    (fallback,) = proven.fallbacks
    assert fallback.startswith(field) and cause in fallback and "in bfloat16" in fallback


def test_flex_unavailable_falls_back_to_sdpa(stub, qwen3_causal, monkeypatch):
    from score_batch.engine.attention import flex

    stub.wrong = {"prefill"}
    capabilities = dataclasses.replace(flex.FlexBackend.capabilities, devices=frozenset({"cuda"}))
    monkeypatch.setattr(flex.FlexBackend, "capabilities", capabilities)
    proven = prove_setup(_cuda_like_setup(qwen3_causal), EngineConfig(device="cpu", dtype="bfloat16"))
    assert proven.backend == "sdpa" and proven.fallbacks[0].startswith("backend flashinfer → sdpa: ")


@pytest.mark.parametrize("field", ["ops", "backend"])
def test_an_explicit_flashinfer_fails_the_load_with_the_cause(stub, qwen3_causal, field):
    stub.build = _no_nvcc
    explicit = {"ops": "torch", "backend": "sdpa", field: "flashinfer"}
    config = EngineConfig(device="cpu", dtype="bfloat16", **explicit)
    setup = dataclasses.replace(_cuda_like_setup(qwen3_causal), **explicit)
    with pytest.raises(
        SettingError, match=f"EngineConfig.{field}='flashinfer' failed its check on cpu"
    ) as error:
        prove_setup(setup, config)
    assert "Could not find nvcc" in str(error.value) and exit_code(error.value) == 2


def test_the_cli_reports_the_fallback_and_exits_2_when_flashinfer_was_asked_for(
    stub, qwen3_causal, tmp_path, monkeypatch
):
    """auto resolves to FlashInfer attention (its capabilities opened to the CPU here), whose build fails: the run
    goes on with flex, scores (and keys its scores) as an explicit flex run, and the report names the cause; --backend flashinfer exits 2."""
    capabilities = dataclasses.replace(
        FlashInferBackend.capabilities,
        devices=frozenset({"cpu"}),
        auto_devices=frozenset({"cpu"}),
        head_dims=None,
    )
    monkeypatch.setattr(FlashInferBackend, "capabilities", capabilities)
    stub.build = _no_nvcc
    data = write_jsonl(tmp_path / "in.jsonl", ROWS)
    common = [
        "--model",
        qwen3_causal,
        "--device",
        "cpu",
        "--dtype",
        "bfloat16",
        "--ops",
        "torch",
        *LABEL_FLAGS,
    ]
    scores, keys = {}, {}
    for backend in ("auto", "flex"):
        out, report = tmp_path / f"{backend}.parquet", tmp_path / f"{backend}.json"
        ran = run_cli(data, "-o", out, "--report", report, "--backend", backend, *common)
        assert ran.returncode == 0, ran.stderr
        scores[backend] = np.stack(pq.read_table(out).column("scores").to_pylist())
        keys[backend] = pq.read_table(out).column("score_key").to_pylist()
        figures = json.loads(report.read_text())
        assert figures["backend"] == "flex"
        if backend == "auto":
            (fallback,) = figures["fallbacks"]
            assert fallback.startswith("backend flashinfer → flex: ") and "Could not find nvcc" in fallback
        else:
            assert figures["fallbacks"] == []
    assert np.array_equal(scores["auto"], scores["flex"])
    assert (
        keys["auto"] == keys["flex"]
    )  # the score identity is the proven setup's: --reuse matches across them
    ran = run_cli(data, "-o", tmp_path / "explicit.parquet", "--backend", "flashinfer", *common)
    assert ran.returncode == 2 and "Could not find nvcc" in ran.stderr and "--backend" in ran.stderr


@pytest.mark.parametrize("compiler", [False, True], ids=["no-nvcc", "nvcc"])
def test_auto_without_a_compiler_proves_with_flashinfers_jit_disabled(
    stub, qwen3_causal, monkeypatch, tmp_path, compiler
):
    """--ops/--backend auto with no nvcc FlashInfer would find: FLASHINFER_DISABLE_JIT=1 for the proof (a module
    not prebuilt fails at once, as FlashInfer's MissingJITCacheError), the fallback says so, the variable is
    restored; with a compiler (or an explicit setting) the proof runs as before."""
    import os

    home = tmp_path / "cuda"  # CUDA_HOME: where FlashInfer looks for bin/nvcc first
    (home / "bin").mkdir(parents=True)
    if compiler:
        (home / "bin" / "nvcc").write_text("#!/bin/sh\n")
        (home / "bin" / "nvcc").chmod(0o755)
    for name in ("FLASHINFER_NVCC", "CUDA_PATH", "FLASHINFER_DISABLE_JIT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_HOME", str(home))
    seen = []

    def build(module):
        seen.append(os.environ.get("FLASHINFER_DISABLE_JIT"))
        if os.environ.get("FLASHINFER_DISABLE_JIT"):
            raise RuntimeError("JIT compilation is disabled via FLASHINFER_DISABLE_JIT environment variable")

    stub.build = build
    proven = prove_setup(_cuda_like_setup(qwen3_causal), EngineConfig(device="cpu", dtype="bfloat16"))
    assert "FLASHINFER_DISABLE_JIT" not in os.environ  # restored after the proof
    if compiler:
        assert set(seen) == {None} and proven.fallbacks == ()
        return
    assert set(seen) == {"1"} and (proven.ops, proven.backend) == ("torch", "flex")
    assert all("JIT compilation is disabled" in f and "no nvcc here" in f for f in proven.fallbacks)
