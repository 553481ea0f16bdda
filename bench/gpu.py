"""GPU figures for bench/gpu_check.sh: versions, a FlashInfer JIT warm-up, and score-batch vs plain HF pairs.

    python bench/gpu.py versions --out FILE
    python bench/gpu.py warmup --out FILE
    python bench/gpu.py bench [--preset qwen3-0.6b|tiny] [--workloads a b] [--methods hf flashinfer ...]
                              [--device cuda] [--dtype bfloat16] [--out bench/results/gpu.json]

The bench model has random weights (speed does not depend on their values; scores are compared with
plain HF on the same weights). Timing boundaries, the same for both sides: tokenization, HF's padded
pair tensors and score-batch's plan (tokenize, pack, batch) are built BEFORE the timer; the timer covers
host token ids → device → forward → scores back on the host. Every time is the best of 3 runs after a
warm-up run that includes FlashInfer's JIT and torch.compile. FLOPs and MFU: bench/flops.py (dense and
attention FLOPs apart, MFU without and with attention, the peak of the exact device name). The JSON
report is rewritten after every method, so a later failure keeps the earlier figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from common import LABELS, Shape, best_of, build_bench_model, hf_prepare, hf_run, max_abs_diff, text_workload
from flops import causal_pairs, dense_flops_per_token, figures, pack_pairs, peak_flops
from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig

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
WORKLOADS = {"a": Shape(16, 100, 1500, 40), "b": Shape(32, 50, 200, 30)}
METHODS = ("hf", "flashinfer", "flashinfer+compile", "flex", "flex+compile", "sdpa", "split")
DEFAULT_METHODS = ["hf", "flashinfer", "flashinfer+compile", "flex", "flex+compile", "sdpa"]
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


def warmup(out: Path) -> dict:
    """Compile FlashInfer's bf16 head_dim-128 multi-item kernels once; report the JIT and warm times."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_bench_model(
            Path(tmp),
            "causal",
            num_hidden_layers=1,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
        )
        config = EngineConfig(
            device="cuda", dtype="bfloat16", backend="flashinfer", scoring=ScoringConfig(label_tokens=LABELS)
        )
        scorer = Scorer.from_pretrained(model_dir, config)
        groups = [Group(" the quick brown fox" * 20, [" jumps over", " the lazy dog" * 10])]
        _, first = _timed_sync(scorer.score, groups)
        _, second = _timed_sync(scorer.score, groups)
    report = {"first_call_s": round(first, 2), "warm_call_s": round(second, 4), **versions()}
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


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


def hf_attended_pairs(batches) -> tuple[int, int]:
    """(real tokens, attended pairs) of prepared plain-HF batches: each pair is one causal sequence."""
    lengths = [n for batch in batches for n in batch.lengths]
    return sum(lengths), sum(causal_pairs(n) for n in lengths)


def plan_attended_pairs(plan) -> int:
    """Attended pairs of a score-batch plan: its packs under the multi-item mask, or its padded pairs."""
    total = 0
    for batch in plan.batches:
        if hasattr(batch, "packs"):
            total += sum(pack_pairs(pack.segments) for pack in batch.packs)
        else:  # PairBatch: one causal sequence per row
            total += sum(causal_pairs(int(n)) for n in batch.attention_mask.sum(1))
    return total


def run_workload(model_dir: Path, shape: Shape, args, cfg: dict, on_row=lambda rows: None) -> dict:
    """All methods on one workload: items/s, tokens/s, FLOPs, MFU, peak memory, max |diff| vs plain HF.

    on_row(rows) is called after every method (the caller writes the report); a method that fails is
    recorded with its error and the others still run.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    groups = text_workload(tokenizer, shape)
    items = sum(len(g.items) for g in groups)
    label_ids = [tokenizer.encode(t, add_special_tokens=False)[0] for t in LABELS]
    peak, _ = peak_flops(versions()["device"])
    rows, reference = {}, None
    for method in args.methods:
        name = "hf_pairs" if method == "hf" else method
        try:
            if method == "hf":
                reference, rows[name] = _hf_row(
                    model_dir, tokenizer, groups, items, label_ids, args, cfg, peak
                )
            else:
                rows[name] = _engine_row(model_dir, method, groups, items, reference, args, cfg, peak)
        except Exception as error:  # the report keeps it; bench() exits non-zero at the end
            rows[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        _speedups(rows)
        on_row(rows)
    return {"shape": shape.__dict__, "items": items, "methods": rows}


def _hf_row(model_dir, tokenizer, groups, items, label_ids, args, cfg, peak):
    """(scores, row) of plain HF over padded pairs; the pair tensors are built before the timer."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype))
    model = model.to(args.device).eval()
    batches = hf_prepare(tokenizer, groups, args.hf_batch)  # untimed: tokenization and host tensors
    hf_run(model, batches[:1], groups, "causal", label_ids)  # warm-up
    _reset_peak()
    (reference, tokens_run), seconds = best_of(
        REPEATS, _synced, hf_run, model, batches, groups, "causal", label_ids, clock=CLOCK
    )
    useful, pairs = hf_attended_pairs(batches)
    row = _figures(items, tokens_run, useful, pairs, seconds, cfg, peak, 0.0)
    del model
    return reference, row


def _engine_row(model_dir, method, groups, items, reference, args, cfg, peak):
    """One score-batch method's row; the plan (tokenize, pack, batch) is built before the timer."""
    backend, _, extra = method.partition("+")  # "flashinfer+compile": compiled decoder layers
    config = EngineConfig(
        device=args.device,
        dtype=args.dtype,
        backend=backend,
        max_batch_tokens=args.max_batch_tokens,
        compile=extra == "compile",
        scoring=ScoringConfig(label_tokens=LABELS),
    )
    scorer = Scorer.from_pretrained(model_dir, config)
    plan = scorer.plan(groups)  # untimed: tokenization and packing
    scorer.run(plan)  # warm-up: JIT, compilation, allocator
    _reset_peak()
    results, seconds = best_of(REPEATS, _synced, scorer.run, plan, clock=CLOCK)
    diff = None if reference is None else max_abs_diff(results, reference)
    tokens = plan.stats.packed_tokens
    row = _figures(items, tokens, tokens, plan_attended_pairs(plan), seconds, cfg, peak, diff)
    row["pairwise_tokens"] = plan.stats.pairwise_tokens
    del scorer
    return row


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


def _figures(items, tokens_run, useful_tokens, pairs, seconds, cfg, peak, diff) -> dict:
    """One method's row: throughput on the tokens it ran, FLOPs and MFU on the useful (unpadded) ones."""
    return {
        "items_per_s": round(items / seconds, 1),
        "tokens_run": int(tokens_run),
        "useful_tokens": int(useful_tokens),
        "tokens_per_s": round(tokens_run / seconds),
        "seconds": round(seconds, 4),
        "attended_pairs": int(pairs),
        **figures(cfg, useful_tokens, pairs, seconds, peak),
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
        "timing": "best of 3 after a warm-up; tokenization, HF pair tensors and the score-batch plan are "
        "built before the timer; timed: host token ids to host scores",
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
            partial = {"shape": shape.__dict__, "methods": {}}
            result = run_workload(
                model_dir,
                shape,
                args,
                preset,
                on_row=lambda rows, w=w, p=partial: write(w, {**p, "methods": rows}),
            )
            write(w, result)
    return report


def failed_methods(report: dict) -> list[str]:
    """workload/method of every row that recorded an error."""
    return [
        f"{w}/{m}"
        for w, result in report["workloads"].items()
        for m, row in result["methods"].items()
        if "error" in row
    ]


def _shape(workload: str, args) -> Shape:
    """The workload's shape, with --queries overriding its number of queries."""
    shape = WORKLOADS[workload]
    return Shape(args.queries or shape.queries, shape.items, shape.query_tokens, shape.item_tokens)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line arguments of the three subcommands."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("versions", "warmup"):
        sub.add_parser(name).add_argument("--out", type=Path, required=True)
    run = sub.add_parser("bench")
    run.add_argument("--preset", choices=PRESETS, default="qwen3-0.6b")
    run.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    run.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=DEFAULT_METHODS,
        help="hf always runs first when named",
    )
    run.add_argument("--queries", type=int, default=None, help="override the workload's number of queries")
    run.add_argument("--device", default="cuda")
    run.add_argument("--dtype", default="bfloat16")
    run.add_argument("--max-batch-tokens", type=int, default=None)
    run.add_argument("--hf-batch", type=int, default=32, help="pairs per plain-HF batch")
    run.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu.json")
    args = parser.parse_args(argv)
    if args.command == "bench":  # plain HF first: it is every other method's reference
        args.methods = sorted(dict.fromkeys(args.methods), key=lambda m: m != "hf")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.command == "versions":
        args.out.write_text(json.dumps(versions(), indent=2) + "\n")
        print(args.out.read_text())
    elif args.command == "warmup":
        print(json.dumps(warmup(args.out), indent=2))
    else:
        report = bench(args, argv)
        print(f"{report['device']}: peak {report['peak_source']}")
        for name, workload in report["workloads"].items():
            print(f"workload {name}: {workload['shape']}, {workload['items']} items")
            for method, row in workload["methods"].items():
                print(f"  {method:18} {json.dumps({k: v for k, v in row.items() if k != 'traceback'})}")
        failed = failed_methods(report)
        if failed:
            print(f"failed: {', '.join(failed)} (errors in {args.out})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
