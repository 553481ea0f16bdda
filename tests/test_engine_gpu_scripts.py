"""The CPU-checkable parts of the GPU run: scripts parse, the wheel list, the skip helper, bench/gpu.py on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.need import REQUIRE_GPU, need_gpu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu  # noqa: E402  (bench/gpu.py, imported as the script imports its neighbours)


@pytest.mark.parametrize("script", ["bench/gpu_check.sh", "scripts/download_gpu_wheels.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / script)], check=True)


def test_gpu_check_needs_a_phase():
    result = subprocess.run(["bash", str(ROOT / "bench/gpu_check.sh")], capture_output=True, text=True)
    assert result.returncode == 2 and "install|tests|bench" in result.stderr


def test_missing_gpu_skips_or_fails_on_request(monkeypatch):
    monkeypatch.delenv(REQUIRE_GPU, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no_such_module_xyz is not importable"):
        need_gpu("no_such_module_xyz")
    monkeypatch.setenv(REQUIRE_GPU, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_GPU}=1 but"):
        need_gpu("no_such_module_xyz")


def test_bench_figures_helpers():
    args = gpu.parse_args(["bench"])
    assert args.preset == "qwen3-0.6b" and args.methods == [
        "hf",
        "flashinfer",
        "flashinfer+compile",
        "flex",
        "flex+compile",
        "sdpa",
    ]
    assert args.out == ROOT / "bench/results/gpu.json"
    preset = gpu.PRESETS["qwen3-0.6b"]
    assert 0.8e9 < gpu.flops_per_token(preset) < 1.0e9  # ≈ 2 × 0.44 B non-embedding weights
    assert gpu.parse_args(["bench", "--methods", "split", "hf"]).methods == [
        "hf",
        "split",
    ]  # the reference first


def test_bench_runs_on_cpu_and_matches_hf(tmp_path):
    out = tmp_path / "gpu.json"
    argv = ["bench", "--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--workloads", "b"]
    gpu.main([*argv, "--queries", "1", "--methods", "hf", "split", "--out", str(out)])
    report = json.loads(out.read_text())
    rows = report["workloads"]["b"]["methods"]
    assert set(rows) == {"hf_pairs", "split"}
    assert rows["split"]["max_abs_diff_vs_hf"] <= 1e-4
    assert rows["split"]["tokens_run"] < rows["split"]["pairwise_tokens"]
    assert rows["hf_pairs"]["speedup_vs_hf"] == 1.0 and rows["split"]["items_per_s"] > 0
