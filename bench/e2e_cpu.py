"""The whole CLI run against plain-HF pairs, both timed end to end from the same text rows, in one run.

    python bench/e2e_cpu.py [--queries 32] [--items 30] [--query-tokens 200] [--item-tokens 30] [--threads 2]
                            [--repeats 3] [--kind causal|classifier] [--profile FILE]

The workload (the recommendation shape of compare.py) is written to a Parquet file. The baseline is
plain HF from the text rows: tokenize every (query + item) pair, length-sorted right-padded batches,
forward, scores on the host (`common.hf_pairs`). The CLI side is `score-batch IN -o OUT.parquet
--report R` in a subprocess: its time is the report's `seconds_total - seconds_load - seconds_import`,
i.e. everything the job does after the process, its torch import and the model are up (preflight, lock, reading, hashing, tokenizing,
planning, scoring, output conversion, checkpoint parts, the merge and the atomic publish). Process
start-up and model load are reported apart. Prints the speed-up, the packed/pairwise token ratio
and their quotient (1.0 = the CLI gets all of the arithmetic saving): best of --repeats rounds, each
round running the baseline and the CLI back to back, and the quotient of each round.
`--profile FILE` also writes a cProfile of one in-process CLI run. The CLI tunes glibc malloc for its
tensors (score_batch/machine.py); the baseline gets the same settings in this process, so the quotient measures
packing and the job, not the allocator (`--baseline-malloc default` leaves the baseline's malloc alone).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from common import (
    BENCH_MODEL,
    LABELS,
    Shape,
    build_bench_model,
    hf_pairs,
    hf_prepare,
    machine,
    text_workload,
    timed,
)
from flops import attention_flops, causal_pairs, dense_flops_per_token, pack_pairs
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from score_batch.machine import tune_malloc


def write_workload(groups, path: Path) -> None:
    """The groups as a long-layout Parquet table (query_id, query, item_id, item)."""
    rows = [
        {"query_id": f"q{g}", "query": group.query, "item_id": f"q{g}-{i}", "item": item}
        for g, group in enumerate(groups)
        for i, item in enumerate(group.items)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)


def cli_args(data: Path, out: Path, report: Path, model_dir: Path, kind: str, threads: int) -> list[str]:
    """The score-batch command line of one run."""
    labels = [a for t in LABELS for a in ("--label-tokens", t)] if kind == "causal" else []
    return [
        str(data),
        "-o",
        str(out),
        "--report",
        str(report),
        "--model",
        str(model_dir),
        "--overwrite",
        "--quiet",
        "--threads",
        str(threads),
        *labels,
    ]


def cli_run(args: list[str], report: Path) -> dict:
    """One CLI run in a fresh process; its report plus the process's wall time."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "score_batch.cli.main", *args], check=True)
    wall = time.perf_counter() - started
    figures = json.loads(report.read_text())
    figures["process_wall"] = wall
    return figures


def profile_run(args: list[str], where: Path) -> None:
    """A cProfile of one in-process CLI run, sorted by cumulative time."""
    import cProfile
    import pstats

    from score_batch.cli.main import run

    sys.argv = ["score-batch", *args]
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        run()
    except SystemExit:
        pass
    profiler.disable()
    with where.open("w") as out:
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(60)


def arithmetic_ratio(plan, hf_batches) -> float:
    """Pairwise over packed FLOPs, attention included (bench/flops.py): the speed-up the arithmetic allows.

    The token ratio leaves attention out; in a pack every item token attends the whole query, so a packed
    token carries more attention work than the average pair token and the token ratio overstates the limit.
    """
    cfg = {**BENCH_MODEL}
    per_token = dense_flops_per_token(cfg)
    packed_tokens = sum(batch.num_tokens for batch in plan.batches)
    packed = per_token * packed_tokens + attention_flops(
        cfg, sum(pack_pairs(pack.segments) for batch in plan.batches for pack in batch.packs)
    )
    lengths = [n for batch in hf_batches for n in batch.lengths]
    pairwise = per_token * sum(lengths) + attention_flops(cfg, sum(causal_pairs(n) for n in lengths))
    return pairwise / packed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=32)
    parser.add_argument("--items", type=int, default=30, help="items per query")
    parser.add_argument("--query-tokens", type=int, default=200)
    parser.add_argument("--item-tokens", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="rounds of baseline + CLI (+ engine)")
    parser.add_argument("--kind", default="causal", choices=("causal", "classifier"))
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--cli-args", default="", help="extra score-batch flags, e.g. '--no-pipeline'")
    parser.add_argument("--engine", action="store_true", help="also time Scorer.run(plan) alone, in process")
    parser.add_argument("--baseline-malloc", default="tuned", choices=("tuned", "default"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tuned = args.baseline_malloc == "tuned" and tune_malloc(os.environ)
    print(machine(), f"| baseline malloc: {'tuned as the CLI' if tuned else 'glibc default'}")
    shape = Shape(args.queries, args.items, args.query_tokens, args.item_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = build_bench_model(tmp / "model", args.kind)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        groups = text_workload(tokenizer, shape)
        items = sum(len(g.items) for g in groups)
        data, out, report = tmp / "in.parquet", tmp / "out.parquet", tmp / "report.json"
        write_workload(groups, data)

        label_ids = [tokenizer.encode(t, add_special_tokens=False)[0] for t in LABELS]
        auto = AutoModelForCausalLM if args.kind == "causal" else AutoModelForSequenceClassification
        model = auto.from_pretrained(model_dir, attn_implementation="sdpa").eval()
        hf_pairs(model, tokenizer, groups[:1], args.kind, label_ids)  # warm-up
        command = cli_args(data, out, report, model_dir, args.kind, args.threads) + args.cli_args.split()
        from score_batch.engine import EngineConfig, Scorer, ScoringConfig

        scoring = ScoringConfig(label_tokens=LABELS if args.kind == "causal" else ())
        scorer = Scorer.load(model_dir, EngineConfig(device="cpu", scoring=scoring))
        plan = scorer.plan(groups)
        flop_ratio = arithmetic_ratio(plan, hf_prepare(tokenizer, groups))
        if args.engine:
            scorer.run(scorer.plan(groups[:1]))  # warm-up
        else:
            scorer = None

        # Rounds of (baseline, CLI, engine) back to back: a slow spell of the machine hits all sides alike.
        hf_times, runs, engine_times = [], [], []
        for _ in range(args.repeats):
            hf_times.append(timed(hf_pairs, model, tokenizer, groups, args.kind, label_ids)[1])
            time.sleep(
                1.0
            )  # the baseline's OpenMP workers spin on after it; the CLI must not share the cores with them
            runs.append(cli_run(command, report))
            if scorer is not None:
                engine_times.append(timed(scorer.run, plan)[1])
        job_times = [r["seconds_total"] - r["seconds_load"] - r["seconds_import"] for r in runs]
        hf_seconds, job_seconds = min(hf_times), min(job_times)
        best = runs[job_times.index(job_seconds)]
        token_ratio = best["pairwise_tokens"] / best["packed_tokens"]
        speedup = hf_seconds / job_seconds
        paired = sorted(h / j / token_ratio for h, j in zip(hf_times, job_times))
        print(
            f"{args.kind}: {len(groups)} queries, {items} items; token ratio {token_ratio:.2f}x; {args.repeats} rounds"
        )
        print(
            f"plain HF pairs from text        {hf_seconds:7.3f} s  {items / hf_seconds:8.1f} items/s  (best)"
        )
        print(
            f"score-batch CLI (after load)    {job_seconds:7.3f} s  {items / job_seconds:8.1f} items/s"
            f"  (scoring loop {best['seconds_scoring']:.3f} s, load {best['seconds_load']:.3f} s,"
            f" torch import {best['seconds_import']:.3f} s,"
            f" process {best['process_wall']:.2f} s)"
        )
        print(
            f"speed-up {speedup:.2f}x = {speedup / token_ratio:.3f} of the token ratio,"
            f" {speedup / flop_ratio:.3f} of the FLOP ratio {flop_ratio:.2f}x (best against best)"
        )
        print("per round, of the token ratio: " + " ".join(f"{q:.3f}" for q in paired))
        with_import = min(r["seconds_total"] - r["seconds_load"] for r in runs)
        print(
            f"with its torch import counted too (import {best['seconds_import']:.3f} s): "
            f"{hf_seconds / with_import / token_ratio:.3f} of the token ratio"
        )
        if engine_times:
            engine_speedup = hf_seconds / min(engine_times)
            print(
                f"engine alone (Scorer.run of a ready plan) {min(engine_times):.3f} s: {engine_speedup:.2f}x"
                f" = {engine_speedup / token_ratio:.3f} of the token ratio, {engine_speedup / flop_ratio:.3f}"
                " of the FLOP ratio"
            )
        if args.profile:
            profile_run(command, args.profile)
            print(f"profile: {args.profile}")


if __name__ == "__main__":
    main()
