"""The host path alone: read → validate → group → keys → tokenize → plan → output columns → Parquet, with no
model time, against the tokenizer's own batch call measured in the same run.

    python bench/host_path.py [--items 10000 100000] [--shapes 1000x27 1500x40] [--per-query 100]
                              [--repeats 2] [--stages] [--modes dry zero pooled ceiling jsonl cli]

Input: a long-layout Parquet file (query_id, query, item_id, item) of each shape (queries of about
QUERY_TOKENS tokens with --per-query items of about ITEM_TOKENS: 1,000 × 27, where items are short and the
per-item work shows most, and the goal-like 1,500 × 40), tokenized by the tests' byte-level BPE tokenizer. For each size, printed as items/s and as a ratio of the floor:

- floor: the `tokenizers` library's `encode_batch` over the items and each distinct query once (the least
  tokenizing any host path must do);
- dry: `--dry-run` through score_batch.job.run (the CLI's run loop; no weights), scoring phase only;
- zero: a full run with the packed runner's forward replaced by a zero-cost stand-in (bench only), so it
  times read → … → Parquet write with the engine's bookkeeping;
- pooled: the same with 1,024-wide pooled hidden states written;
- ceiling: the dry run with the tokenizer's batch call replaced by a lookup of token ids made before the
  timing (bench only): the Python ceiling, what the host path reaches when tokenizing costs nothing;
- jsonl: the dry run over the same rows as a JSONL file;
- boundN (bound6, bound12, …; not run by default): the tokenizer's calls window by window beside a thread doing
  N µs of pure-Python work per item: what a pipeline holding that much Python per item can reach at best here
  (the tokenizer's calls already keep both cores busy, so the Python cannot hide beside them for free);
- cli: the command as a user runs it, in its own process (`score-batch IN --dry-run --max-pack-tokens 8192
  --report R`): the report's items / seconds_scoring (its CPU time includes the process's start-up).

--stages adds where each mode's time goes: each host step's wall seconds and its own CPU per item (the calling
thread's: the tokenizer's worker threads are not in it), summed over the prefetch workers and the main thread,
from wrappers around the job's steps.

Each mode also prints its CPU time per item (all threads, the load included) and the cores that rate of
work needs at the H100 goal of 8,000 items/s (docs/operations.md, "CPU cores per GPU").

The ratio printed beside items/s is the best run's against the best floor; `paired` is each run against a
floor measured right before it (this machine's speed drifts by tens of percent within minutes): the median
and the range over the repeats.

Targets: dry ≥ 0.8 of the floor, zero ≥ 0.7, pooled ≥ 0.6, jsonl ≥ 0.6; ceiling ≥ 60,000 items/s on 1,000 × 27.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import queue
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import BASE_CORPUS, machine  # noqa: E402
from score_batch.engine import EngineConfig, ScoringConfig  # noqa: E402
from score_batch.io_formats.schema import ColumnOverrides  # noqa: E402
from score_batch.job import RunConfig, run  # noqa: E402
from score_batch.machine import tune_gc, tune_malloc  # noqa: E402
from tests.tiny_models import build_model, build_tokenizer  # noqa: E402

GOAL_ITEMS_PER_SECOND = 8_000  # the H100 goal on the goal shape: the host path must keep up with it


def write_input(
    path: Path, tokenizer, items: int, per_query: int, query_tokens: int, item_tokens: int
) -> int:
    """A long-layout Parquet input of about the shape's token lengths; returns the number of distinct queries."""
    rng = random.Random(0)
    words = sorted({w for line in BASE_CORPUS for w in line.split()})
    cost = {w: len(tokenizer.encode(" " + w, add_special_tokens=False)) for w in words}

    def text(target: int) -> str:
        out, used = [], 0
        target = max(1, round(target * rng.uniform(0.85, 1.15)))
        while used < target:
            word = rng.choice(words)
            out.append(word)
            used += cost[word]
        return " ".join(out)

    queries = -(-items // per_query)
    query_texts = [text(query_tokens) for _ in range(queries)]
    columns = collections.defaultdict(list)
    for n in range(items):
        q = n // per_query
        columns["query_id"].append(f"q{q}")
        columns["query"].append(query_texts[q])
        columns["item_id"].append(f"q{q}-{n % per_query}")
        columns["item"].append(text(item_tokens))
    pq.write_table(pa.table(dict(columns)), path, row_group_size=65_536)
    return queries


def one_layer_classifier(directory: Path):
    """The tests' tokenizer and a random 1-layer Qwen3 classifier on it, in directory: (tokenizer, directory)."""
    tokenizer = build_tokenizer(directory)
    small = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)
    small.update(head_dim=32, num_hidden_layers=1, num_labels=2)
    return tokenizer, build_model(directory, "qwen3", "classifier", len(tokenizer), **small)


def floor_seconds(tokenizer, path: Path) -> float:
    """encode_batch over the items and each distinct query once (what any host path must tokenize)."""
    table = pq.read_table(path, columns=["query", "item"])
    queries = list(dict.fromkeys(table["query"].to_pylist()))
    items = table["item"].to_pylist()
    backend = tokenizer.backend_tokenizer
    start = time.perf_counter()
    backend.encode_batch(queries, add_special_tokens=True)
    backend.encode_batch(items, add_special_tokens=False)
    return time.perf_counter() - start


def bound_seconds(tokenizer, path: Path, python_us: float, window_rows: int = 2048) -> float:
    """The tokenizer's calls window by window (each window's distinct queries, then its items) beside a thread
    doing python_us µs of pure-Python work per item of each window tokenized: the best any pipeline holding that
    much Python per item reaches on this machine (bench only)."""
    table = pq.read_table(path, columns=["query", "item"])
    queries, items = table["query"].to_pylist(), table["item"].to_pylist()
    backend = tokenizer.backend_tokenizer
    done: queue.Queue = queue.Queue(maxsize=2)

    def python_work() -> None:
        while (count := done.get()) is not None:
            until = time.thread_time() + count * python_us / 1e6
            while time.thread_time() < until:
                sum(range(200))

    worker = threading.Thread(target=python_work)
    start = time.perf_counter()
    worker.start()
    for at in range(0, len(items), window_rows):
        backend.encode_batch(list(dict.fromkeys(queries[at : at + window_rows])), add_special_tokens=True)
        done.put(len(backend.encode_batch(items[at : at + window_rows], add_special_tokens=False)))
    done.put(None)
    worker.join()
    return time.perf_counter() - start


class ZeroForward:
    """The packed runner's forward replaced by zeros of the right shapes (bench only: no model time)."""

    def __init__(self) -> None:
        from score_batch.engine.run import packed_runner

        self.module = packed_runner
        self.original = packed_runner.PackedRunner._launch

    def __enter__(self):
        import torch

        launched = self.module.Launched
        made: dict[
            int, torch.Tensor
        ] = {}  # width → zeros of the most rows asked so far (read, never written)

        def zeros(rows: int, width: int) -> torch.Tensor:
            if width not in made or made[width].shape[0] < rows:
                made[width] = torch.zeros((max(rows, 4096), width))
            return made[width][:rows]  # [rows, width]

        def launch(runner, batch, cache=None):
            rows = len(batch.score_rows)
            scores = zeros(rows, runner.setup.num_scores)  # [num_items, num_scores]
            pooled = None
            if runner.planner.cfg.pooled_hidden_states:
                pooled = zeros(rows, runner.setup.info.hidden_size)  # [num_items, hidden]
            return launched.of(batch, scores, scores, pooled)

        self.module.PackedRunner._launch = launch
        return self

    def __exit__(self, *exc) -> None:
        self.module.PackedRunner._launch = self.original


class TokenizerLookup:
    """The tokenizer's batch call replaced by a lookup of encodings computed before the timing (bench only):
    the Python ceiling, what the host path does when tokenizing costs nothing."""

    def __init__(self, tokenizer, path: Path) -> None:
        from score_batch.engine.text import encode

        self.module = encode
        self.original = encode.backend_encode
        table = pq.read_table(path, columns=["query", "item"])
        queries = list(dict.fromkeys(table["query"].to_pylist()))
        items = list(dict.fromkeys(table["item"].to_pylist()))
        self.cache = {
            (True, text): encoding for text, encoding in zip(queries, self.original(tokenizer, queries, True))
        }
        self.cache.update(
            ((False, text), encoding) for text, encoding in zip(items, self.original(tokenizer, items, False))
        )

    def __enter__(self):
        cache = self.cache

        def lookup(tokenizer, texts, add_special_tokens):
            return [cache[(add_special_tokens, text)] for text in texts]

        self.module.backend_encode = lookup
        return self

    def __exit__(self, *exc) -> None:
        self.module.backend_encode = self.original


@contextlib.contextmanager
def stage_timers(totals: dict[str, float]):
    """Wrap the job's host steps with timers that add (wall seconds, the calling thread's CPU seconds) into totals
    (all threads): a step's CPU is its own work, its wall time also its waits for the GIL and the cores."""
    from score_batch.engine.plan import planner as planner_module
    from score_batch.io_formats import jsonl, readers
    from score_batch.job.checkpoint import input_digest as digest
    from score_batch.job.outputs import sinks
    from score_batch.job.preflight import contract
    from score_batch.job.runners import local, scoring

    patched = []

    def wrap(owner, name, label):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                wall, used = totals[label]
                totals[label] = (wall + time.perf_counter() - start, used + time.thread_time() - cpu)

        setattr(owner, name, timed)
        patched.append((owner, name, original))

    wrap(local, "read_windows", "read (windows; generator set-up only)")
    wrap(readers, "batch_window", "read: a Parquet batch → window")
    wrap(readers, "json_window", "read: a JSONL block → window")
    wrap(readers, "concat", "read: batches → windows (concat)")
    wrap(digest.InputDigest, "add", "input digest")
    wrap(local, "prepare", "prepare (groups, keys, copies)")
    wrap(planner_module, "encode_groups", "  of which tokenize (encode_groups)")
    wrap(planner_module.PackedPlanner, "plan", "plan (tokenize, pack, batch)")
    wrap(scoring, "score", "score (results, output columns, part)")
    wrap(jsonl.JsonlReader, "scan", "JSONL first pass (columns, types, rows)")
    wrap(contract.OutputContract, "part_table", "  of which part_table")
    for sink in ("PartsSink", "DirectorySink"):
        if hasattr(sinks, sink) and hasattr(getattr(sinks, sink), "write"):
            wrap(getattr(sinks, sink), "write", "checkpoint part write")
    try:
        yield totals
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def score(model_dir: Path, data: Path, out: Path, dry: bool, pooled: bool = False):
    """One run through the job's run loop; its report."""
    engine = EngineConfig(device="cpu", scoring=ScoringConfig(pooled_hidden_states=pooled))
    config = RunConfig(
        input=str(data),
        output=str(out),
        model_dir=model_dir,
        columns=ColumnOverrides(),
        engine=engine,
        dry_run=dry,
        quiet=True,
        overwrite=True,
    )
    return run(config)


def cli_run(model_dir: Path, data: Path, out: Path) -> tuple[float, float]:
    """A dry run as the command (its own process, --max-pack-tokens 8192): (seconds_scoring, CPU seconds)."""
    report = out.with_suffix(".json")
    command = [
        sys.executable,
        "-m",
        "score_batch.cli.main",
        str(data),
        "--dry-run",
        "--max-pack-tokens",
        "8192",
    ]
    command += ["--model", str(model_dir), "--report", str(report), "-q", "-o", str(out), "--overwrite"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, cwd=Path(__file__).resolve().parents[1])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return json.loads(report.read_text())["seconds_scoring"], cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--per-query", type=int, default=100)
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=["1000x27", "1500x40"],
        help="QUERY_TOKENSxITEM_TOKENS, each run in turn",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stages", action="store_true")
    parser.add_argument("--modes", nargs="+", default=["dry", "zero", "pooled", "ceiling", "jsonl", "cli"])
    args = parser.parse_args()
    tune_malloc(os.environ)  # this process as the CLI's: malloc and the garbage collector tuned
    tune_gc()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer, model_dir = one_layer_classifier(tmp / "model")
        small = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)
        small.update(head_dim=32, num_hidden_layers=1, num_labels=2)
        wide = dict(small, hidden_size=1024, intermediate_size=64, num_attention_heads=8, head_dim=128)
        wide_dir = build_model(tmp / "wide", "qwen3", "classifier", len(tokenizer), **wide)
        build_tokenizer(tmp / "wide")
        for shape, items in [(shape, items) for shape in args.shapes for items in args.items]:
            query_tokens, item_tokens = (int(n) for n in shape.split("x"))
            data = tmp / f"in-{shape}-{items}.parquet"
            queries = write_input(data, tokenizer, items, args.per_query, query_tokens, item_tokens)
            lookup = TokenizerLookup(tokenizer, data) if "ceiling" in args.modes else None
            jsonl = data.with_suffix(".jsonl")
            if "jsonl" in args.modes:  # the same rows as JSON lines
                rows = pq.read_table(data).to_pylist()
                jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
            best: dict[str, float] = {}
            cpu_seconds: dict[str, float] = {}
            totals: dict[str, dict[str, float]] = {}  # mode → its best run's host steps
            paired: dict[str, list[float]] = collections.defaultdict(list)  # mode → floor s / its s, per run
            for _ in range(args.repeats):
                for mode in args.modes:
                    # the floor right before each run: this machine's speed drifts within minutes
                    floor_now = floor_seconds(tokenizer, data)
                    best["floor"] = min(best.get("floor", 1e9), floor_now)
                    out = tmp / f"out-{mode}.parquet"
                    timed = collections.defaultdict(lambda: (0.0, 0.0))  # the run's host steps (--stages)
                    if mode.startswith("bound"):
                        cpu = time.process_time()
                        seconds = bound_seconds(tokenizer, data, float(mode.removeprefix("bound")))
                        cpu = time.process_time() - cpu
                    elif mode == "cli":
                        seconds, cpu = cli_run(model_dir, data, out)
                    else:
                        with contextlib.ExitStack() as stack:
                            if mode not in ("dry", "ceiling", "jsonl"):
                                stack.enter_context(ZeroForward())
                            if mode == "ceiling":
                                stack.enter_context(lookup)
                            if args.stages:
                                stack.enter_context(stage_timers(timed))
                            cpu = time.process_time()
                            seconds = score(
                                wide_dir if mode == "pooled" else model_dir,
                                jsonl if mode == "jsonl" else data,
                                out,
                                dry=mode in ("dry", "ceiling", "jsonl"),
                                pooled=mode == "pooled",
                            ).seconds_scoring
                            cpu = time.process_time() - cpu  # every thread's CPU seconds, the load included
                    paired[mode].append(floor_now / seconds)
                    if seconds < best.get(mode, 1e9):
                        best[mode], cpu_seconds[mode] = seconds, cpu
                        if timed:
                            totals[mode] = timed
            floor = items / best["floor"]
            print(
                f"\n{items:,} items, {queries:,} queries (~{query_tokens} + {args.per_query} × "
                f"~{item_tokens} tokens); best of {args.repeats}"
            )
            print(f"  floor  (encode_batch)  {floor:>10,.0f} items/s")
            for mode in args.modes:
                rate = items / best[mode]
                per_item = cpu_seconds[mode] / items
                print(
                    f"  {mode:<22} {rate:>10,.0f} items/s  {rate / floor:5.2f} of the floor   "
                    f"{per_item * 1e6:6.1f} CPU µs/item → {per_item * GOAL_ITEMS_PER_SECOND:4.1f} cores "
                    f"at {GOAL_ITEMS_PER_SECOND:,} items/s;  paired {_spread(paired[mode])}"
                )
            for mode, timed in totals.items():
                print(
                    f"  {mode} run's host steps (summed over the threads; its best run):  wall s  CPU µs/item"
                )
                for label, (seconds, cpu) in timed.items():
                    print(f"    {label:<40} {seconds:7.3f}  {cpu / items * 1e6:6.2f}")


def _spread(ratios: list[float]) -> str:
    """Run-by-run ratios to the floor measured just before each run: median (lowest–highest)."""
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


if __name__ == "__main__":
    main()
