"""A stop at any instant (score_batch/signals.py, cli/main.py): exit 130/143, never a traceback, and --report once
the command line's own code runs; a partitioned publish takes a stop within seconds."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from score_batch.io_formats.writers import SUCCESS, write_partitioned
from score_batch.job.phase import ScoredWindow, ScoringPhase
from score_batch.job.report import RunReport
from score_batch.signals import Stopped, StopSignals
from tests.test_cli import REPO, run_cli, write_jsonl
from tests.test_phase import RecordingSink, config

OUR_CODE = re.compile(r'File "[^"]*/(score_batch|cli|job|engine|io_formats)/[^"]*\.py"')


def test_a_stop_passes_except_exception_and_one_python_cannot_raise_is_raised_at_the_next_check(capsys):
    import weakref

    with pytest.raises(Stopped):
        with StopSignals(immediate=True):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            except Exception:  # noqa: BLE001 - as a library's guarded import
                pass

    class Thing:
        pass

    with StopSignals(immediate=True) as outer:
        thing = Thing()
        reference = weakref.ref(thing, lambda _: os.kill(os.getpid(), signal.SIGINT))
        del thing  # the callback runs, the handler raises inside it, and Python can only report that
        assert reference() is None and "Stopped" not in capsys.readouterr().err
        with pytest.raises(Stopped):
            with StopSignals() as inner:  # a deferred scope inside knows it too
                inner.check()
        with pytest.raises(Stopped):
            outer.check()
    with StopSignals() as fresh:  # the next run starts afresh
        fresh.check()


def test_a_signal_after_the_last_safe_point_still_stops_the_run_after_its_publish():
    report, sink = RunReport(), RecordingSink()
    with pytest.raises(Stopped):
        with ScoringPhase(config(), report, sink) as phase:
            phase.add(ScoredWindow(1, 1, 0, scores=[0.5]))
            phase.commit()
            os.kill(os.getpid(), signal.SIGTERM)  # during the publish, after its last check
    assert sink.calls[0][0] == "commit" and report.seconds_scoring is not None


def test_a_stop_while_the_flags_are_parsed_writes_the_report(tmp_path, monkeypatch):
    from score_batch.cli.command import ReportingCommand

    def parse_then_stop(self, ctx, args):
        raise Stopped(signal.SIGTERM)  # as the handler raises it mid-parse

    monkeypatch.setattr(ReportingCommand, "parse_args", parse_then_stop)
    # Before its flags are read the command has set up no logging: no handler of an earlier in-process run.
    monkeypatch.setattr(logging.getLogger("score_batch"), "handlers", [])
    report = tmp_path / "r.json"
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": "i"}])
    result = run_cli(data, "-o", tmp_path / "o.parquet", "--report", report)
    assert result.returncode == 143 and "Traceback" not in result.stderr
    written = json.loads(report.read_text())
    assert written["status"] == "stopped" and written["error"] == "Stopped: SIGTERM"


def test_a_partitioned_publish_takes_a_stop_within_seconds(tmp_path):
    """3,000 partitions: the writing checks for a stop every CHECK_ROWS rows, nothing is left published."""
    rows = 3000
    table = pa.table({"query_id": [f"q{n:05d}" for n in range(rows)], "score": pa.array([0.5] * rows)})
    partitioning = pa.schema([("query_id", pa.string())])
    stop_at: list[float] = []

    def check() -> None:
        if not stop_at:
            stop_at.append(time.perf_counter() + 0.3)  # a signal 0.3 s into the publish
        elif time.perf_counter() >= stop_at[0]:
            raise Stopped(signal.SIGTERM)

    started = time.perf_counter()
    with pytest.raises(Stopped):
        write_partitioned([table], tmp_path, table.schema, partitioning, check)
    assert time.perf_counter() - stop_at[0] < 4.0, time.perf_counter() - started  # 512 files at most
    assert not (tmp_path / SUCCESS).exists()
    (whole := tmp_path / "whole").mkdir()
    published = write_partitioned([table], whole, table.schema, partitioning)
    assert len(published) == rows and (whole / SUCCESS).exists()


@pytest.fixture
def busy_cores():
    """A busy loop on every core while the test runs (a loaded machine: start-up and parsing take longer)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    yield
    for loop in loops:
        loop.kill()
        loop.wait()


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_at_any_delay_exits_130_or_143_without_a_traceback(qwen3_causal, tmp_path, busy_cores, how):
    """The documented sweep runs 0.05 s to 2 s in 0.05 s steps; here every fifth delay.

    Before the interpreter runs any score-batch code (its own start-up, up to ~0.15 s on two loaded cores)
    the signal acts as Python makes it: SIGTERM ends the process (143 in a shell), SIGINT raises Python's
    KeyboardInterrupt there; likewise in the interpreter's teardown after a finished run (its report says
    succeeded). Everywhere else: exit 128 + signal, one line, and the report says stopped."""
    rows = [
        {"query": f"query {q} red shoes", "item": f" item {i} blue"} for q in range(40) for i in range(20)
    ]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for step in range(1, 41, 5):
        delay = round(0.05 * step, 2)
        out, report = tmp_path / f"o{step}.parquet", tmp_path / f"r{step}.json"
        command = [sys.executable, "-m", "score_batch.cli.main", data, "-o", out, "--model", qwen3_causal]
        command += [
            "--label-tokens",
            " to",
            "--label-tokens",
            " the",
            "--report",
            report,
            "--window-rows",
            "64",
        ]
        process = subprocess.Popen(
            [str(arg) for arg in command], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )  # fmt: skip
        time.sleep(delay)
        process.send_signal(how)
        _, stderr = process.communicate(timeout=120)
        said = f"{delay} s: exit {process.returncode}\n{stderr}"
        if process.returncode == -how and report.exists():  # the interpreter's own teardown, after the run
            assert "Traceback" not in stderr and json.loads(report.read_text())["status"] == "succeeded", said
            continue
        if process.returncode == -how or OUR_CODE.search(stderr) is None and "KeyboardInterrupt" in stderr:
            assert OUR_CODE.search(stderr) is None and not report.exists(), said  # Python's start-up
            continue
        assert process.returncode == 128 + how and "Traceback" not in stderr, said
        assert json.loads(report.read_text())["status"] == "stopped", said
        assert not Path(f"{out}.lock").exists(), said  # (a stop during the publish may come after it)


# Run in a child process: a regression hangs the run, and its worker threads would keep pytest from exiting.
_STOPPED_RUN = """
import signal, sys
from concurrent.futures import Future
from pathlib import Path
from score_batch import job
from score_batch.engine import EngineConfig, ScoringConfig
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job import local
from score_batch.job.prefetch import Prefetch
from score_batch.job.run_config import RunConfig
from score_batch.signals import Stopped

if sys.argv[1] == "set_result":
    class FinishedUnnotified(Future):  # the tools' future as a signal can leave it: finished, waiters not woken
        def set_result(self, result):
            with self._condition:
                self._result, self._state = result, "FINISHED"
            raise Stopped(signal.SIGTERM)

    local.Future = FinishedUnnotified  # only run_local's own future
else:
    started = Prefetch.start

    def stop_at_the_second(self, prepare):
        if prepare.__name__ == "plan":
            raise Stopped(signal.SIGTERM)
        started(self, prepare)

    Prefetch.start = stop_at_the_second
engine = EngineConfig(backend="sdpa", scoring=ScoringConfig(label_tokens=(" to", " the")))
config = RunConfig(sys.argv[2], sys.argv[3], Path(sys.argv[4]), ColumnOverrides(), engine, quiet=True)
try:
    job.run(config)
except Stopped:
    print("stopped")
"""


@pytest.mark.parametrize("at", ["second-worker-start", "set_result"])
def test_a_stop_before_the_tools_are_made_never_leaves_a_worker_waiting(qwen3_causal, tmp_path, at):
    """The read worker waits for the tools (tokenizer, keys) the load makes. A stop landing after it started but
    before the load's guard (the second worker's start), or inside Future.set_result after the future is
    finished but before its waiters are woken, left it waiting and the run hung at the join forever."""
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": " a"}, {"query": "q", "item": " b"}])
    command = [sys.executable, "-c", _STOPPED_RUN, at, data, tmp_path / "o.parquet", qwen3_causal]
    try:
        done = subprocess.run([str(arg) for arg in command], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung waiting for a worker")
    assert done.returncode == 0 and done.stdout.split() == ["stopped"], done.stderr[-2000:]


def test_a_stop_while_torch_imports_waits_for_the_import(qwen3_causal, tmp_path):
    """A handler raising inside torch's C++ start-up aborted the process (SIGABRT, no report): a run imports
    torch with the stop deferred, then stops. Here the signal lands as torch starts importing."""
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": " a"}])
    script = f"""
import importlib.abc, os, signal, sys
from pathlib import Path
class SignalAtTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch.functional":  # well inside torch's own start-up
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
        return None
sys.meta_path.insert(0, SignalAtTorch())
from score_batch import job
from score_batch.engine import EngineConfig, ScoringConfig
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.run_config import RunConfig
from score_batch.signals import Stopped
engine = EngineConfig(backend="sdpa", scoring=ScoringConfig(label_tokens=(" to", " the")))
config = RunConfig({str(data)!r}, {str(tmp_path / "o.parquet")!r}, Path({str(qwen3_causal)!r}), ColumnOverrides(),
                   engine, quiet=True)
try:
    job.run(config)
except Stopped:
    print("stopped", "torch.nn" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["stopped", "True"], done.stderr[-2000:]


def test_a_stop_while_numpy_first_imports_still_writes_the_report(tmp_path):
    """The command imports score_batch.job with the stop deferred before anything else imports it (the options'
    resolution imports job.run_config, and numpy through pyarrow): a stop raised inside numpy's import left it
    unimportable ("cannot load module more than once per process"), so the --report that the job package writes
    was "not written". Here the signal lands inside numpy's import."""
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "q", "item": " a"}])
    report = tmp_path / "r.json"
    script = f"""
import importlib.abc, os, signal, sys
class SignalInNumpy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy.dtypes":  # inside the C core's start-up: it then cannot load again
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
        return None
sys.meta_path.insert(0, SignalInNumpy())
sys.argv = ["score-batch", {str(data)!r}, "-o", {str(tmp_path / "o.jsonl")!r}, "--report", {str(report)!r}]
from score_batch.cli.main import run
run()
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "not written" not in done.stderr and json.loads(report.read_text())["status"] == "stopped"
