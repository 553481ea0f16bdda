"""The CLI's overlap on a simulated device: the packed runner's forward replaced (bench only) by a stand-in device
that takes a modelled time per token on a thread of its own (time.sleep: the GIL released), as a GPU's queue
does, so a 2-core machine shows whether the host keeps the device busy.

    python bench/pipeline_sim.py [--scale 10] [--repeats 3] [--queries 64] [--window-rows 2048]

The goal shape: 1,500-token queries with 100 items of 40 tokens (one ~5,601-token pack per query), 64 queries,
Parquet in and out, pooled vectors off and on (a 1,024-wide model). The device takes 16.6 ms per 5,601 tokens
(the H200's forward at the goal shape) times --scale, each batch after the one before it; a launch returns at
once and reading a batch's outputs waits for it. Printed per run: the CLI's items/s (score_batch.job.run in
this process: items / seconds_scoring, the publish included) against the stand-in's forward alone on the same
plan (the batches the run launched, replayed back to back), for this code ("overlap") and with the windows
scored in turn ("in turn": job/runners/window_runs without overlap, the prefetch workers still on, as before
the overlap); the ratio's median and range over the repeats, with the load average beside them. Target:
overlap ≥ 0.95.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import machine  # noqa: E402
from bench.host_path import one_layer_classifier, write_input  # noqa: E402
from score_batch.engine import EngineConfig, ScoringConfig  # noqa: E402
from score_batch.engine.run import packed_runner  # noqa: E402
from score_batch.io_formats.schema import ColumnOverrides  # noqa: E402
from score_batch.job import RunConfig, run  # noqa: E402
from score_batch.job.runners import local  # noqa: E402
from score_batch.job.runners.phase import ScoringPhase  # noqa: E402
from score_batch.machine import tune_gc, tune_malloc  # noqa: E402
from tests.tiny_models import build_model, build_tokenizer  # noqa: E402

SECONDS_PER_TOKEN = 16.6e-3 / 5601  # the H200's forward at the goal shape


class SimDevice:
    """One stream: batches run one after another on a thread, each sleeping its tokens' modelled time."""

    def __init__(self, seconds_per_token: float) -> None:
        self.per_token = seconds_per_token
        self.tokens: list[int] = []  # every batch launched, for the forward-alone replay
        self.ran: list[tuple[float, float]] = []  # (start, end) perf_counter seconds of every batch run
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            tokens, done = self._queue.get()
            start = time.perf_counter()
            time.sleep(tokens * self.per_token)
            self.ran.append((start, time.perf_counter()))
            done.set()

    def launch(self, tokens: int) -> threading.Event:
        """Queue a batch of this many tokens; its event is set once it has run."""
        done = threading.Event()
        self._queue.put((tokens, done))
        return done

    def idle(self, start: float, end: float) -> tuple[float, float, int, float]:
        """Where the device waited in a run's scoring phase (start to end): before its first batch, between
        batches (and how many gaps over 5 ms), after its last."""
        ran = self.ran
        gaps = [b[0] - a[1] for a, b in zip(ran, ran[1:])]
        return ran[0][0] - start, sum(gaps), sum(gap > 5e-3 for gap in gaps), end - ran[-1][1]

    def replay(self, tokens: list[int]) -> float:
        """The forward alone: these batches queued back to back; seconds until the last has run."""
        start = time.perf_counter()
        events = [self.launch(n) for n in tokens]
        events[-1].wait()
        assert all(event.is_set() for event in events)
        return time.perf_counter() - start


class SimLaunched:
    """A batch on the simulated device: read() waits for it, then gives zero outputs of the right shapes."""

    def __init__(self, batch, done: threading.Event, outputs: tuple) -> None:
        self.batch, self._done, self._outputs = batch, done, outputs

    def read(self):
        self._done.wait()
        return self._outputs


@contextlib.contextmanager
def simulated(device: SimDevice):
    """PackedRunner._launch replaced by a launch on the simulated device (bench only)."""
    original = packed_runner.PackedRunner._launch
    made: dict[tuple[int, int], np.ndarray] = {}

    def zeros(rows: int, width: int) -> np.ndarray:
        if (rows, width) not in made:
            made[(rows, width)] = np.zeros((rows, width), np.float32)
        return made[(rows, width)]  # [rows, width], read only

    def launch(runner, batch, cache=None):
        rows, tokens = len(batch.score_rows), len(batch.token_ids)
        device.tokens.append(tokens)
        scores = zeros(rows, runner.setup.num_scores)  # [num_items, num_scores]
        pooled = (
            zeros(rows, runner.setup.info.hidden_size) if runner.planner.cfg.pooled_hidden_states else None
        )
        return SimLaunched(batch, device.launch(tokens), (scores, scores, pooled))

    packed_runner.PackedRunner._launch = launch
    try:
        yield
    finally:
        packed_runner.PackedRunner._launch = original


@contextlib.contextmanager
def phase_start(times: dict[str, float]):
    """The scoring phase's start as perf_counter seconds (bench only): its seconds_scoring end there after."""
    enter = ScoringPhase.__enter__

    def entered(phase):
        times["start"] = time.perf_counter()
        return enter(phase)

    ScoringPhase.__enter__ = entered
    try:
        yield
    finally:
        ScoringPhase.__enter__ = enter


@contextlib.contextmanager
def in_turn():
    """job/runners/window_runs without overlap (each window scored and written before the next; bench only)."""
    original = local.WindowRuns

    class InTurn(original):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args[:5], overlap=False, dry_run=args[6])

    local.WindowRuns = InTurn
    try:
        yield
    finally:
        local.WindowRuns = original


def cli_seconds(model_dir: Path, data: Path, out: Path, pooled: bool, window_rows: int) -> tuple[float, int]:
    """One run through the job's run loop: (seconds_scoring, items)."""
    engine = EngineConfig(device="cpu", scoring=ScoringConfig(pooled_hidden_states=pooled))
    config = RunConfig(
        input=str(data), output=str(out), model_dir=model_dir, columns=ColumnOverrides(), engine=engine,
        quiet=True, overwrite=True, window_rows=window_rows,
    )  # fmt: skip
    report = run(config)
    return report.seconds_scoring, report.items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=10.0, help="the device's time per token × this")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--window-rows", type=int, default=2048)
    parser.add_argument("--modes", nargs="+", default=["overlap", "in-turn"])
    parser.add_argument("--pooled", nargs="+", default=["off", "on"])
    args = parser.parse_args()
    tune_malloc(os.environ)  # this process as the CLI's (malloc and GC)
    tune_gc()
    print(machine(), f"; device {SECONDS_PER_TOKEN * 5601 * 1e3:.1f} ms per 5,601 tokens × {args.scale:g}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer, model_dir = one_layer_classifier(tmp / "model")
        small = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)
        wide = dict(
            small, head_dim=128, num_hidden_layers=1, num_labels=2, hidden_size=1024, num_attention_heads=8
        )
        wide_dir = build_model(tmp / "wide", "qwen3", "classifier", len(tokenizer), **wide)
        build_tokenizer(tmp / "wide")
        data = tmp / "in.parquet"
        write_input(data, tokenizer, 100 * args.queries, 100, 1500, 40)
        for pooled in args.pooled:
            ratios: dict[str, list[float]] = {mode: [] for mode in args.modes}
            rates: dict[str, list[float]] = {mode: [] for mode in args.modes}
            for _ in range(args.repeats):
                for mode in args.modes:
                    device = SimDevice(SECONDS_PER_TOKEN * args.scale)
                    times: dict[str, float] = {}
                    turn = in_turn() if mode == "in-turn" else contextlib.nullcontext()
                    with simulated(device), phase_start(times), turn:
                        seconds, items = cli_seconds(
                            wide_dir if pooled == "on" else model_dir, data, tmp / "out.parquet",
                            pooled == "on", args.window_rows,
                        )  # fmt: skip
                    head, between, gaps, tail = device.idle(times["start"], times["start"] + seconds)
                    alone = device.replay(device.tokens)
                    ratios[mode].append(alone / seconds)
                    rates[mode].append(items / seconds)
                    print(
                        f"  pooled {pooled:<3} {mode:<8} CLI {items / seconds:8,.0f} items/s, forward alone "
                        f"{items / alone:8,.0f} items/s: {alone / seconds:.3f} (load {os.getloadavg()[0]:.2f}); the "
                        f"device waited {head:.2f} s for the first window, {between:.2f} s between batches "
                        f"({gaps} gaps over 5 ms), {tail:.2f} s after the last; without the first wait "
                        f"{alone / (seconds - head):.3f}"
                    )
            for mode in args.modes:
                spread = f"{min(ratios[mode]):.3f}–{max(ratios[mode]):.3f}"
                print(
                    f"pooled {pooled}, {mode}: CLI / forward alone {statistics.median(ratios[mode]):.3f} "
                    f"(median of {args.repeats}, range {spread}); CLI {statistics.median(rates[mode]):,.0f} items/s"
                )


if __name__ == "__main__":
    main()
