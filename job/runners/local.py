"""A local run: windows of input rows → engine on this machine → a sink (parts + merge, stdout, or none)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager

from score_batch.engine.plan.planner import Planner
from score_batch.io_formats.errors import InputError
from score_batch.io_formats.readers import InputSource, read_windows
from score_batch.io_formats.window import Window
from score_batch.job.checkpoint.input_digest import InputDigest
from score_batch.job.outputs.sinks import open_sink
from score_batch.job.policy import KEEP_GOING
from score_batch.job.preflight.checks import Checked, run_contract
from score_batch.job.report import RunReport
from score_batch.job.reuse import EarlierScores, ScoredPairs, reused_schema
from score_batch.job.run_config import RunConfig
from score_batch.job.runners.phase import ScoredWindow, ScoringPhase, load_engine
from score_batch.job.runners.prefetch import Prefetch
from score_batch.job.runners.scoring import Prepared, WindowTools, prepare
from score_batch.job.runners.window_runs import WindowRuns
from score_batch.job.windows import group_sizes


def run_local(config: RunConfig, checked: Checked, report: RunReport) -> None:
    """Score windows on this machine and publish (the output locked, leftovers removed), filling report."""
    sink = open_sink(config, checked.paths)
    config = config.reads_windows_of(sink.resumed_record())  # a resumed run reads its parts' windows
    checked = dataclasses.replace(checked, identity=checked.identity.laid_out(config.window_rows))
    mapping, windows = read_windows(checked.source, config.columns, config.window_rows)
    listed = sink.listed()  # windows an earlier run finished: the worker does not plan them
    ready: Future[WindowTools] = Future()
    content = InputDigest()  # the input's rows, for the completion record
    try:
        read_stage, encode_stage, plan_stage = _stages(ready, listed, content)
        with (
            Prefetch(enumerate(windows), config.pipeline) as read,
            Prefetch(read, config.pipeline) as encoding,
            Prefetch(encoding, config.pipeline) as prefetch,
            _released(ready),  # left first, before the workers are joined: none is left waiting for the tools
        ):
            # Three workers, one window ahead each: the first reads, hashes and groups a window (the first one
            # while the tokenizer and weights load) and keys it once the tokenizer (and, under --reuse, the
            # earlier scores) are there; the second tokenizes it, and the third packs it. The tokenizer's batch
            # calls release the GIL and use every core: on their own thread they run on while the windows
            # around them are packed, scored and written; the plan takes their encodings to the main thread,
            # which frees them once the window is written (not the packing thread, which goes on to the next).
            read.start(read_stage)
            encoding.start(encode_stage)
            prefetch.start(plan_stage)
            engine = load_engine(
                config,
                report,
                lambda planner, setup: ready.set_result(_tools(config, checked, planner, setup)),
            )
            _score_windows(config, checked, report, sink, engine, mapping, prefetch, content, ready)
    finally:
        if ready.done() and ready.exception() is None and ready.result().earlier is not None:
            ready.result().earlier.close()


@contextmanager
def _released(ready: Future[WindowTools]):
    """On leaving, fails a `ready` not set yet (a failed load, a stop), so no worker is left waiting for it."""
    try:
        yield
    finally:
        if not ready.done():
            ready.set_exception(RuntimeError("the engine did not load"))


def _tools_of(ready: Future[WindowTools]) -> WindowTools:
    """ready.result(), its state checked again every 0.1 s: a stop raised inside set_result on the main thread
    can leave the future finished with its waiters never notified."""
    while True:
        try:
            return ready.result(timeout=0.1)
        except FutureTimeout:
            continue


def _tools(config: RunConfig, checked: Checked, planner: Planner, setup) -> WindowTools:
    """The worker's tools once the tokenizer is there; under --reuse the earlier outputs are joined first."""
    key, contract = checked.identity.score_key(setup), run_contract(config, checked, setup)
    earlier = None
    if config.reuse:
        earlier = EarlierScores.join(config, checked.source, key, reused_schema(contract.part_schema()))
    return WindowTools(planner, contract, key, earlier, ScoredPairs())


def _stages(ready: Future[WindowTools], listed: frozenset[int], content: InputDigest) -> tuple[Callable, ...]:
    """The workers' three jobs for a numbered window: its digest, groups, keys and copied values; its texts'
    encodings; its plan."""

    def read(numbered: tuple[int, Window]) -> Prepared:
        number, window = numbered
        digest = content.add(window)
        return dataclasses.replace(prepare(number, window, _tools_of(ready)), digest=digest)

    def encode(prepared: Prepared) -> tuple[Prepared, object]:
        if prepared.number in listed:
            return prepared, None
        return prepared, _tools_of(ready).planner.encode(prepared.todo.groups)

    def plan(encoded: tuple[Prepared, object]) -> Prepared:
        prepared, texts = encoded
        if prepared.number in listed:
            return prepared
        return dataclasses.replace(prepared, plan=_tools_of(ready).planner.plan(prepared.todo.groups, texts))

    return read, encode, plan


def _score_windows(config, checked, report, sink, engine, mapping, prepared_windows, content, ready) -> None:
    """Score the prefetched windows into the sink and publish (see run_local): one behind another on the device
    and the writer thread (job/runners/window_runs; in turn under --no-pipeline)."""
    source, completion = checked.source, checked.paths.completion
    scorer, tools = engine[0], ready.result()
    sink.start(checked.identity)
    listed = sink.listed()
    total = source.total_rows() if mapping.layout == "long" else None
    windows_read = 0
    with (
        ScoringPhase(config, report, sink, total) as phase,
        WindowRuns(tools, scorer, phase, sink, source.label, config.pipeline, config.dry_run) as runs,
    ):
        for prepared in prepared_windows:
            number, window = prepared.number, prepared.window
            windows_read = number + 1
            if number in listed:
                runs.drain()  # the windows before it counted first, in order
                if sink.done(number, prepared.digest):
                    _resumed(prepared, sink, tools, phase)
                    continue
            if config.on_error == "fail" and any(error is not None for error in window.errors):
                runs.drain()  # the windows before it written, as they would be when it stops the run
                _fail_on_unreadable_row(window, source)
            runs.score(prepared)
            del prepared  # the window and its plan's encodings freed once written, not after the next arrives
            phase.check()
        runs.drain()
        sink.check_read(windows_read)
        digest = content.hexdigest()
        completed = checked.identity.completed(digest).with_failed(report.items_failed, report.items)
        report.verify = scorer.verify() if scorer is not None else None  # --verify, before the publish
        phase.commit(tools.contract, phase.check, completed)
        if completion is not None:
            completion.published(completed, config.resume)


def _resumed(prepared: Prepared, sink, tools: WindowTools, phase: ScoringPhase) -> None:
    """A window --resume found checkpointed: its part read back, its pairs remembered, its counts added."""
    window = prepared.window
    phase.advance(window.num_items)
    part = sink.scored(prepared.number)
    tools.pairs.add(part)
    sizes = group_sizes(window, prepared.grouped, tools.contract.query_ids_given)
    phase.add(ScoredWindow.resumed_part(window.num_rows, part, sizes))


def _fail_on_unreadable_row(window: Window, source: InputSource) -> None:
    """Under --on-error fail, stop at the first unreadable row before scoring anything."""
    for row, error in enumerate(window.errors):
        if error is not None:
            raise InputError(f"{source.label}: row {int(window.index[row])}: {error} {KEEP_GOING}")
