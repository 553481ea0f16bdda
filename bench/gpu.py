"""GPU figures for bench/gpu_check.sh: versions, FlashInfer's JIT warm-up, and score-batch vs plain HF pairs.

    python bench/gpu.py versions --out FILE
    python bench/gpu.py warmup [--fa3] --out FILE
    python bench/gpu.py bench [--preset qwen3-0.6b|tiny] [--workloads a b] [--methods hf fi-native-fi pipeline ...]
                              [--device cuda] [--dtype bfloat16] [--out bench/results/gpu.json]

The warm-up builds each FlashInfer module with its own JitSpec.build(), all at once, where a load looks for it
(`warmup`: FA2's prefill and the native layers' three op modules; `warmup --fa3`: FA3's prefill alone), records
per module the build seconds and the ninja steps still dirty after it (0: a load compiles nothing), then scores
once per configuration: "fa2" (torch ops) and "fa2-native-fi" (FlashInfer ops) apart, or "fa3".

The bench model has random weights drawn as transformers initialises a model (N(0, 0.02), bench/common.py: the
scale of trained weights, under which plain HF's own bf16-vs-fp32 error is small enough to show a kernel's). Scores are the softmax over
the two label tokens (ScoringConfig.apply_softmax; the probabilities over the whole vocabulary are 1e-10..1e-4
on random weights and no difference of them could flag an error); every method's scores are compared with
plain HF in fp32 on a sample of items (`max_abs_diff_vs_fp32`, the observed bf16 error) and with plain HF
pairs in the bench dtype on all items (`max_abs_diff_vs_hf`).

Timing boundaries, the same for both sides: tokenization, HF's padded pair tensors and score-batch's plan
(tokenize, pack, batch) are built BEFORE the timer; the timer covers host token ids → device → forward →
scores back on the host. Every time is the best of 3 runs (the median beside it) after a warm-up run that includes FlashInfer's
JIT and torch.compile. The `pipeline` method times the whole CLI instead (text rows in, Parquet out, planning
included, start-up excluded) beside the forward alone of the same groups, so a host-bound run shows.
FLOPs and MFU: bench/flops.py (MFU on the tokens run: delimiters and padding go
through every layer and count; `mfu_dense_useful` leaves them out). The JSON report is rewritten after
every method, so a later failure keeps the earlier figures; a method whose settings this checkout refuses
(e.g. native layers not available) records the refusal and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

import numpy as np
import torch
from common import (
    LABELS,
    Shape,
    best_and_median,
    best_of,
    build_bench_model,
    hf_prepare,
    hf_run,
    max_abs_diff,
    median,
    text_workload,
)
from flops import MFU_BASIS, causal_pairs, dense_flops_per_token, figures, pack_pairs, peak_flops

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig
from score_batch.engine.errors import SettingError

PRESETS = {
    "qwen3-0.6b": dict(
        num_hidden_layers=28,
        hidden_size=1024,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    "tiny": dict(  # a CPU smoke run of the same code path
        num_hidden_layers=2,
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=None,
    ),
}
# a: the goal shape, one ≈5,601-token pack per query (1,500-token query, 100 items of 40 tokens).
WORKLOADS = {"a": Shape(16, 100, 1500, 40), "b": Shape(32, 50, 200, 30)}


@dataclass(frozen=True)
class Method:
    """One score-batch configuration: EngineConfig settings and the FlashInfer kernel."""

    backend: str
    layers: str = "auto"  # EngineConfig.layers: native | transformers | auto
    ops: str = "auto"  # EngineConfig.ops of the native layers: torch | flashinfer | auto
    compile: bool = False
    kernel: str = "fa2"  # FlashInferBackend(kernel=...): fa2 | fa3 (Hopper)
    what: str = ""


HF = "hf"  # plain HF over padded (query + item) pairs: the baseline, always run first when named
METHODS: dict[str, Method] = {
    "fi-hf-layers": Method(
        "flashinfer", layers="transformers", what="HF eager decoder layers, FlashInfer FA2"
    ),
    "fi-native-torch": Method(
        "flashinfer", layers="native", ops="torch", what="native layers + torch ops, FA2"
    ),
    "fi-native-fi": Method(
        "flashinfer", layers="native", ops="flashinfer", what="native layers + FlashInfer ops, FA2"
    ),
    "fi-native-compile": Method(
        "flashinfer", layers="native", ops="torch", compile=True, what="native layers compiled, FA2"
    ),
    "fa3": Method("flashinfer", kernel="fa3", what="layers and ops as auto resolves them, FlashInfer FA3"),
    "flashinfer": Method("flashinfer", what="layers and ops as auto resolves them, FA2"),
    "flashinfer+compile": Method("flashinfer", compile=True, what="auto layers compiled, FA2"),
    "flex": Method("flex"),
    "flex+compile": Method("flex", compile=True),
    "sdpa": Method("sdpa"),
    "split": Method("split"),
}
PIPELINE = "pipeline"  # the whole CLI after start-up, beside its forward alone (_pipeline_row)
XLMR = "xlmr"  # an XLM-R-large-shaped classifier on 30 + 300-token pairs, its own workload (encoder_bench.py)
# `gpu_check.sh all`'s bench: FA3 last (it waits for its background build); the compiled method, whose compile
# time is the least predictable, in a later call.
SHORT_METHODS = [HF, "fi-hf-layers", "fi-native-torch", "fi-native-fi", PIPELINE, XLMR, "fa3"]
DEFAULT_METHODS = [*SHORT_METHODS, "fi-native-compile", "flex", "flex+compile", "sdpa"]
NO_FA3 = "SCORE_BATCH_NO_FA3"  # set by gpu_check.sh while warmup-fa3.json proves no FA3 build and call (the reason)
# Set by gpu_check.sh's bench while FA3's background build runs: its status file (written when it ends), its
# warm-up record and the time (epoch seconds) until which the fa3 method waits for it. Not SCORE_BATCH_*: the
# pipeline method's CLI warns about every SCORE_BATCH_* variable it does not know.
FA3_STATUS, FA3_RECORD, FA3_DEADLINE = (
    "GPU_CHECK_FA3_STATUS",
    "GPU_CHECK_FA3_RECORD",
    "GPU_CHECK_FA3_DEADLINE",
)
REFERENCE_ITEMS = 16  # items scored by plain HF in fp32 for max_abs_diff_vs_fp32
REPEATS = 3
CLOCK = time.perf_counter  # the bench's one clock (tests put a fake one here)


def versions() -> dict:
    """Python, torch, CUDA, transformers and flashinfer versions, and the exact device name."""
    import transformers

    try:
        import flashinfer

        flashinfer_version = flashinfer.__version__
    except Exception as error:  # recorded, not hidden: the tests phase fails on it
        flashinfer_version = f"not importable: {type(error).__name__}: {error}"
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "flashinfer": flashinfer_version,
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
    }


def flops_per_token(cfg: dict) -> float:
    """Dense FLOPs per token (bench/flops.py); kept for older callers."""
    return dense_flops_per_token(cfg)


# --- warm-up: FlashInfer's JIT modules, each built once where its loads look for it ----------------------

# What each warm-up builds: `warmup` the FA2 prefill and the native layers' ops (bench/gpu_check.sh install);
# `warmup --fa3` FA3's prefill alone (started by the install in the background once FA2's modules are built).
JIT_BUILDS = {"fa2": ("fa2", "norm", "rope", "silu_and_mul"), "fa3": ("fa3",)}


def jit_specs(names, dtype: torch.dtype = torch.bfloat16, head_dim: int = 128) -> list:
    """FlashInfer 0.6.6 JitSpecs of what score-batch runs (the folders whose ninja state the warm-up checks): the
    paged prefill module (the arguments plan() asks for: int32 indptr, no RoPE, no window, no soft cap) and the
    native layers' kernels."""
    from flashinfer.jit import gen_act_and_mul_module
    from flashinfer.jit.attention.modules import gen_batch_prefill_module
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.rope import gen_rope_module

    make = {
        "norm": gen_norm_module,
        "rope": gen_rope_module,
        "silu_and_mul": lambda: gen_act_and_mul_module("silu"),
    }
    for kernel in ("fa2", "fa3"):
        make[kernel] = lambda kernel=kernel: gen_batch_prefill_module(
            kernel, dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False, False
        )
    return [make[name]() for name in names]


def jit_getters(names) -> dict:
    """FlashInfer's own module getters (bench/jit_getters.py): each builds and loads the module the
    engine's calls load, the prefill with the arguments the installed plan() derives."""
    from jit_getters import module_getters

    return module_getters(names, device="cuda" if torch.cuda.is_available() else "cpu")


def build_specs(specs: dict, getters: dict | None = None) -> dict[str, dict]:
    """Build every module at once, each in a thread: through its getter (FlashInfer's build_and_load: ninja in
    the module's own folder under the module's own lock, the folder and build log a later load runs ninja
    against, so that load finds nothing to do), else its JitSpec.build(). Per module: seconds, the error if any
    (its build.ninja then removed, so a retry writes it from the fixed environment), and the steps ninja still
    finds dirty."""
    getters = getters or {}
    with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
        futures = {name: pool.submit(_build_one, spec, getters.get(name)) for name, spec in specs.items()}
    return {name: future.result() for name, future in futures.items()}


def _build_one(spec, getter=None) -> dict:
    start = time.perf_counter()
    record: dict = {}
    try:
        getter() if getter is not None else spec.build(verbose=False)
    except Exception as error:  # e.g. a header the image's CUDA lacks, a link: the text says which
        record["error"] = _short(error)
        if reset_failed_build(spec):
            record["reset"] = "build.ninja removed: a retry writes it from its own environment"
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["dirty_after"], why = dirty_steps(spec)
    if why:
        record["dirty_why"] = why
    return record


def reset_failed_build(spec) -> bool:
    """After a failed build: remove the module's build.ninja unless its library was built. FlashInfer 0.6.6 writes
    build.ninja only when it is missing, so a link that failed (CUDA_HOME, -lcuda) failed again after the
    environment was fixed; ninja's log still keeps every object whose command did not change."""
    ninja = Path(spec.ninja_path)
    if not ninja.exists() or (Path(spec.build_dir) / f"{Path(spec.build_dir).name}.so").exists():
        return False
    ninja.unlink()
    return True


def dirty_steps(spec) -> tuple[int | None, list[str]]:
    """(steps, first explanations) that `ninja -n -d explain` would still run in the module's own folder, as a
    load runs ninja there: 0 once the module is built where it is loaded (None when ninja cannot tell)."""
    where = Path(spec.build_dir).resolve()
    command = ["ninja", "-n", "-d", "explain", "-C", str(where), "-f", str(Path(spec.ninja_path).resolve())]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, [f"{type(error).__name__}: {error}"]
    if done.returncode != 0:
        return None, (done.stdout + done.stderr).strip().splitlines()[-3:]
    steps = sum(1 for line in done.stdout.splitlines() if re.match(r"\[\d+/\d+\]", line))
    explained = [line for line in done.stderr.splitlines() if line.startswith("ninja explain:")]
    return steps, explained[:3]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


# Warm-up calls per build: (name, EngineConfig layers/ops, kernel). Each kernel is called with torch ops first, so
# an ops failure is recorded against the ops ("fa2-native-fi"), not against FA2.
WARMUP_CALLS = {
    "fa2": (
        ("fa2", dict(layers="native", ops="torch"), "fa2"),
        ("fa2-native-fi", dict(layers="native", ops="flashinfer"), "fa2"),
    ),
    "fa3": (("fa3", dict(layers="native", ops="torch"), "fa3"),),
}


def warmup(out: Path, build: str = "fa2", after_build: str | None = None) -> dict:
    """Build one group of FlashInfer's JIT modules (JIT_BUILDS[build]) concurrently, then score once per call of
    WARMUP_CALLS[build], each recorded apart, into `out` (merged with what an earlier warm-up recorded there).

    The report is rewritten after every step; `ok_<build>` is False when the build's kernel (FA2, or FA3) failed
    to build or its call failed (the native ops failing are recorded, not fatal: their methods and tests fail
    alone); `jit_wall_s` is the wall time of each build, its modules at once. after_build: a shell command
    started (not waited for) once the build ended, before the calls (gpu_check.sh: FA3's background build).
    """
    report: dict = json.loads(out.read_text()) if out.exists() else {}
    report.update(versions())
    jit, calls, walls = (report.setdefault(key, {}) for key in ("jit", "calls", "jit_wall_s"))
    names = JIT_BUILDS[build]

    def write() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")

    if build == "fa3" and not _hopper():
        jit["fa3"] = {"skipped": "FA3 builds for Hopper (sm90) only"}
        calls.pop("fa3", None)
        report["ok_fa3"] = False
        write()
        return report
    for name in names:  # a stale record of an earlier build says nothing about this one
        jit.pop(name, None)
    for name, _, _ in WARMUP_CALLS[build]:
        calls.pop(name, None)
    start = time.perf_counter()
    try:
        specs = dict(zip(names, jit_specs(names)))
        getters = jit_getters(names)
    except Exception as error:  # flashinfer's JIT package does not import: nothing can build
        jit.update({name: {"error": _short(error)} for name in names})
    else:
        jit.update(build_specs(specs, getters))
    walls[build] = round(time.perf_counter() - start, 1)
    write()
    if after_build:
        subprocess.Popen(after_build, shell=True, stdin=subprocess.DEVNULL)  # returns at once (it detaches)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_bench_model(
            Path(tmp),
            "causal",
            num_hidden_layers=1,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
        )
        groups = [Group(" the quick brown fox" * 20, [" jumps over", " the lazy dog" * 10])]
        for name, engine, kernel in WARMUP_CALLS[build]:
            try:
                scorer = _scorer(model_dir, Method("flashinfer", kernel=kernel, **engine), "cuda", "bfloat16")
                _, first = _timed_sync(scorer.score, groups)
                _, second = _timed_sync(scorer.score, groups)
                calls[name] = {"first_call_s": round(first, 2), "warm_call_s": round(second, 4)}
            except Exception as error:
                calls[name] = {"error": _short(error)}
            write()
    report[f"ok_{build}"] = "error" not in jit[build] and "error" not in calls[build]
    write()
    return report


def _short(error: Exception, limit: int = 4000) -> str:
    """An error's type and text, its end kept when long (ninja's output ends with the compiler's error)."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= limit else text[:500] + " … " + text[-(limit - 500) :]


def _timed_sync(fn, *args):
    """(result, seconds) with the device synchronized on both ends."""
    _sync()
    start = time.perf_counter()
    result = fn(*args)
    _sync()
    return result, time.perf_counter() - start


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def _free() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- bench ------------------------------------------------------------------------------------------------


def hf_attended_pairs(batches) -> tuple[int, int]:
    """(real tokens, attended pairs) of prepared plain-HF batches: each pair is one causal sequence."""
    lengths = [n for batch in batches for n in batch.lengths]
    return sum(lengths), sum(causal_pairs(n) for n in lengths)


def plan_attended_pairs(plan) -> int:
    """Attended pairs of a score-batch plan: its packs under the multi-item mask, or its padded pairs."""
    total = 0
    for batch in plan.batches:
        if hasattr(batch, "packs"):
            total += sum(
                pack_pairs(p.segments, p.prefix_len if getattr(p, "query_cached", False) else 0)
                for p in batch.packs
            )
        else:  # PairBatch: one causal sequence per row
            total += sum(causal_pairs(int(n)) for n in batch.attention_mask.sum(1))
    return total


def plan_delimiters(plan) -> int:
    """Delimiter tokens of a plan's packs: they run through every layer but score nothing."""
    return sum(int((p.segments == -2).sum()) for b in plan.batches if hasattr(b, "packs") for p in b.packs)


def run_workload(model_dir: Path, shape: Shape, args, cfg: dict, on_row=lambda rows: None) -> dict:
    """All methods on one workload: items/s, tokens/s, FLOPs, MFU, peak memory, max |diff| vs fp32 and HF.

    on_row(rows) is called after every method (the caller writes the report); a method that fails is
    recorded with its error (one whose settings are refused, with the refusal) and the others still run.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    groups = text_workload(tokenizer, shape)
    items = sum(len(g.items) for g in groups)
    label_ids = [tokenizer.encode(t, add_special_tokens=False)[0] for t in LABELS]
    peak, _ = peak_flops(versions()["device"])
    rows: dict = {}
    result = {"shape": shape.__dict__, "items": items, "methods": rows}
    try:
        result["fp32_reference"] = _fp32_reference(model_dir, tokenizer, groups, label_ids, args)
    except Exception as error:  # the methods still run; their fp32 column stays empty
        result["fp32_reference"] = {"error": _short(error), "traceback": traceback.format_exc()}
    fp32 = result["fp32_reference"].get("scores")
    reference = None
    for name in args.methods:
        row_name = "hf_pairs" if name == HF else name
        try:
            if name == HF:
                reference, rows[row_name] = _hf_row(
                    model_dir, tokenizer, groups, items, label_ids, args, cfg, peak
                )
            elif name == XLMR:  # its own workload (bench() runs it): not a row of this one
                continue
            elif name == PIPELINE:
                rows[row_name] = _pipeline_row(model_dir, tokenizer, shape, args, cfg, peak)
            else:
                rows[row_name] = _engine_row(model_dir, name, groups, items, reference, args, cfg, peak)
        except SettingError as refused:  # this checkout or device refuses the method's settings
            rows[row_name] = {"refused": str(refused)}
        except Exception as error:  # the report keeps it; bench() exits non-zero at the end
            rows[row_name] = {"error": _short(error), "traceback": traceback.format_exc()}
        _free()
        if fp32 is not None and rows[row_name].get("scores") is not None:
            rows[row_name]["max_abs_diff_vs_fp32"] = _sample_diff(rows[row_name]["scores"], fp32)
        rows[row_name].pop("scores", None)
        _speedups(rows)
        on_row({**result, "fp32_reference": _public(result["fp32_reference"])})
    result["fp32_reference"] = _public(result["fp32_reference"])
    return result


def _public(reference: dict) -> dict:
    """The fp32 reference's report entry (its scores stay in memory)."""
    return {k: v for k, v in reference.items() if k != "scores"}


def _fp32_reference(model_dir, tokenizer, groups, label_ids, args) -> dict:
    """Plain HF in fp32 on the first REFERENCE_ITEMS items (spread over the first groups), on args.device."""
    from transformers import AutoModelForCausalLM

    per_group = max(1, min(len(groups[0].items), REFERENCE_ITEMS // 2))
    sample = [Group(g.query, g.items[:per_group]) for g in groups[:2]]
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(args.device).eval()
    scores, _ = hf_run(
        model, hf_prepare(tokenizer, sample, 8), sample, "causal", label_ids, label_softmax=True
    )
    del model
    _free()
    return {
        "what": "plain HF in float32 (eager modules, its default attention), two-label softmax",
        "items": sum(len(g.items) for g in sample),
        "seconds": round(time.perf_counter() - start, 2),
        "scores": scores,
    }


def _sample_diff(scores: list[np.ndarray], fp32: list[np.ndarray]) -> float:
    """Largest |score − fp32 score| over the reference sample (the first items of the first groups)."""
    return max(float(np.abs(s[: len(r)] - r).max()) for s, r in zip(scores, fp32) if len(r))


def _hf_row(model_dir, tokenizer, groups, items, label_ids, args, cfg, peak):
    """(scores, row) of plain HF over padded pairs; the pair tensors are built before the timer."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype))
    model = model.to(args.device).eval()
    batches = hf_prepare(tokenizer, groups, args.hf_batch)  # untimed: tokenization and host tensors
    hf_run(model, batches[:1], groups, "causal", label_ids, label_softmax=True)  # warm-up
    _reset_peak()
    (reference, tokens_run), seconds, middle = best_and_median(
        REPEATS, _synced, hf_run, model, batches, groups, "causal", label_ids, True, clock=CLOCK
    )
    useful, pairs = hf_attended_pairs(batches)
    row = _figures(items, tokens_run, useful, pairs, seconds, cfg, peak, 0.0)
    row.update(_medians(items, middle))
    row.update(padding_tokens=int(tokens_run - useful), what="plain HF, padded (query + item) pairs")
    row["scores"] = reference
    del model
    return reference, row


def _scorer(model_dir, method: Method, device: str, dtype: str, max_batch_tokens=None) -> Scorer:
    """A scorer of the method's settings (two-label softmax); FA3 replaces the runner's FlashInfer backend."""
    engine = dict(layers=method.layers, ops=method.ops)  # EngineConfig.layers / .ops
    config = EngineConfig(
        device=device,
        dtype=dtype,
        backend=method.backend,
        max_batch_tokens=max_batch_tokens,
        compile=method.compile,
        scoring=ScoringConfig(label_tokens=LABELS, apply_softmax=True),
        **{k: v for k, v in engine.items() if v != "auto"},
    )
    scorer = Scorer.from_pretrained(model_dir, config)
    resolved = getattr(scorer.setup, "layers", None)
    if method.layers == "native" and resolved != "native":
        raise SettingError(
            "EngineConfig.layers", "native", f"is not in effect in this checkout (resolved: {resolved})"
        )
    if method.kernel != "fa2":
        from score_batch.engine.attention.flashinfer import FlashInferBackend

        if (
            os.environ.get(NO_FA3) and method.kernel == "fa3"
        ):  # gpu_check.sh: FA3 failed to build in the warm-up
            raise SettingError("FlashInferBackend.kernel", method.kernel, os.environ[NO_FA3])
        why = fa3_waited() if method.kernel == "fa3" and os.environ.get(FA3_STATUS) else None
        if why:
            raise SettingError("FlashInferBackend.kernel", method.kernel, why)

        try:
            backend = FlashInferBackend(torch.device(device), kernel=method.kernel)
        except ValueError as refused:
            raise SettingError("FlashInferBackend.kernel", method.kernel, str(refused)) from refused
        scorer._runner.backend = backend  # Scorer.backend is read-only; no user-facing setting on purpose
    return scorer


def fa3_waited(sleep=time.sleep, clock=time.time) -> str | None:
    """Wait for FA3's background build (FA3_STATUS) until FA3_DEADLINE; then why FA3 may not run, None when its
    build and first call succeeded (its record, FA3_RECORD, read by install_check.fa3_unproven)."""
    from install_check import fa3_unproven

    status = Path(os.environ[FA3_STATUS])
    deadline = float(os.environ.get(FA3_DEADLINE, "0"))
    while not status.exists() and clock() < deadline:
        sleep(2)
    if not status.exists():
        return "FA3's background build had not finished by this phase's deadline (it goes on: jit-modules.tar.gz of a later call)"
    record = Path(os.environ.get(FA3_RECORD, ""))
    return fa3_unproven(json.loads(record.read_text()) if record.is_file() else None)


def _engine_row(model_dir, name, groups, items, reference, args, cfg, peak):
    """One score-batch method's row; the plan (tokenize, pack, batch) is built before the timer."""
    method = METHODS[name]
    scorer = _scorer(model_dir, method, args.device, args.dtype, args.max_batch_tokens)
    plan = scorer.plan(groups)  # untimed: tokenization and packing
    scorer.run(plan)  # warm-up: JIT, compilation, allocator
    _reset_peak()
    results, seconds, middle = best_and_median(REPEATS, _synced, scorer.run, plan, clock=CLOCK)
    diff = None if reference is None else max_abs_diff(results, reference)
    tokens = plan.stats.packed_tokens
    delimiters = plan_delimiters(plan)
    row = _figures(items, tokens, tokens - delimiters, plan_attended_pairs(plan), seconds, cfg, peak, diff)
    row.update(_medians(items, middle))
    setup = scorer.setup
    row.update(
        delimiter_tokens=delimiters,
        pairwise_tokens=plan.stats.pairwise_tokens,
        what=method.what or f"{method.backend} attention",
        resolved={
            "backend": setup.backend,
            "layers": getattr(setup, "layers", None),
            "ops": getattr(setup, "ops", None),
            "kernel": method.kernel if setup.backend == "flashinfer" else None,
            "compiled_modules": len(scorer.compiled),
            "fallbacks": list(setup.fallbacks),
        },
    )
    row["scores"] = [r.scores for r in results]
    del scorer
    return row


def _pipeline_row(model_dir, tokenizer, shape: Shape, args, cfg, peak) -> dict:
    """The whole CLI on --pipeline-queries queries of the workload's shape, from text rows in a Parquet file to a
    Parquet output, with the settings auto resolves (what a user runs), beside the forward alone of the same
    groups and settings. The CLI runs in this process (imports paid once), REPEATS times; its time is the
    report's seconds_total - seconds_load: reading, hashing, tokenizing, planning, forwards and writing, start-up
    (process, imports, model load) excluded — as in any run, the first window is planned while the weights load.
    """
    from e2e_cpu import write_workload

    groups = text_workload(tokenizer, Shape(args.pipeline_queries, *astuple(shape)[1:]), seed=1)
    items = sum(len(g.items) for g in groups)
    labels = [flag for label in LABELS for flag in ("--label-tokens", label)]
    with tempfile.TemporaryDirectory() as tmp:
        data, out, report = (Path(tmp) / name for name in ("in.parquet", "out.parquet", "report.json"))
        write_workload(groups, data)
        command = [str(data), "-o", str(out), "--report", str(report), "--model", str(model_dir), *labels,
                   "--device", args.device, "--dtype", args.dtype, "--overwrite", "--quiet"]  # fmt: skip
        after_load, best = cli_runs(command, report, REPEATS)
    method = Method(
        best["backend"], layers=best["layers"], ops=best["ops"] if best["ops"] != "none" else "auto"
    )
    scorer = _scorer(model_dir, method, args.device, args.dtype, args.max_batch_tokens)
    start = time.perf_counter()
    plan = scorer.plan(groups)
    planning = time.perf_counter() - start
    scorer.run(plan)  # warm-up
    _, forward = best_of(REPEATS, _synced, scorer.run, plan, clock=CLOCK)
    del scorer
    tokens = plan.stats.packed_tokens
    delimiters = plan_delimiters(plan)
    row = _figures(
        items, tokens, tokens - delimiters, plan_attended_pairs(plan), min(after_load), cfg, peak, None
    )
    row.update(_medians(items, median(after_load)))
    row.update(
        what="the CLI end to end after start-up (text rows in, Parquet out), auto settings; beside it the forward "
        "alone (Scorer.run of a ready plan) and the planning alone (Scorer.plan) of the same groups",
        queries=len(groups),
        seconds_after_load_runs=[round(t, 3) for t in after_load],
        seconds_load=best["seconds_load"],
        seconds_scoring=best["seconds_scoring"],
        forward_items_per_s=round(items / forward, 1),
        forward_seconds=round(forward, 4),
        planning_items_per_s=round(items / planning, 1),
        pipeline_of_forward=round(forward / min(after_load), 3),
        resolved={
            key: best[key] for key in ("backend", "layers", "ops", "dtype", "fallbacks") if key in best
        },
    )
    return row


def cli_runs(command: list[str], report: Path, repeats: int) -> tuple[list[float], dict]:
    """The CLI run repeats times in this process: each run's seconds after start-up (the report's total less its
    import and model load), and the best run's report; a non-zero exit raises with the report's error."""
    runs = []
    for _ in range(repeats):
        code = _cli(command)
        figures = json.loads(report.read_text())
        if code != 0:
            raise RuntimeError(f"score-batch exited {code}: {figures.get('error')}")
        runs.append(figures)
    after_load = [r["seconds_total"] - r["seconds_load"] - r["seconds_import"] for r in runs]
    return after_load, runs[after_load.index(min(after_load))]


def _cli(argv: list[str]) -> int:
    """score-batch with these arguments in this process; its exit code."""
    from score_batch.cli.main import run

    saved = sys.argv
    sys.argv = ["score-batch", *argv]
    try:
        run()
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 0
    finally:
        sys.argv = saved
    return 0


def _speedups(rows: dict) -> None:
    """speedup_vs_hf of every finished row once plain HF has a time."""
    base = rows.get("hf_pairs", {}).get("items_per_s")
    if base:
        for row in rows.values():
            if "items_per_s" in row:
                row["speedup_vs_hf"] = round(row["items_per_s"] / base, 2)


def _synced(fn, *args):
    """fn(*args) followed by a device sync, so best_of times finished work."""
    result = fn(*args)
    _sync()
    return result


def _medians(items: int, seconds: float) -> dict:
    """The median run beside the best one: how far the best is from the typical run."""
    return {"median_seconds": round(seconds, 4), "median_items_per_s": round(items / seconds, 1)}


def _figures(items, tokens_run, useful_tokens, pairs, seconds, cfg, peak, diff) -> dict:
    """One method's row: throughput and MFU on the tokens it ran; useful = query and item tokens only."""
    return {
        "items_per_s": round(items / seconds, 1),
        "tokens_run": int(tokens_run),
        "useful_tokens": int(useful_tokens),
        "tokens_per_s": round(tokens_run / seconds),
        "seconds": round(seconds, 4),
        "attended_pairs": int(pairs),
        **figures(cfg, tokens_run, pairs, seconds, peak, useful_tokens),
        "peak_gib": _peak_gib(),
        "max_abs_diff_vs_hf": diff,
    }


def bench(args, argv: list[str]) -> dict:
    """Build the preset model once and run every workload; the JSON report is rewritten after every method."""
    preset = dict(PRESETS[args.preset])
    vocab_size = preset.pop("vocab_size")
    info = versions()
    peak, peak_source = peak_flops(info["device"])
    report = {
        "command": shlex.join(["python", "bench/gpu.py", *argv]),
        "device": info["device"],
        "versions": info,
        "peak_bf16_flops": peak,
        "peak_source": peak_source,
        "mfu_basis": MFU_BASIS,
        "scores": "softmax over the two label tokens (ScoringConfig.apply_softmax); max_abs_diff_vs_fp32: "
        f"against plain HF in float32 on the first {REFERENCE_ITEMS} items; max_abs_diff_vs_hf: against "
        "plain HF pairs in the bench dtype on every item",
        "timing": "best of 3 after a warm-up (the median of the 3 beside it); tokenization, HF pair tensors and the score-batch plan are "
        "built before the timer; timed: host token ids to host scores. pipeline: the CLI in this process, "
        "best of 3 of its report's seconds_total - seconds_load (text rows to the Parquet output, planning "
        "included, start-up excluded), on --pipeline-queries queries",
        "methods": {name: asdict(METHODS[name]) for name in args.methods if name in METHODS},
        "preset": args.preset,
        "model": preset,
        "dtype": args.dtype,
        "dense_flops_per_token": dense_flops_per_token(preset),
        "workloads": {},
    }

    def write(workload: str, result: dict) -> None:
        report["workloads"][workload] = result
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_bench_model(Path(tmp), "causal", vocab_size=vocab_size, **preset)
        for w in args.workloads:
            shape = _shape(w, args)
            result = run_workload(model_dir, shape, args, preset, on_row=lambda result, w=w: write(w, result))
            write(w, result)
    if XLMR in args.methods:
        write(XLMR, _encoder_workload(args, peak))
    return report


def _encoder_workload(args, peak) -> dict:
    """The xlmr workload (encoder_bench.py), or its error as a failed row."""
    from encoder_bench import encoder_rows

    try:
        return encoder_rows(args, peak, REPEATS)
    except Exception as error:  # the report keeps it; bench() exits non-zero at the end
        failed = {"error": _short(error), "traceback": traceback.format_exc()}
        return {"shape": {}, "items": 0, "methods": {XLMR: failed}}


def failed_methods(report: dict) -> list[str]:
    """workload/method of every row that recorded an error (refusals are not failures)."""
    return [
        f"{w}/{m}"
        for w, result in report["workloads"].items()
        for m, row in result["methods"].items()
        if "error" in row
    ]


def refused_methods(report: dict) -> list[str]:
    """workload/method: the refusal, of every row whose settings were refused."""
    return [
        f"{w}/{m}: {row['refused']}"
        for w, result in report["workloads"].items()
        for m, row in result["methods"].items()
        if "refused" in row
    ]


def summary_lines(report: dict) -> list[str]:
    """The text table of a report: one line per method."""
    lines = [f"{report['device']}: peak {report['peak_source']}", f"MFU basis: {report['mfu_basis']}"]
    for name, workload in report["workloads"].items():
        reference = workload.get("fp32_reference", {})
        lines.append(
            f"workload {name}: {workload['shape']}, {workload['items']} items; fp32 reference: "
            f"{reference.get('items', 0)} items{' ERROR ' + reference['error'] if 'error' in reference else ''}"
        )
        lines.append(
            f"  {'method':18} {'items/s':>9} {'median':>9} {'tokens/s':>10} {'vs HF':>6} {'MFU':>6} {'MFU+att':>7} "
            f"{'|d| fp32':>9} {'|d| HF':>8}  resolved / note"
        )
        for method, row in workload["methods"].items():
            if "items_per_s" not in row:
                why = row.get("refused") or row.get("error", "")
                lines.append(
                    f"  {method:18} {'refused' if 'refused' in row else 'FAILED'}: {why.splitlines()[0][:200]}"
                )
                continue
            lines.append(
                f"  {method:18} {row['items_per_s']:9.1f} {_fmt(row.get('median_items_per_s'), '9.1f')} "
                f"{row['tokens_per_s']:10d} "
                f"{_fmt(row.get('speedup_vs_hf'), '5.2f')}x {_fmt(row.get('mfu_dense'), '6.3f')} "
                f"{_fmt(row.get('mfu_with_attention'), '7.3f')} {_fmt(row.get('max_abs_diff_vs_fp32'), '9.1e')} "
                f"{_fmt(row.get('max_abs_diff_vs_hf'), '8.1e')}  {json.dumps(row.get('resolved', row.get('what')))}"
            )
            if "padding_share" in row:  # the encoder rows: padded pairs
                lines.append(
                    f"  {'':18} {row['padding_share']:.1%} of the {row['tokens_run']} tokens run are padding"
                )
            if "forward_items_per_s" in row:  # the pipeline: where its time goes
                lines.append(
                    f"  {'':18} {row['queries']} queries; forward alone {row['forward_items_per_s']:.1f} items/s "
                    f"(the pipeline runs at {row['pipeline_of_forward']:.2f} of it), planning alone "
                    f"{row['planning_items_per_s']:.1f} items/s"
                )
    return lines


def _fmt(value, spec: str) -> str:
    width = int(spec.split(".")[0])
    return "—".rjust(width) if value is None else format(value, spec)


def _shape(workload: str, args) -> Shape:
    """The workload's shape, with --queries overriding its number of queries."""
    shape = WORKLOADS[workload]
    return Shape(args.queries or shape.queries, shape.items, shape.query_tokens, shape.item_tokens)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line arguments of the subcommands."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("versions").add_argument("--out", type=Path, required=True)
    warm = sub.add_parser("warmup")
    warm.add_argument(
        "--out", type=Path, required=True, help="warmup.json: merged with what it holds already"
    )
    warm.add_argument("--fa3", action="store_const", const="fa3", default="fa2", dest="build",
                      help="build FA3's prefill (alone) instead of FA2's and the ops")  # fmt: skip
    warm.add_argument("--after-build", default=None, help="a shell command started once the build ended")
    run = sub.add_parser("bench")
    run.add_argument("--preset", choices=PRESETS, default="qwen3-0.6b")
    run.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    run.add_argument(
        "--methods",
        nargs="+",
        choices=[HF, PIPELINE, XLMR, *METHODS],
        default=DEFAULT_METHODS,
        help="hf (plain HF pairs) always runs first when named; pipeline: the whole CLI beside its forward; "
        "xlmr: an XLM-R-large-shaped classifier on 30 + 300-token pairs against plain HF (workload xlmr); "
        + "; ".join(f"{k}: {m.what}" for k, m in METHODS.items() if m.what),
    )
    run.add_argument("--queries", type=int, default=None, help="override the workload's number of queries")
    run.add_argument(
        "--pipeline-queries",
        type=int,
        default=64,
        help="queries of the workload's shape the pipeline method runs",
    )
    run.add_argument(
        "--encoder-queries", type=int, default=32, help="queries of 32 documents the xlmr method runs"
    )
    run.add_argument("--device", default="cuda")
    run.add_argument("--dtype", default="bfloat16")
    run.add_argument("--max-batch-tokens", type=int, default=None)
    run.add_argument("--hf-batch", type=int, default=32, help="pairs per plain-HF batch")
    run.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu.json")
    args = parser.parse_args(argv)
    if args.command == "bench":  # plain HF first: it is every other method's reference
        args.methods = sorted(dict.fromkeys(args.methods), key=lambda m: m != HF)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.command == "versions":
        args.out.write_text(json.dumps(versions(), indent=2) + "\n")
        print(args.out.read_text())
    elif args.command == "warmup":
        report = warmup(args.out, args.build, args.after_build)
        print(json.dumps(report, indent=2))
        return 0 if report[f"ok_{args.build}"] else 1
    else:
        report = bench(args, argv)
        print("\n".join(summary_lines(report)))
        for refusal in refused_methods(report):
            print(f"refused: {refusal}")
        failed = failed_methods(report)
        if failed:
            print(f"failed: {', '.join(failed)} (errors in {args.out})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
