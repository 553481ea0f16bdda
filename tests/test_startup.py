"""Start-up: --version, --help and `models` import none of the heavy libraries a run needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "pyarrow", "boto3", "botocore", "fsspec", "ray", "numpy", "safetensors")


def imported_modules(*args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """The top-level modules a fresh `python -X importtime -m score_batch.cli.main ARGS` imports, and the run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "score_batch.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "100"},
        timeout=120,
    )
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return names, done


@pytest.mark.parametrize(
    "args",
    [("--version",), ("--help",), ("score", "--help"), ("run-batch", "--help")],
    ids=lambda args: " ".join(args),
)
def test_version_and_help_import_no_heavy_library(args):
    names, done = imported_modules(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "typer" in names  # the import log was read
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
    assert ("score-batch" in done.stdout) if args == ("--version",) else ("Usage" in done.stdout)


def test_a_bad_flag_value_is_refused_without_heavy_imports():
    names, done = imported_modules("in.jsonl", "--packing", "pairs")
    assert done.returncode == 2 and "pairs" in done.stderr
    assert not names & {"torch", "transformers"}


def test_models_imports_no_torch():
    names, done = imported_modules("models")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Supported models" in done.stdout
    assert not names & {"torch", "transformers", "pyarrow"}, sorted(names & set(HEAVY))


def test_a_native_demo_run_imports_no_transformers_pandas_pydantic_or_other_commands(tmp_path):
    """The demo's Qwen3 runs on the native layers: config and tokenizer from their JSON files (no
    transformers), pyarrow without pandas, the options' values coerced without pydantic (cli/command.py's
    plain_value), and the batch-file command's module never loaded."""
    one = tmp_path / "one.jsonl"
    one.write_text((REPO / "sample_data/products.jsonl").read_text().splitlines()[0] + "\n")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "score_batch.cli.main", str(one), "-o", "-", "--quiet"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"score": ' in done.stdout
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "torch" in modules and "tokenizers" in modules  # the import log was read
    # pandas' refused attempts (score_batch/machine.py) are logged too: a real import loads its submodules
    heavy = {m for m in modules if m.split(".")[0] in ("transformers", "pydantic") or m.startswith("pandas.")}
    assert not heavy, sorted(heavy)[:5]
    assert "score_batch.job.batch_file_run" not in modules


def _fresh(code: str) -> str:
    """stdout of a fresh Python running code (the checkout importable)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.parametrize("imported_first", [False, True])
def test_transformers_is_quiet_whether_imported_before_or_after(imported_first):
    """quiet_libraries no longer imports transformers: a later import reads the settings it left."""
    before = "import transformers; " if imported_first else ""
    code = (
        f"{before}import sys; from score_batch.cli.logs import quiet_libraries; quiet_libraries(); "
        "print('transformers' in sys.modules); import transformers, logging; "
        "from transformers.utils import logging as hf; from huggingface_hub.utils import are_progress_bars_disabled; "
        "print(hf.get_verbosity() == logging.ERROR, hf.is_progress_bar_enabled(), are_progress_bars_disabled())"
    )
    assert _fresh(code).splitlines() == [str(imported_first), "True False True"]


def test_pyarrow_without_pandas_until_pandas_is_asked_for():
    code = (
        "import sys, numpy as np, pyarrow as pa; from score_batch.machine import pyarrow_without_pandas; "
        "pyarrow_without_pandas(); a = pa.array(np.arange(3.0), mask=np.array([True, False, False])); "
        "b = pa.array([1, None]); print(a.to_pylist(), b.to_pylist(), 'pandas' in sys.modules); "
        "frame = pa.table({'x': a}).to_pandas(); print(type(frame).__name__, pa.array(frame['x']).null_count)"
    )
    assert _fresh(code).splitlines() == ["[None, 1.0, 2.0] [1, None] False", "DataFrame 1"]


HELP_RENDERERS_LEFT_OUT = {"rich.markdown", "rich.traceback", "markdown_it", "pygments"}


@pytest.mark.parametrize("args", [("--help",), ("score", "--help")], ids=" ".join)
def test_help_is_typers_without_importing_markdown_or_traceback(args):
    """--help imports typer.rich_utils without rich.markdown and rich.traceback (cli/help.typer_rich_utils),
    and prints what Typer prints with them imported."""
    run = f"sys.argv = {['score-batch', *args]!r}; from score_batch.cli.main import run; run()"
    done, typers = (
        subprocess.run(
            [sys.executable, *flags, "-c", f"import sys{imported}; {run}"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "100", "FORCE_COLOR": "1"},
            timeout=120,
        )
        for flags, imported in ((("-X", "importtime"), ""), ((), ", rich.markdown, rich.traceback"))
    )
    assert done.returncode == typers.returncode == 0, done.stderr[-2000:] + typers.stderr[-2000:]
    modules = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "typer.rich_utils" in modules and not modules & HELP_RENDERERS_LEFT_OUT
    assert "\x1b[" in done.stdout and done.stdout == typers.stdout


def test_the_deferred_rich_classes_are_the_real_ones_when_used():
    code = (
        "import sys; from score_batch.cli.help import rich_utils; "
        "print(sorted(m for m in ('rich.markdown', 'rich.traceback') if m in sys.modules)); "
        "import rich.markdown, rich.traceback; "
        "md = rich_utils.Markdown('*x*'); tb = rich_utils.get_traceback(ValueError('x'), "
        "rich_utils.DeveloperExceptionConfig(), []); "
        "print(type(md) is rich.markdown.Markdown, type(tb) is rich.traceback.Traceback)"
    )
    assert _fresh(code).splitlines() == ["[]", "True True"]
