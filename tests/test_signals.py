"""A stop at any instant (score_batch/signals.py, cli/main.py) exits 130/143, never 1: once the command's own code
runs (cli/main.run) with no traceback and, once its flags are parsed, its --report written; before, while Python
imports the package, as Python ends it. A stop inside an import is raised once the import is done. The tests
send a signal at a marker (a log line, an import), not after a sleep; a partitioned publish checks for a stop
every CHECK_ROWS files."""

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

from score_batch.io_formats.writers import CHECK_ROWS, SUCCESS, write_partitioned
from score_batch.job.report import RunReport
from score_batch.job.runners.phase import ScoredWindow, ScoringPhase
from score_batch.signals import Stopped, StopSignals
from tests.test_cli import REPO, run_cli, write_jsonl
from tests.test_phase import RecordingSink, config

OUR_CODE = re.compile(r'File "[^"]*/(?:score_batch|cli|job|engine|io_formats)/[^"]*\.py", line \d+, in (\S+)')
HANG = 300  # seconds: a run that takes longer has hung (two loaded cores take ~20 s)


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


@pytest.mark.parametrize("where", ["as-the-file-is-made", "as-acquire-returns"])
def test_a_stop_while_the_output_lock_is_taken_leaves_no_lock(tmp_path, monkeypatch, where):
    """A stop right after O_EXCL made the lock file (still empty), or as acquire returns into __enter__: the
    run's own lock file is removed, Stopped goes on, and the next run takes the lock."""
    from score_batch.io_formats.locations import Location, parse_location
    from score_batch.job.preflight.paths import OutputLock

    made, acquired = Location.create_exclusive, OutputLock.acquire

    def made_then_stopped(self, data):
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.kill(os.getpid(), signal.SIGTERM)  # lands before the record is written
        os.unlink(self.path)
        return made(self, data)

    def acquired_then_stopped(self):
        acquired(self)
        os.kill(os.getpid(), signal.SIGTERM)

    if where == "as-the-file-is-made":
        monkeypatch.setattr(Location, "create_exclusive", made_then_stopped)
    else:
        monkeypatch.setattr(OutputLock, "acquire", acquired_then_stopped)
    lock = tmp_path / "out.parquet.lock"
    with pytest.raises(Stopped), StopSignals(immediate=True), OutputLock(parse_location(str(lock))):
        pass
    assert not lock.exists()
    monkeypatch.undo()
    with OutputLock(parse_location(str(lock))):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_the_output_lock_on_another_thread_takes_no_stop_of_the_main_threads(tmp_path):
    """A stop the main thread received and handled earlier is not raised again by a lock taken on a worker."""
    import threading

    from score_batch.io_formats.locations import parse_location
    from score_batch.job.preflight.paths import OutputLock

    with pytest.raises(Stopped), StopSignals() as stops:
        os.kill(os.getpid(), signal.SIGINT)
        stops.check()
    failures = []

    def take() -> None:
        try:
            with OutputLock(parse_location(str(tmp_path / "out.parquet.lock"))):
                pass
        except BaseException as error:  # noqa: BLE001 - reported to the test's thread
            failures.append(error)

    worker = threading.Thread(target=take)
    worker.start()
    worker.join()
    assert not failures and not (tmp_path / "out.parquet.lock").exists()


def test_a_stop_inside_an_import_is_raised_once_the_import_is_done(tmp_path, monkeypatch):
    """The module's code runs whole (the signal lands in its first line), then Stopped is raised; a scope
    entered by a module's own code is not held for the import that runs it."""
    (tmp_path / "stops_while_imported.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "for _ in range(20):\n    time.sleep(0.01)  # Python runs the handler meanwhile\n"
        "DONE = True\n"
    )
    (tmp_path / "runs_when_imported.py").write_text(
        "import os, signal, time\nfrom score_batch.signals import StopSignals\nREACHED = []\n"
        "with StopSignals(immediate=True):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(5)\n    REACHED.append(True)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "stops_while_imported", raising=False)
    started = time.perf_counter()
    with pytest.raises(Stopped):
        with StopSignals(immediate=True):
            import stops_while_imported  # noqa: F401

            time.sleep(60)  # the stop is sent again once the import is done: raised here
    assert sys.modules["stops_while_imported"].DONE and time.perf_counter() - started < 30
    # In a child process: held wrongly, the stop would come back after the import, to Python's default handler.
    script = "import sys\ntry:\n    import runs_when_imported\nexcept BaseException as e:\n    print(type(e).__name__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=HANG
    )
    assert done.returncode == 0 and done.stdout.split() == ["Stopped"], (
        done
    )  # raised inside the module's scope


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


def test_a_partitioned_publish_takes_a_stop_within_check_rows_files(tmp_path):
    """3,000 partitions, a file each: check() runs before every CHECK_ROWS rows, so a stop at the third check
    leaves at most two batches' files written (a count, not a time: a loaded machine writes them slower, never
    more of them) and nothing published."""
    rows = 3000
    table = pa.table({"query_id": [f"q{n:05d}" for n in range(rows)], "score": pa.array([0.5] * rows)})
    partitioning = pa.schema([("query_id", pa.string())])
    checks: list[int] = []

    def check() -> None:
        checks.append(len(checks))
        if len(checks) == 3:  # a signal while the second batch is written
            raise Stopped(signal.SIGTERM)

    with pytest.raises(Stopped):
        write_partitioned([table], tmp_path, table.schema, partitioning, check)
    written = sum(len(files) for _, _, files in os.walk(tmp_path))
    assert len(checks) == 3 and written <= 2 * CHECK_ROWS < rows, written
    assert not (tmp_path / SUCCESS).exists()
    (whole := tmp_path / "whole").mkdir()
    published = write_partitioned([table], whole, table.schema, partitioning)
    assert len(published) == rows and (whole / SUCCESS).exists()


def many_rows(tmp_path: Path) -> Path:
    """800 rows: a run that lasts beyond its model load on any machine."""
    rows = [
        {"query": f"query {q} red shoes", "item": f" item {i} blue"} for q in range(40) for i in range(20)
    ]
    return write_jsonl(tmp_path / "in.jsonl", rows)


def command(data: Path, out: Path, report: Path, *model) -> list[str]:
    """The command line of a run of the demo model (or of `*model`'s flags) with a --report."""
    line = [sys.executable, "-m", "score_batch.cli.main", data, "-o", out, *model]
    return [str(arg) for arg in [*line, "--report", report, "--window-rows", "64"]]


def assert_stopped(process: subprocess.Popen, stderr: str, how: int, report: Path, out: Path) -> None:
    """The contract once the command's code runs and its flags are parsed: 128 + signal, no traceback, one
    line saying so, the report says stopped, no output and no lock left."""
    said = f"exit {process.returncode}\n{stderr[-3000:]}"
    assert process.returncode == 128 + how and "Traceback" not in stderr, said
    assert f"stopped by {signal.Signals(how).name}" in stderr, said
    written = json.loads(report.read_text())
    assert written["status"] == "stopped" and written["error"] == f"Stopped: {signal.Signals(how).name}", said
    assert written["seconds_total"] > 0 and written["versions"]["torch"], written
    assert not out.exists() and not Path(f"{out}.lock").exists(), said


@pytest.mark.slow
@pytest.mark.parametrize(
    "marker, how",
    [("scoring profile:", signal.SIGTERM), ("scoring profile:", signal.SIGINT), ("loaded ", signal.SIGTERM)],
    ids=["as-torch-imports-SIGTERM", "as-torch-imports-SIGINT", "after-the-load-SIGTERM"],
)
def test_a_stop_at_a_marker_exits_130_or_143_with_the_report(tmp_path, marker, how):
    """The signal is sent at a log line: the profile's (the flags are parsed, torch is about to be imported:
    the stop lands in its import and is raised after it) or the model's load (scoring starts)."""
    data, out, report = many_rows(tmp_path), tmp_path / "o.parquet", tmp_path / "r.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        command(data, out, report), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )  # fmt: skip
    lines = []
    for line in process.stderr:  # the marker, then the signal
        lines.append(line)
        if marker in line:
            process.send_signal(how)
            break
    rest = process.communicate(timeout=HANG)[1]
    assert any(marker in line for line in lines), "".join(lines)
    assert_stopped(process, "".join(lines) + rest, how, report, out)


@pytest.fixture
def busy_cores():
    """A busy loop on every core while the test runs (a loaded machine: start-up and parsing take longer)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    yield
    for loop in loops:
        loop.kill()
        loop.wait()


def _python_ended_it(code: int, stderr: str, how: int) -> bool:
    """A stop before cli/main.run ran, while Python started and imported the package: the signal's default
    action (no output; SIGINT's too before Python handles it), or SIGINT's KeyboardInterrupt traceback through
    module-level code only (no function of ours ran yet), the process ended by SIGINT; or, in the
    interpreter's own start-up (its `site` import), Python's fatal error."""
    if code == -how and stderr == "":
        return True
    frames = OUR_CODE.findall(stderr)
    if code == 1:
        return "Fatal Python error" in stderr and "KeyboardInterrupt" in stderr and not frames
    return (
        code == -how
        and stderr.rstrip().endswith("KeyboardInterrupt")
        and all(f == "<module>" for f in frames)
    )


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_at_any_instant_exits_130_or_143(qwen3_causal, tmp_path, busy_cores, how):
    """A sweep of delays from the process's start (0.05 s to 2 s in 0.05 s steps; here every fifth), wherever
    each lands: before cli/main.run, as Python ends it (_python_ended_it; exit -signal, 128 + signal in a shell;
    no report); in the interpreter's teardown after a finished run (its report says succeeded); anywhere else
    the command's contract (assert_stopped). Which happens at a delay is the machine's; each is checked."""
    data = many_rows(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    model = ["--model", qwen3_causal, "--label-tokens", " to", "--label-tokens", " the"]
    for step in range(1, 41, 5):
        delay = round(0.05 * step, 2)
        out, report = tmp_path / f"o{step}.parquet", tmp_path / f"r{step}.json"
        process = subprocess.Popen(
            command(data, out, report, *model), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        time.sleep(delay)  # any instant: no outcome depends on where it lands
        process.send_signal(how)
        _, stderr = process.communicate(timeout=HANG)
        said = f"{delay} s: exit {process.returncode}\n{stderr[-3000:]}"
        if process.returncode == -how and report.exists():  # the interpreter's own teardown, after the run
            assert "Traceback" not in stderr and json.loads(report.read_text())["status"] == "succeeded", said
        elif process.returncode != 128 + how:
            assert _python_ended_it(process.returncode, stderr, how) and not report.exists(), said
        else:
            assert_stopped(process, stderr, how, report, out)


# Run in a child process: a regression hangs the run, and its worker threads would keep pytest from exiting.
_STOPPED_RUN = """
import signal, sys
from concurrent.futures import Future
from pathlib import Path
from score_batch import job
from score_batch.engine import EngineConfig, ScoringConfig
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.runners import local
from score_batch.job.runners.prefetch import Prefetch
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
        done = subprocess.run([str(arg) for arg in command], capture_output=True, text=True, timeout=HANG)
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
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG)
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
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=HANG
    )
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "not written" not in done.stderr and json.loads(report.read_text())["status"] == "stopped"
