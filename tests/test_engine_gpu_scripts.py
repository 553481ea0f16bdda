"""The CPU-checkable parts of the GPU run: scripts parse, the wheel list, the skip helper, bench/gpu.py on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import process_state
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
    assert args.preset == "qwen3-0.6b" and args.methods == gpu.DEFAULT_METHODS
    assert gpu.SHORT_METHODS == [
        "hf",
        "fi-hf-layers",
        "fi-native-torch",
        "fi-native-fi",
        "pipeline",
        "fa3",  # last: it waits for FA3's background build
    ]
    script = (ROOT / "bench" / "gpu_check.sh").read_text()
    assert f"--methods {' '.join(gpu.SHORT_METHODS)})" in script  # gpu_check.sh all's bench
    methods = gpu.METHODS
    assert all(methods[m].backend == "flashinfer" for m in gpu.SHORT_METHODS[1:] if m != "pipeline")
    assert "fi-native-compile" not in gpu.SHORT_METHODS and "fi-native-compile" in gpu.DEFAULT_METHODS
    assert (methods["fi-hf-layers"].layers, methods["fi-native-torch"].ops) == ("transformers", "torch")
    assert (methods["fi-native-fi"].layers, methods["fi-native-fi"].ops) == ("native", "flashinfer")
    compiled = methods["fi-native-compile"]
    assert compiled.compile and (compiled.layers, compiled.ops) == ("native", "torch")
    assert methods["fa3"].kernel == "fa3" and {m.kernel for n, m in methods.items() if n != "fa3"} == {"fa2"}
    assert args.out == ROOT / "bench/results/gpu.json"
    preset = gpu.PRESETS["qwen3-0.6b"]
    assert 0.8e9 < gpu.flops_per_token(preset) < 1.0e9  # ≈ 2 × 0.44 B non-embedding weights
    assert gpu.parse_args(["bench", "--methods", "split", "hf"]).methods == [
        "hf",
        "split",
    ]  # the reference first


def test_bench_runs_on_cpu_and_matches_hf_and_fp32(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    argv = ["bench", "--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--workloads", "b"]
    # flashinfer methods are refused on the CPU: recorded, not failed, and the others still run.
    methods = ["hf", "fi-native-fi", "split", "fa3", "pipeline"]
    queries = ["--queries", "1", "--pipeline-queries", "2"]
    with process_state.kept():  # its pipeline method runs the command in this process (gc, signals, logging)
        assert gpu.main([*argv, *queries, "--methods", *methods, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    workload = report["workloads"]["b"]
    rows = workload["methods"]
    assert list(rows) == ["hf_pairs", "fi-native-fi", "split", "fa3", "pipeline"]
    assert "does not run on cpu" in rows["fi-native-fi"]["refused"] and "refused" in rows["fa3"]
    split = rows["split"]
    assert split["max_abs_diff_vs_hf"] <= 1e-4 and split["max_abs_diff_vs_fp32"] <= 1e-4
    assert rows["hf_pairs"]["max_abs_diff_vs_fp32"] <= 1e-4
    assert workload["fp32_reference"]["items"] == gpu.REFERENCE_ITEMS // 2  # one group: its first items
    assert "scores" not in workload["fp32_reference"] and "scores" not in split
    assert split["tokens_run"] < split["pairwise_tokens"]
    # MFU on the tokens run: delimiters run through every layer and count; useful tokens leave them out.
    assert split["useful_tokens"] + split["delimiter_tokens"] == split["tokens_run"]
    assert (
        split["delimiter_tokens"] == 50 + 1
    )  # one query, 50 items: a delimiter after the query and each item
    assert "delimiters" in report["mfu_basis"] and "two label tokens" in report["scores"]
    assert rows["hf_pairs"]["speedup_vs_hf"] == 1.0 and split["items_per_s"] > 0
    # the pipeline: the CLI from text rows, two queries of workload b's shape, the settings auto resolves
    pipeline = rows["pipeline"]
    assert pipeline["queries"] == 2 and pipeline["useful_tokens"] < pipeline["tokens_run"]
    assert pipeline["resolved"]["backend"] == "split" and pipeline["resolved"]["fallbacks"] == []
    assert len(pipeline["seconds_after_load_runs"]) == gpu.REPEATS
    assert pipeline["items_per_s"] == pytest.approx(100 / min(pipeline["seconds_after_load_runs"]), rel=0.01)
    assert pipeline["forward_items_per_s"] > 0 and pipeline["planning_items_per_s"] > 0
    text = capsys.readouterr().out
    assert "MFU basis: " in text and "fi-native-fi       refused: " in text
    assert "2 queries; forward alone " in text
