"""Where one forward's milliseconds go at the goal shape (`bash bench/gpu_check.sh profile`).

    python bench/gpu_profile.py --out-dir DIR [--steps profile attention gemm sweep graph cli] [--fa3]
                                [--preset qwen3-0.6b|tiny] [--device cuda] [--dry-run]

The goal shape: Qwen3-0.6B's shape, bf16, a 1,500-token query with 100 items of 40 tokens (one 5,601-token pack per
query), the settings `auto` resolves. Steps, most valuable first, each written as soon as it ends (profile.json
rewritten, profile.txt appended), so a call cut at its limit keeps what ran:
  profile    a torch.profiler kernel table of one forward with 4 and with 11 packs: per kernel count, total and
             mean time and share; per class (GEMM, attention, norms, …); the device's idle share; host calls
             over 200 µs; the 4-pack trace as trace-4.json.gz
  attention  attention alone over 1 and 11 packs: FA2 (and FA3 with --fa3) multi-item, ms and TFLOP/s
  gemm       the four GEMMs of a layer at the 11-pack batch's tokens, bf16 and FP8 (torch._scaled_mm, rowwise)
  sweep      packs per forward 1..16: ms per forward and per pack, items/s, MFU
  cli        the CLI on 64 queries, Parquet in and out, --window-rows 2,048 and 8,192, beside the forward alone
  graph      one forward (1 and 11 packs) replayed as a CUDA graph against eager (last: a failed capture can
             leave the device unusable for later work)
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from common import Shape, best_of, build_bench_model, text_workload
from flops import figures, peak_flops
from kernel_bench import attention_row, gemms
from profile_table import DEVICE_CATEGORIES, format_table, profile_summary

# The graph step last: a capture that fails can leave the device's context unusable for what follows.
STEPS = ("profile", "attention", "gemm", "sweep", "cli", "graph")
# Seconds each step takes on an H200 at the goal shape (estimates; the model's build and load come first: ~25 s).
ESTIMATES = {"setup": 25, "profile": 20, "attention": 5, "gemm": 5, "sweep": 25, "graph": 10, "cli": 40}
REGION = "forward"  # the record_function around the profiled forward
PACK_TOKENS = 8192  # EngineConfig.max_pack_tokens' default: the budget per pack of the one-batch plans


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The profile's arguments."""
    import gpu

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out-dir", type=Path, required=True, help="profile.json, profile.txt, trace-4.json.gz"
    )
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--preset", choices=gpu.PRESETS, default="qwen3-0.6b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--query-tokens", type=int, default=1500)
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--item-tokens", type=int, default=40)
    parser.add_argument("--profile-packs", type=int, nargs="+", default=[4, 11])
    parser.add_argument("--attention-packs", type=int, nargs="+", default=[1, 11])
    parser.add_argument(
        "--gemm-packs", type=int, default=11, help="the batch whose token count the GEMMs take"
    )
    parser.add_argument("--sweep-packs", type=int, nargs="+", default=list(range(1, 17)))
    parser.add_argument("--graph-packs", type=int, nargs="+", default=[1, 11])
    parser.add_argument("--window-rows", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--cli-queries", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="forwards per figure (best and median)")
    parser.add_argument("--kernel-repeats", type=int, default=20, help="calls per kernel figure (median)")
    parser.add_argument("--fa3", action="store_true", help="also FA3 (only where its module was carried in)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the steps and their estimates, run none"
    )
    return parser.parse_args(argv)


class Record:
    """profile.json rewritten and profile.txt appended after every step."""

    def __init__(self, out_dir: Path, header: dict) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.json, self.text = out_dir / "profile.json", out_dir / "profile.txt"
        self.report = {**header, "steps": {}}
        self.text.write_text(f"{header['command']}\n{header['device']}\n")
        self._write()

    def step(self, name: str, result: dict, lines: list[str]) -> None:
        self.report["steps"][name] = result
        self._write()
        with self.text.open("a") as text:
            text.write("\n".join([f"== {name} ({result.get('seconds', '?')} s)", *lines]) + "\n")

    def _write(self) -> None:
        self.json.write_text(json.dumps(self.report, indent=2) + "\n")


class Bench:
    """The goal-shape model loaded once with the settings auto resolves, and groups to plan batches of k packs."""

    def __init__(self, args, model_dir: Path, cfg: dict) -> None:
        import gpu
        from transformers import AutoTokenizer

        self.args, self.model_dir, self.cfg = args, model_dir, cfg
        self.device = torch.device(args.device)
        most = max(
            args.profile_packs
            + args.attention_packs
            + args.sweep_packs
            + args.graph_packs
            + [args.gemm_packs]
        )
        method = gpu.Method("auto")
        self.scorer = gpu._scorer(model_dir, method, args.device, args.dtype, most * PACK_TOKENS)
        shape = Shape(most, args.items, args.query_tokens, args.item_tokens)
        self.groups = text_workload(AutoTokenizer.from_pretrained(model_dir), shape)
        self.peak = peak_flops(gpu.versions()["device"])[0]
        setup = self.scorer.setup
        self.resolved = {k: getattr(setup, k, None) for k in ("backend", "layers", "ops")}

    def plan(self, packs: int):
        """A plan of `packs` groups in one batch (one pack per group at the goal shape)."""
        plan = self.scorer.plan(self.groups[:packs])
        if len(plan.batches) != 1:
            raise RuntimeError(f"{packs} groups planned into {len(plan.batches)} batches, not one")
        return plan

    def forward(self, plan) -> dict:
        """Scorer.run of a ready plan (host ids to host scores): best and median of --repeats after a warm-up."""
        import gpu

        self.scorer.run(plan)
        times = [best_of(1, gpu._synced, self.scorer.run, plan)[1] for _ in range(self.args.repeats)]
        best, median = min(times), sorted(times)[len(times) // 2]
        items = sum(len(g.item_ids) for g in plan.scored)
        tokens = plan.stats.packed_tokens
        pairs = gpu.plan_attended_pairs(plan)
        row = {"packs": len(plan.batches[0].packs), "tokens": tokens, "items": items,
               "best_ms": round(best * 1e3, 3), "median_ms": round(median * 1e3, 3),
               "ms_per_pack": round(best * 1e3 / len(plan.batches[0].packs), 3),
               "items_per_s": round(items / best, 1), "median_items_per_s": round(items / median, 1)}  # fmt: skip
        mfu = figures(self.cfg, tokens, pairs, best, self.peak)
        row.update(mfu_dense=mfu["mfu_dense"], mfu_with_attention=mfu["mfu_with_attention"])
        return row


def profile_step(bench: Bench, out_dir: Path) -> tuple[dict, list[str]]:
    """A torch.profiler kernel table of one forward per --profile-packs; the first one's trace kept."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = bench.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    result, lines = {}, []
    for index, packs in enumerate(bench.args.profile_packs):
        plan = bench.plan(packs)
        timing = bench.forward(plan)  # the warm-up is inside: JIT, allocator
        with profile(activities=activities) as prof:
            with record_function(REGION):
                bench.scorer.run(plan)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
            if index == 0:
                with gzip.open(out_dir / f"trace-{packs}.json.gz", "wt") as kept:
                    kept.write(path.read_text())
        # On the CPU the top-level torch ops stand in for kernels (the CPU suite's proof of this code).
        table = profile_summary(
            trace, REGION, nested=cuda, categories=DEVICE_CATEGORIES if cuda else ("cpu_op",)
        )
        result[str(packs)] = {"forward": timing, **table}
        lines += [f"-- {packs} packs: forward {timing['best_ms']} ms best, {timing['median_ms']} ms median, "
                  f"{timing['items_per_s']} items/s", *format_table(table)]  # fmt: skip
    return result, lines


def attention_step(bench: Bench) -> tuple[dict, list[str]]:
    """Attention alone over --attention-packs packs per kernel."""
    kernels = (["fa2"] + (["fa3"] if bench.args.fa3 else [])) if bench.device.type == "cuda" else ["sdpa"]
    result, lines = {}, []
    for kernel in kernels:
        for packs in bench.args.attention_packs:
            key = f"{kernel}/{packs}"
            try:
                batch = bench.plan(packs).batches[0]
                result[key] = attention_row(batch, bench.cfg, kernel, bench.device, bench.args.kernel_repeats)
                row = result[key]
                lines.append(f"{key:10} {row['ms']:8.3f} ms per layer, {row['tflops']:7.1f} TFLOP/s, "
                             f"{row['forward_ms_per_pack']:.2f} ms per pack per forward")  # fmt: skip
            except Exception as error:
                result[key] = {"error": _short(error)}
                lines.append(f"{key:10} FAILED: {result[key]['error'][:300]}")
    return result, lines


def gemm_step(bench: Bench) -> tuple[dict, list[str]]:
    """The four GEMMs of a layer at the --gemm-packs batch's token count."""
    tokens = bench.plan(bench.args.gemm_packs).batches[0].num_tokens
    result = gemms(bench.cfg, tokens, bench.device, bench.args.kernel_repeats)
    lines = []
    for name, row in result["gemms"].items():
        fp8 = (f"fp8 {row['fp8_ms']:.3f} ms {row['fp8_tflops']:.0f} TFLOP/s (×{row['fp8_speedup']}, rel. error "
               f"{row['fp8_relative_error']}, quant {row['activation_quant_ms']:.3f} ms)"
               if "fp8_ms" in row else f"fp8 refused: {row['fp8_refused']}")  # fmt: skip
        lines.append(f"{name:8} {row['m']}×{row['k']}×{row['n']}: bf16 {row['bf16_ms']:.3f} ms "
                     f"{row['bf16_tflops']:.0f} TFLOP/s; {fp8}")  # fmt: skip
    lines.append(f"total: {json.dumps(result['total'])}")
    return result, lines


def sweep_step(bench: Bench, record: Record) -> tuple[dict, list[str]]:
    """Packs per forward: each point written as it ends (the step's partial result in profile.json)."""
    result, lines = {}, []
    for packs in bench.args.sweep_packs:
        try:
            result[str(packs)] = bench.forward(bench.plan(packs))
        except Exception as error:
            result[str(packs)] = {"error": _short(error)}
        record.report["steps"]["sweep"] = {"partial": True, **result}
        record._write()
        row = result[str(packs)]
        lines.append(
            f"{packs:2d} packs: {row['best_ms']:8.2f} ms ({row['median_ms']:.2f} median), {row['ms_per_pack']:.2f} ms "
            f"per pack, {row['items_per_s']:9.1f} items/s, MFU {row['mfu_dense']}"
            if "error" not in row
            else f"{packs:2d} packs: FAILED {row['error'][:300]}"
        )
    return result, lines


def graph_step(bench: Bench) -> tuple[dict, list[str]]:
    """One forward (backbone and head, inputs on the device, attention planned) eager and as a CUDA graph."""
    from graph_replay import graph_row

    result, lines = {}, []
    for packs in bench.args.graph_packs:
        row = graph_row(bench.scorer, bench.plan(packs).batches[0], bench.args.kernel_repeats)
        result[str(packs)] = row
        lines.append(f"{packs:2d} packs: {json.dumps(row)[:400]}")
    return result, lines


def cli_step(bench: Bench) -> tuple[dict, list[str]]:
    """The CLI at the goal shape per --window-rows, beside the forward alone of the same groups."""
    from cli_windows import cli_rows

    result = cli_rows(bench.model_dir, bench.args)
    lines = [f"{key}: {json.dumps(row)[:400]}" for key, row in result.items()]
    return result, lines


def run_steps(args, record: Record, out_dir: Path) -> list[str]:
    """Build and load the model, then every step in order; the names of the steps that failed."""
    import gpu

    preset = dict(gpu.PRESETS[args.preset])
    vocab = preset.pop("vocab_size")
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        model_dir = build_bench_model(Path(tmp), "causal", vocab_size=vocab, **preset)
        bench = Bench(args, model_dir, preset)
        record.step("setup", {"seconds": round(time.perf_counter() - start, 1), "resolved": bench.resolved,
                              "shape": vars(Shape(0, args.items, args.query_tokens, args.item_tokens))},
                    [f"resolved {bench.resolved}"])  # fmt: skip
        steps = {
            "profile": lambda: profile_step(bench, out_dir),
            "attention": lambda: attention_step(bench),
            "gemm": lambda: gemm_step(bench),
            "sweep": lambda: sweep_step(bench, record),
            "graph": lambda: graph_step(bench),
            "cli": lambda: cli_step(bench),
        }
        for name in args.steps:
            start = time.perf_counter()
            try:
                result, lines = steps[name]()
            except Exception as error:  # recorded; the next steps still run
                result, lines = {"error": _short(error), "traceback": traceback.format_exc()}, [_short(error)]
                failed.append(name)
            result = {"seconds": round(time.perf_counter() - start, 1), **result}
            record.step(name, result, lines)
            gpu._free()
    return failed


def _short(error: Exception) -> str:
    import gpu

    return gpu._short(error, 2000)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.dry_run:
        total = ESTIMATES["setup"] + sum(ESTIMATES[s] for s in args.steps)
        print(f"steps: setup {ESTIMATES['setup']} s, " + ", ".join(f"{s} {ESTIMATES[s]} s" for s in args.steps)
              + f"; about {total} s on an H200; writes {args.out_dir}/profile.json, profile.txt, "
              f"trace-{args.profile_packs[0]}.json.gz")  # fmt: skip
        return 0
    import gpu

    info = gpu.versions()
    header = {"command": shlex.join(["python", "bench/gpu_profile.py", *argv]), "device": info["device"],
              "versions": info, "preset": args.preset, "dtype": args.dtype}  # fmt: skip
    record = Record(args.out_dir, header)
    failed = run_steps(args, record, args.out_dir)
    print(record.text.read_text())
    if failed:
        print(f"failed steps: {', '.join(failed)} (see {record.json})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
