"""The CPU-checkable parts of the GPU run: scripts parse, the wheel list, the skip helper, bench/gpu.py on CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import process_state
from tests.gpu.need import REQUIRE_GPU, need_gpu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu  # noqa: E402  (bench/gpu.py, imported as the script imports its neighbours)

from tests.test_gpu_install import SCRIPT, _run, _stub_env  # noqa: E402


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
        "xlmr",  # an encoder cross-encoder, its own workload (while FA3 builds)
        "fa3",  # last: it waits for FA3's background build
    ]
    script = (ROOT / "bench" / "gpu_check.sh").read_text()
    assert f"--methods {' '.join(gpu.SHORT_METHODS)})" in script  # gpu_check.sh all's bench
    methods = gpu.METHODS
    assert all(
        methods[m].backend == "flashinfer" for m in gpu.SHORT_METHODS[1:] if m not in ("pipeline", "xlmr")
    )
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
    methods = ["hf", "fi-native-fi", "split", "fa3", "pipeline", "xlmr"]
    queries = ["--queries", "1", "--pipeline-queries", "2", "--encoder-queries", "1"]
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
    # the encoder row: an XLM-R classifier on 30 + 300-token pairs, its own workload, against plain HF pairs
    encoder = report["workloads"]["xlmr"]
    assert encoder["items"] == 32 and encoder["shape"]["item_tokens"] == 300
    xlmr, hf = encoder["methods"]["xlmr"], encoder["methods"]["hf_pairs"]
    assert xlmr["resolved"]["runner"] == "PairRunner" and xlmr["max_abs_diff_vs_hf"] <= 1e-4
    assert 0 <= xlmr["padding_share"] < 0.2 and xlmr["useful_tokens"] == hf["useful_tokens"]
    assert xlmr["padding_tokens"] == xlmr["tokens_run"] - xlmr["useful_tokens"] and xlmr["pairs_per_s"] > 0
    text = capsys.readouterr().out
    assert "of the " in text and "tokens run are padding" in text
    assert "MFU basis: " in text and "fi-native-fi       refused: " in text
    assert "2 queries; forward alone " in text


def _event(name, ts, dur, cat="kernel", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}


def test_profile_table_by_hand():
    import profile_table

    events = [
        _event("nvjet_tst_gemm", 0, 10),
        _event("BatchPrefillWithPagedKVCacheKernel", 5, 10),  # overlaps the GEMM: busy 0..15
        _event("nvjet_tst_gemm", 20, 10),  # a 5 µs gap before it
        _event("Memcpy HtoD", 30, 5, cat="gpu_memcpy"),
        _event("aten::linear", 0, 300, cat="cpu_op"),
        _event("aten::mm", 10, 250, cat="cpu_op"),  # inside aten::linear
        _event("cudaStreamSynchronize", 400, 201, cat="cuda_runtime"),
        _event("aten::add", 700, 199, cat="cpu_op"),  # under the threshold
    ]
    table = profile_table.kernel_table(events, wall_us=50)
    assert table["launches"] == 4 and table["kernel_us"] == 35 and table["busy_us"] == 30
    assert table["span_us"] == 35 and table["idle_share_of_span"] == round(1 - 30 / 35, 4)
    assert table["busy_share_of_wall"] == 0.6
    first = table["kernels"][0]
    assert (first["name"], first["count"], first["total_us"], first["mean_us"]) == (
        "nvjet_tst_gemm",
        2,
        20,
        10,
    )
    assert first["share"] == round(20 / 35, 4) and first["class"] == "gemm"
    assert list(table["classes"]) == ["gemm", "attention", "copy"]
    calls = profile_table.host_calls(events)
    assert [(c["name"], c["top_level"]) for c in calls] == [
        ("aten::linear", True),
        ("aten::mm", False),
        ("cudaStreamSynchronize", True),
    ]
    assert profile_table.kernel_class("_qk_norm_rope") == "qk_norm_rope"
    assert profile_table.kernel_class("RMSNormKernel") == "norm"
    assert any(
        "idle share 0.143" in line
        for line in profile_table.format_table({**table, "host_calls_over_200us": calls})
    )


def test_profile_table_agrees_with_the_profilers_own_counts(tmp_path):
    """On a CPU trace (torch ops standing in for kernels) the table's counts and totals per name are the
    profiler's own key_averages."""
    import profile_table
    from torch.profiler import ProfilerActivity, profile, record_function

    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.SiLU(), torch.nn.Linear(128, 8))
    x = torch.randn(256, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("forward"):
            for _ in range(3):
                model(x).softmax(-1)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = json.loads((tmp_path / "trace.json").read_text())
    table = profile_table.profile_summary(trace, "forward", categories=("cpu_op",))
    ours = {row["name"]: row for row in table["kernels"]}
    theirs = {e.key: e for e in prof.key_averages()}
    assert ours["aten::linear"]["count"] == 6 and ours["aten::softmax"]["count"] == 3
    for name, row in ours.items():
        assert row["count"] == theirs[name].count, name
        assert row["total_us"] == pytest.approx(theirs[name].cpu_time_total, rel=0.01, abs=1.0), name
    assert table["wall_us"] > 0 and 0 < table["busy_share_of_wall"] <= 1.0
    top = profile_table.kernel_table(profile_table.trace_events(trace), ("cpu_op",), nested=False)
    assert "aten::addmm" not in {row["name"] for row in top["kernels"]}  # inside aten::linear


def test_profile_parses_its_arguments_and_plans_the_goal_shape(capsys, tmp_path):
    import gpu_profile

    args = gpu_profile.parse_args(["--out-dir", str(tmp_path)])
    assert list(args.steps) == ["profile", "attention", "gemm", "sweep", "cli", "graph"]
    assert (args.query_tokens, args.items, args.item_tokens, args.preset, args.dtype) == (
        1500,
        100,
        40,
        "qwen3-0.6b",
        "bfloat16",
    )
    assert args.profile_packs == [4, 11] and args.sweep_packs == list(range(1, 17))
    assert args.window_rows == [2048, 8192] and args.cli_queries == 64 and not args.fa3
    assert gpu_profile.main(["--out-dir", str(tmp_path), "--dry-run"]) == 0
    assert "about 130 s on an H200" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_profile_runs_every_step_on_cpu(tmp_path):
    """Every step of gpu_profile.py on a tiny CPU model (the torch ops as its kernels, sdpa as its attention):
    each one recorded, none failed, the trace kept."""
    import gpu_profile

    small = ["--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--query-tokens", "30", "--items", "4",
             "--item-tokens", "6", "--profile-packs", "2", "--attention-packs", "2", "--gemm-packs", "2",
             "--sweep-packs", "1", "2", "--graph-packs", "1", "--window-rows", "8", "--cli-queries", "2",
             "--repeats", "2", "--kernel-repeats", "2"]  # fmt: skip
    with process_state.kept():  # its cli step runs the command in this process (gc, signals, logging)
        assert gpu_profile.main(["--out-dir", str(tmp_path), *small]) == 0
    report = json.loads((tmp_path / "profile.json").read_text())
    steps = report["steps"]
    assert list(steps) == ["setup", "profile", "attention", "gemm", "sweep", "cli", "graph"]
    assert all("error" not in step and "seconds" in step for step in steps.values())
    assert steps["setup"]["resolved"]["backend"] == "split"
    table = steps["profile"]["2"]
    assert table["forward"]["packs"] == 2 and table["launches"] > 0 and table["kernels"][0]["share"] > 0
    assert steps["attention"]["sdpa/2"]["packs"] == 2 and steps["attention"]["sdpa/2"]["ms"] > 0
    gemm = steps["gemm"]["gemms"]
    assert list(gemm) == ["qkv", "o", "gate_up", "down"]
    assert gemm["qkv"]["n"] == (4 + 2 * 2) * 32 and gemm["down"]["k"] == 256  # the tiny preset's widths
    assert [steps["sweep"][k]["packs"] for k in ("1", "2")] == [1, 2] and "partial" not in steps["sweep"]
    assert steps["graph"]["1"]["graph_refused"] == "CUDA graphs need a CUDA device"
    cli = steps["cli"]
    assert cli["window_rows=8"]["items"] == 8 and cli["window_rows=8"]["of_forward"] > 0
    assert (tmp_path / "trace-2.json.gz").stat().st_size > 0
    text = (tmp_path / "profile.txt").read_text()
    assert all(f"== {name} (" in text for name in steps)


def test_the_bf16_judge_passes_a_right_path_and_catches_a_planted_error(tmp_path):
    """tests/gpu/numerics.py on the CPU: native layers in bf16 score within its bound of plain HF bf16's own error
    on a trained-scale model (N(0, 0.02)); the same scores shifted by 0.05, or one query's items reversed, fail."""
    import numpy as np
    import torch

    from score_batch.engine import EngineConfig, Scorer, ScoringConfig
    from tests.gpu.common import LABELS, token_groups
    from tests.gpu.numerics import as_good_as_hf_bf16, hf_scores, judge, spearman, trained_like_model
    from tests.reference import tokenizer

    shape = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model_dir = trained_like_model(tmp_path, **shape)
    groups = token_groups(9, groups=2, query=(40, 80), items=6, item=(1, 30))
    tok = tokenizer(str(model_dir))
    labels = [tok.encode(t, add_special_tokens=False)[0] for t in LABELS]
    fp32, bf16 = (
        hf_scores(model_dir, groups, labels, dtype, "cpu") for dtype in (torch.float32, torch.bfloat16)
    )
    scoring = ScoringConfig(label_tokens=LABELS, apply_softmax=True)
    config = EngineConfig(device="cpu", dtype="bfloat16", backend="split", layers="native", scoring=scoring)
    got = [r.scores for r in Scorer.from_pretrained(model_dir, config).score(groups)]
    verdict = judge(got, fp32, bf16)
    assert as_good_as_hf_bf16(verdict), verdict
    assert verdict["hf_bf16_error"] < 0.02  # trained-scale weights: plain HF's own bf16 error is small
    assert not as_good_as_hf_bf16(judge([g + np.array([0.05, -0.05]) for g in got], fp32, bf16))
    reversed_ = [got[0][::-1].copy(), got[1]]  # one query's items scored in reverse order
    assert not as_good_as_hf_bf16(judge(reversed_, fp32, bf16))
    assert (
        spearman(np.arange(5.0), np.arange(5.0)) == 1.0 and spearman(np.arange(5.0), -np.arange(5.0)) == -1.0
    )


# gpu_check.sh profile, as tests/test_gpu_install.py checks all: its dry run, then its phases against stub commands


def test_profile_installs_then_profiles_under_its_own_limit_then_collects(tmp_path):
    out = tmp_path / "out"
    result = _run("--dry-run", "profile", "--steps", "profile", env={**os.environ, "OUT": str(out)})
    assert result.returncode == 0, result.stderr
    text = "\n".join(line[2:] for line in result.stdout.splitlines() if line.startswith("+ "))
    order = [
        "phase install: estimate 160 s, limit 235 s",
        f"python bench/gpu.py warmup --out {ROOT / '.cache' / 'gpu' / 'warmup.json'} \n",  # no --after-build
        "phase profile: estimate 150 s, limit 300 s",
        f"timeout -s INT --kill-after=5 300 bash {SCRIPT} profile-run --steps profile",
        "tar -tzf $JIT_MODULES | grep -q _sm90/ && FA3 too (--fa3)",
        f"python bench/gpu_profile.py --out-dir {out} --steps profile",
        "phase collect: estimate 10 s, limit 30 s",
        f"tar -czf {out / 'jit-modules.tar.gz'}",
    ]
    positions = [(text + "\n").find(step) for step in order]
    assert -1 not in positions, [s for s, p in zip(order, positions) if p == -1]
    assert positions == sorted(positions)
    assert "setsid nice -n 19" not in text  # no FA3 build beside the profile's host measurements
    script = SCRIPT.read_text()
    limits = {k: int(v) for k, v in re.findall(r"^(\w+_LIMIT)=\$\{\w+:-(\d+)\}", script, re.M)}
    kill_after = int(re.search(r"^KILL_AFTER=(\d+)", script, re.M).group(1))
    # each phase its own share alone (the profile at most 5 minutes after the install), within the device's 600 s
    assert limits["PROFILE_LIMIT"] <= 300
    assert limits["INSTALL_LIMIT"] + limits["PROFILE_LIMIT"] + limits["COLLECT_LIMIT"] + 3 * kill_after <= 585
    assert int(re.search(r"^PROFILE_ESTIMATE=(\d+)", script, re.M).group(1)) <= 0.7 * limits["PROFILE_LIMIT"]
    files = {"summary.txt", "install.log", "warmup.json", "profile.json", "profile.txt", "profile.log",
             "trace-4.json.gz", "jit-modules.tar.gz"}  # fmt: skip
    assert len(files) <= 8  # what the device returns
    assert not out.exists()


@pytest.mark.parametrize("fa3", [False, True], ids=["fa2-only", "fa3-carried"])
def test_the_profile_call_runs_install_profile_and_collect_and_takes_fa3_only_when_carried(tmp_path, fa3):
    import tarfile

    modules = tmp_path / "jit-modules.tar.gz"
    names = ["batch_prefill_x/batch_prefill_x.so"] + (
        ["batch_prefill_x_sm90/batch_prefill_x_sm90.so"] if fa3 else []
    )
    with tarfile.open(modules, "w:gz") as archive:
        for name in names:
            (tmp_path / "m").mkdir(exist_ok=True)
            (tmp_path / "m" / "so").write_bytes(b"\0")
            archive.add(tmp_path / "m" / "so", arcname=name)
    env, log, out = _stub_env(tmp_path, JIT_MODULES=str(modules))
    result = _run("profile", "--steps", "profile", "gemm", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["install", "profile", "collect"]
    assert [int(line.split("limit=")[1].split()[0]) for line in summary] == [
        235,
        300,
        30,
    ]  # each its own share
    calls = log.read_text().splitlines()
    profile = [c for c in calls if c.startswith("python bench/gpu_profile.py")]
    assert profile == [
        f"python bench/gpu_profile.py --out-dir {out}{' --fa3' if fa3 else ''} --steps profile gemm"
    ]
    warmup = next(c for c in calls if c.startswith("python bench/gpu.py warmup"))
    assert "--after-build" not in warmup  # no FA3 build beside the profile
    assert calls.index(warmup) < calls.index(profile[0])
